"""A worker's epoch alone on its host, beside another CPU-bound process of two threads,
and beside a second worker: the Fashion-MNIST run of docs/service.md's session (FFNN, Gaussian-COREL, lam
0.85), the seconds of each epoch but the first (medians), and the ratio to the epoch
alone (target: at most 2.5 beside the other process).

Each worker is a process of its own that takes its threads as `corel worker` does
(worker/host_share.py: its presence written to a database every 3 s, its share of the
host's CPUs applied by the training thread after every batch), on a SQLite registry of
this run's own, and in the environment `corel worker` gives it (OpenMP's threads sleep
while they wait); ``--threads N`` sets them as COREL_WORKER_TORCH_THREADS=N would.
``--previous`` runs the previous default beside it, in the same repeats: torch's own
threads (one per core in every worker) and OpenMP's own wait policy (spinning).

    python bench/host_contention.py --previous
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "lam": 0.85}

HOG = """
import sys, time, torch
torch.set_num_threads(2)
a = torch.randn(512, 512)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    a @ a
"""


def worker_main(registry: str, threads: int, epochs: int, ready: str, go: str, subset: int) -> None:
    """One worker: announce itself, wait for the others to have (``go`` appears), train,
    print each epoch's seconds and the threads it trained with."""
    import threading

    from sqlalchemy import create_engine
    from sqlalchemy.orm import sessionmaker

    from app.core.settings import Settings
    from corel.train import Callback, fit
    from worker import host_share

    factory = sessionmaker(create_engine(registry))  # its table made by scenario(), before any worker
    settings = Settings(database_url=registry, worker_torch_threads=threads)
    host_share.refresh(factory, settings)
    stop = threading.Event()
    threading.Thread(target=host_share.keep_current, args=(factory, settings, stop), daemon=True).start()
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.05)
    host_share.refresh(factory, settings)  # as the share thread would within 3 s
    host_share.apply()
    used: list[int] = []

    class AsTheWorker(Callback):
        def on_batch_end(self, step: int) -> bool:
            host_share.apply()
            return False

        def on_epoch_end(self, metrics, run) -> bool:  # type: ignore[no-untyped-def]
            import torch

            used.append(torch.get_num_threads())
            return False

    result = fit({**SPEC, "epochs": epochs, "train_subset": subset or None}, [AsTheWorker()],
                 data_dir=os.environ.get("COREL_DATA_DIR"))
    stop.set()
    print(json.dumps({"seconds": [m.seconds for m in result.history], "threads": used}), flush=True)


def scenario(workers: int, hog: bool, threads: int, epochs: int, tmp: Path,
             previous: bool = False, subset: int = 0) -> list[dict]:
    registry = f"sqlite:///{tmp / f'registry-{time.monotonic_ns()}.sqlite3'}"
    go = tmp / f"go-{time.monotonic_ns()}"
    readies = [tmp / f"ready-{time.monotonic_ns()}-{i}" for i in range(workers)]
    from sqlalchemy import create_engine

    from app.core.models import WorkerPresence
    from app.jobs.workers import worker_environ

    # The presence table is made here, once: two workers making it at the same moment on one
    # SQLite file race ("table worker_presence already exists"), and the loser exits.
    engine = create_engine(registry)
    WorkerPresence.__table__.create(engine)
    engine.dispose()

    env = {**worker_environ(os.environ), "PYTHONPATH": str(REPO)}
    if previous:  # torch's own OpenMP wait policy, as workers had it before
        env = {**os.environ, "PYTHONPATH": str(REPO)}
    hogger = subprocess.Popen([sys.executable, "-c", HOG, "600"]) if hog else None
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", registry, str(threads), str(epochs),
                               str(ready), str(go), str(subset)], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
             for ready in readies]
    try:
        while not all(r.exists() for r in readies):
            assert all(p.poll() is None for p in procs), "a worker exited before training"
            time.sleep(0.05)
        go.touch()
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    finally:
        for p in procs:  # a worker left waiting for `go` would hold our stdout open after we fail
            if p.poll() is None:
                p.kill()
                p.wait()
        if hogger is not None:
            hogger.kill()
            hogger.wait()
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def median_epoch(report: dict) -> float:
    return statistics.median(report["seconds"][1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker_main(argv[1], int(argv[2]), int(argv[3]), argv[4], argv[5], int(argv[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=0,
                        help="COREL_WORKER_TORCH_THREADS of each worker (0: the product's default)")
    parser.add_argument("--previous", action="store_true",
                        help="also the previous default: a thread per core, OpenMP spinning")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    subset = 1024 if args.smoke else 0  # rows of the training set (0: all of them)
    if args.smoke:
        args.epochs, args.repeats = 2, 1
    cpus = len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs; {args.epochs} epochs a run, the median of epochs 2-{args.epochs}, "
          f"then the median over {args.repeats} repeats", flush=True)
    builds = {"corel": (args.threads, False)}
    if args.previous:
        builds["previous"] = (cpus, True)
    figures: dict[str, dict[str, list[float]]] = {b: {"alone": [], "hog": [], "pair": []} for b in builds}
    with tempfile.TemporaryDirectory(prefix="corel-contention-") as tmp:
        for _ in range(args.repeats):  # alternated, so that a drift of the machine hits each
            for build, (threads, previous) in builds.items():
                [a] = scenario(1, False, threads, args.epochs, Path(tmp), previous, subset)
                [b] = scenario(1, True, threads, args.epochs, Path(tmp), previous, subset)
                pair = scenario(2, False, threads, args.epochs, Path(tmp), previous, subset)
                got = figures[build]
                got["alone"].append(median_epoch(a))
                got["hog"].append(median_epoch(b))
                got["pair"].append(statistics.median(median_epoch(r) for r in pair))
                print(f"  {build}: alone {got['alone'][-1]:.3f} s ({a['threads'][-1]} threads), "
                      f"beside a 2-thread process {got['hog'][-1]:.3f} s ({b['threads'][-1]}), "
                      f"beside a second worker {got['pair'][-1]:.3f} s "
                      f"({', '.join(str(r['threads'][-1]) for r in pair)})", flush=True)
    for build, got in figures.items():
        a, b, p = (statistics.median(got[k]) for k in ("alone", "hog", "pair"))
        print(f"{build}: epoch alone {a:.3f} s, beside a CPU-bound process of 2 threads {b:.3f} s, "
              f"beside a second worker {p:.3f} s")
        print(f"{build}: ratio beside the process / alone: {b / a:.2f} (target: at most 2.5); "
              f"beside a second worker / alone: {p / a:.2f} (a fair share: at most 2)")
    if args.previous:
        now, before = figures["corel"], figures["previous"]
        print("epoch seconds alone, corel / previous: "
              f"{statistics.median(now['alone']) / statistics.median(before['alone']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
