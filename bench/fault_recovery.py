"""Fault recovery: how long the service takes to work again after each fault.

Runs the API (uvicorn, in this process) and one `corel worker` on a PostgreSQL cluster
and a Redis server of its own (harness/servers.py: never the machine's shared ones),
injects each fault while a run trains, and prints the time from the fault's end to the
first successful request and to the run's next epoch (for a lost queue: to the queued
run's first epoch). Medians over ``--repeats``. Run from the repository's root:
``.venv/bin/python bench/fault_recovery.py``.

Settings are the fault tests' short ones (lease 4 s, re-send after 2 s, retry pauses up
to 1 s); with the defaults (120 s, 120 s, 10 s) the waits scale with them.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import uvicorn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.migrate import upgrade  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from harness.servers import PrivatePostgres, PrivateRedis, free_port  # noqa: E402
from harness.stack import Stack  # noqa: E402
from harness.wait import wait_until  # noqa: E402

RUN = {"dataset": "digits", "epochs": 200, "batch_size": 16, "lr": 1e-3, "loss": "gaussian",
       "lam": 0.8}


class Service:
    def __init__(self, pg: PrivatePostgres, rd: PrivateRedis, root: Path) -> None:
        self.settings = Settings(
            database_url=pg.url(), broker_url=rd.url, var_dir=root / "var",
            queue=f"corel-bench-{uuid.uuid4().hex[:8]}", lease_seconds=4.0,
            heartbeat_seconds=0.5, requeue_after_seconds=2.0, requeue_max_seconds=8.0,
            retry_max_pause=1.0, transient_retry_seconds=300.0, log_level="WARNING")
        upgrade(self.settings)
        port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(create_app(self.settings), host="127.0.0.1",
                                                    port=port, log_config=None))
        threading.Thread(target=self.server.run, daemon=True).start()
        wait_until(lambda: self.server.started, 60, "uvicorn to start", interval=0.05)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        self.root = root
        # The worker: harness's stack on these settings (the API runs in this process).
        self.stack = Stack.on(self.settings, root)
        self.worker: subprocess.Popen[bytes] | None = None

    def start_worker(self) -> None:
        self.worker = self.stack.start_worker(ready_timeout=None)

    def stop_worker(self) -> None:
        self.stack.stop(self.worker, grace=60)

    def submit(self, seed: int) -> int:
        r = self.http.post("/experiments", json={**RUN, "seed": seed})
        assert r.status_code == 202, r.text
        return int(r.json()["id"])

    def epoch(self, eid: int) -> int | None:
        try:
            r = self.http.get(f"/experiments/{eid}")
        except httpx.HTTPError:
            return None
        return int(r.json()["current_epoch"]) if r.status_code == 200 else None

    def cancel(self, eid: int) -> None:
        self.http.post(f"/experiments/{eid}/cancel")

    def wait_epoch(self, eid: int, above: int, timeout: float = 120) -> float:
        """When the experiment passed epoch ``above`` (time.monotonic())."""
        wait_until(lambda: (self.epoch(eid) or 0) > above, timeout,
                   f"experiment {eid} to pass epoch {above}", interval=0.02)
        return time.monotonic()


def first_ok(request: Callable[[], bool], timeout: float = 120) -> float:
    """When ``request`` first succeeded (time.monotonic())."""
    wait_until(request, timeout, "a successful request", interval=0.02, ignore=(httpx.HTTPError,))
    return time.monotonic()


def measure(service: Service, pg: PrivatePostgres, rd: PrivateRedis, fault: str,
            seed: int) -> tuple[float, float]:
    """(seconds to the first successful request, seconds to the run's next epoch)."""
    ok = lambda: service.http.get("/experiments").status_code == 200  # noqa: E731
    if fault == "lost queue":
        service.stop_worker()
        eid = service.submit(seed)
        rd.flush()
        service.start_worker()
        end = time.monotonic()
        t_ok = first_ok(ok)
        t_epoch = service.wait_epoch(eid, 0)
        service.cancel(eid)
        return t_ok - end, t_epoch - end
    eid = service.submit(seed)
    service.wait_epoch(eid, 1)
    if fault == "database stopped 5 s":
        pg.stop()
        time.sleep(5)
        pg.start()
    elif fault == "database frozen 5 s":
        pg.freeze()
        time.sleep(5)
        pg.thaw()
    elif fault == "connections cut":
        stop = time.monotonic() + 1
        while time.monotonic() < stop:
            pg.terminate_clients()
            time.sleep(0.05)
    elif fault == "broker stopped 5 s":
        rd.stop()
        time.sleep(5)
        rd.start()
        ok = lambda: service.http.post(  # noqa: E731
            "/experiments", json={**RUN, "epochs": 1, "seed": 99}).status_code == 202
    end = time.monotonic()
    at_end = service.epoch(eid) or 0
    t_ok = first_ok(ok)
    t_epoch = service.wait_epoch(eid, at_end)
    service.cancel(eid)
    return t_ok - end, t_epoch - end


FAULTS = ["database stopped 5 s", "database frozen 5 s", "connections cut",
          "broker stopped 5 s", "lost queue"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="two of the faults (the quickest) once each: that the benchmark runs")
    args = parser.parse_args(argv)
    faults = ["connections cut", "lost queue"] if args.smoke else FAULTS
    if args.smoke:
        args.repeats = 1
    pg, rd = PrivatePostgres(), PrivateRedis()
    root = Path(tempfile.mkdtemp(prefix="corel-bench-faults-"))
    service = Service(pg, rd, root)
    service.start_worker()
    try:
        print(f"{'fault':24s} {'first ok request':>18s} {'next epoch':>12s}   (median of "
              f"{args.repeats}; seconds after the fault ended)")
        for fault in faults:
            runs = [measure(service, pg, rd, fault, seed) for seed in range(args.repeats)]
            req = statistics.median(r[0] for r in runs)
            epoch = statistics.median(r[1] for r in runs)
            print(f"{fault:24s} {req:18.2f} {epoch:12.2f}   "
                  f"(runs: {', '.join(f'{a:.2f}/{b:.2f}' for a, b in runs)})", flush=True)
    finally:
        service.stop_worker()
        service.server.should_exit = True
        pg.close()
        rd.close()


if __name__ == "__main__":
    main()
