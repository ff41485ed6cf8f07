"""The API under mixed load: lists, single reads and submissions from many clients at once.

Starts the service as production runs it: ``corel serve --no-worker`` and one ``corel worker``
(Celery), on a PostgreSQL database of its own (on the server at COREL_BENCH_PG_ADMIN_URL,
default the local one; dropped at the end) and Redis (COREL_BENCH_REDIS_URL). It seeds
``--seed-runs`` finished experiments, then ``--clients`` concurrent clients (threads, each
its own keep-alive connection; the load generator shares the machine's cores with the
service, as in the issue's probe) each send ``--requests`` requests, drawn with a fixed
seed from the mix:

- list: ``GET /experiments?limit=20`` (a page of the newest);
- read: ``GET /experiments/{id}`` of a random existing run;
- submit: ``POST /experiments`` of a 1-epoch digits run (``--submit-share`` of requests).

It prints p50 and p99 per kind and overall, requests/s, that no request failed, and, once
the worker has trained them, that every accepted run succeeded. Where the time went, from each
answer's ``Server-Timing`` header (``COREL_SERVER_TIMING``): per kind, p50 and p99 of the ms
in the app, in its SQL statements, and outside it (the client's time less the app's: queued
in the socket and the event loop, and on the way), the slowest 1 %'s means of the same; the
CPU milliseconds a request cost the API's processes, PostgreSQL, the clients and the rest
(the app's time is its own CPU plus its turns waiting beside the requests in flight); and
``api mixed load p99 ms in the app / outside it: A / B``. Target (issue 61): p99
under 100 ms and at least 300 requests/s with 20 clients on this 2-core machine.

Last line: ``api mixed load p99 ms: X``.
Run: ``.venv/bin/python bench/api_load.py [--clients 20 --requests 200]``; ``--smoke``: seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core import timing  # noqa: E402
from harness.stack import Stack  # noqa: E402

ADMIN = os.environ.get("COREL_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("COREL_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
RUN = {"dataset": "digits", "epochs": 1, "lr": 1e-3, "batch_size": 64, "train_subset": 200}
KINDS = ("list", "read", "submit")


def finished(base: str, ids: list[int], timeout: float) -> dict[str, int]:
    """Each of ``ids``' ends (``status`` -> count), once none of them is queued or running
    (or ``timeout`` has passed). Only its own runs: a stack it was given may train others'."""
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=base, timeout=30) as http:
        def states() -> dict[str, int]:
            counts: dict[str, int] = {}
            for eid in ids:
                s = http.get(f"/experiments/{eid}").json()["status"]
                counts[s] = counts.get(s, 0) + 1
            return counts

        ends = states()
        while (ends.get("queued") or ends.get("running")) and time.monotonic() < deadline:
            time.sleep(1.0)
            ends = states()
        return ends


def spent(r: httpx.Response) -> tuple[float, float]:
    """(ms in the app, ms in its SQL statements) from the answer's ``Server-Timing`` header
    (``COREL_SERVER_TIMING``, app.api.middleware.RequestMetrics); NaN without one."""
    found = timing.parse_header(r.headers.get("server-timing", ""))
    nan = (float("nan"), "")
    return found.get("app", nan)[0], found.get("db", nan)[0]


def client(base: str, plan: list[tuple[str, int]], split: dict[str, list[tuple[float, float, float]]],
           failures: list[str], accepted: list[int], lock: threading.Lock, start_gate: threading.Event,
           trace: list[tuple[float, str, float]]) -> None:
    """Sends ``plan``; each answer's (ms, ms in the app, ms in its statements) into ``split``
    by kind."""
    parts: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
    ids: list[int] = []
    with httpx.Client(base_url=base, timeout=60) as http:
        start_gate.wait()
        for kind, eid in plan:
            t = time.perf_counter()
            try:
                if kind == "list":
                    r = http.get("/experiments", params={"limit": 20})
                elif kind == "read":
                    r = http.get(f"/experiments/{eid}")
                else:
                    r = http.post("/experiments", json=RUN)
            except httpx.HTTPError as exc:
                failures.append(f"{kind}: {type(exc).__name__}: {exc}")
                continue
            ms = 1000 * (time.perf_counter() - t)
            trace.append((t, kind, ms))
            parts[kind].append((ms, *spent(r)))
            if r.status_code >= 400:
                failures.append(f"{kind}: {r.status_code} {r.text[:200]}")
            elif kind == "submit":
                ids.append(int(r.json()["id"]))
    with lock:
        for k in KINDS:
            split[k] += parts[k]
        accepted += ids


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(api_pid: int) -> dict[str, float]:
    """CPU seconds so far (user and system): the API's processes (``api_pid`` and its
    children: uvicorn's workers), PostgreSQL's (every process called postgres: the machine
    is the benchmark's), this process (the clients), and the machine's."""
    import psutil

    def used(proc: psutil.Process) -> float:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            return float(t.user + t.system)
        return 0.0

    api = psutil.Process(api_pid)
    machine = psutil.cpu_times()
    return {"api": sum(used(p) for p in (api, *api.children(recursive=True))),
            "postgres": sum(used(p) for p in psutil.process_iter(["name"])
                            if (p.info["name"] or "").startswith("postgres")),
            "clients": time.process_time(),
            "machine": float(machine.user + machine.nice + machine.system
                             + getattr(machine, "irq", 0.0) + getattr(machine, "softirq", 0.0))}


def where_it_went(split: dict[str, list[tuple[float, float, float]]]) -> dict[str, float]:
    """Per kind and for all: p50 and p99 of the ms in the app, in its statements and outside
    it; and the slowest 1 % of requests' means of each."""
    row: dict[str, float] = {}
    every = [r for k in KINDS for r in split[k]]
    for k, rows in (*split.items(), ("all", every)):
        for part, values in (("app", [a for _, a, _ in rows]), ("db", [d for _, _, d in rows]),
                             ("out", [t - a for t, a, _ in rows])):
            row[f"{k}_{part}_p50"], row[f"{k}_{part}_p99"] = pct(values, 0.5), pct(values, 0.99)
    tail = sorted(every, reverse=True)[: max(1, len(every) // 100)] if every else []
    row["tail_n"] = len(tail)
    for key, at in (("tail_ms", lambda r: r[0]), ("tail_app", lambda r: r[1]), ("tail_db", lambda r: r[2]),
                    ("tail_out", lambda r: r[0] - r[1])):
        row[key] = statistics.mean(at(r) for r in tail) if tail else float("nan")
    return row


def main(argv: list[str] | None = None, stack: Stack | None = None) -> None:
    """``stack``: a running corel to load; by default one of its own on PostgreSQL (a
    database made for it, ``--api-processes`` API processes and one worker), stopped and
    dropped at the end."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--requests", type=int, default=200, help="per client")
    ap.add_argument("--seed-runs", type=int, default=40)
    ap.add_argument("--submit-share", type=float, default=0.025)
    ap.add_argument("--list-share", type=float, default=0.4)
    ap.add_argument("--rounds", type=int, default=1, help="repeat the load; medians of the rounds")
    ap.add_argument("--api-processes", type=int, default=1, help="COREL_API_PROCESSES")
    ap.add_argument("--trace", help="write the last round's requests (start s, kind, ms) to this file")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.clients, args.requests, args.seed_runs, args.rounds = 4, 20, 4, 1
    with tempfile.TemporaryDirectory() as tmp, (
            contextlib.nullcontext(stack) if stack is not None
            else Stack.postgres(Path(tmp), workers=1, admin_url=ADMIN, redis_url=REDIS,
                                COREL_API_PROCESSES=str(args.api_processes))) as stack:
        base = stack.url
        with httpx.Client(base_url=base, timeout=60) as http:
            seeded = [int(http.post("/experiments", json=RUN).json()["id"]) for _ in range(args.seed_runs)]
        states = finished(base, seeded, 600)
        print(f"seeded {args.seed_runs} runs: {states}")
        rounds: list[dict[str, float]] = []
        all_accepted: list[int] = []
        failures: list[str] = []
        for round_ in range(args.rounds):
            rng = random.Random(round_)
            accepted: list[int] = []
            trace: list[tuple[float, str, float]] = []
            split: dict[str, list[tuple[float, float, float]]] = {k: [] for k in KINDS}
            lock, gate = threading.Lock(), threading.Event()
            threads = []
            for _ in range(args.clients):
                plan = []
                for _ in range(args.requests):
                    u = rng.random()
                    kind = "submit" if u < args.submit_share else (
                        "list" if u < args.submit_share + args.list_share else "read")
                    plan.append((kind, rng.choice(seeded)))
                threads.append(threading.Thread(target=client, args=(base, plan, split, failures, accepted,
                                                                     lock, gate, trace)))
            for t in threads:
                t.start()
            time.sleep(0.5)  # every client connected and waiting
            cpu_before = cpu_seconds(stack.api_pid)
            began = time.perf_counter()
            gate.set()
            for t in threads:
                t.join()
            wall = time.perf_counter() - began
            cpu_after = cpu_seconds(stack.api_pid)
            times = {k: [ms for ms, _, _ in split[k]] for k in KINDS}
            every = [v for k in KINDS for v in times[k]]
            row = {"rps": len(every) / wall, "p50": pct(every, 0.5), "p99": pct(every, 0.99)}
            for k in KINDS:
                row[f"{k}_p50"], row[f"{k}_p99"], row[f"{k}_n"] = pct(times[k], 0.5), pct(times[k], 0.99), len(times[k])
            row.update(where_it_went(split))
            for part in cpu_before:  # CPU ms a request, each part's
                row[f"cpu_{part}"] = 1000 * (cpu_after[part] - cpu_before[part]) / max(1, len(every))
            rounds.append(row)
            if args.trace:  # each request: when it started (s into the round), its kind, ms
                Path(args.trace).write_text("\n".join(f"{t - began:.4f} {k} {ms:.2f}" for t, k, ms in sorted(trace)))
            all_accepted += accepted
            print(f"round {round_ + 1}: {len(every)} requests in {wall:.1f} s: {row['rps']:.1f} requests/s, "
                  f"p50 {row['p50']:.1f} ms, p99 {row['p99']:.1f} ms")

        def med(key: str) -> float:
            return statistics.median(r[key] for r in rounds)

        print(f"\n{args.clients} clients x {args.requests} requests, {args.rounds} round(s) (medians of rounds)")
        print(f"{'kind':8} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8}")
        for k in KINDS:
            print(f"{k:8} {med(f'{k}_n'):>8.0f} {med(f'{k}_p50'):>8.1f} {med(f'{k}_p99'):>8.1f}")
        print(f"{'all':8} {'':>8} {med('p50'):>8.1f} {med('p99'):>8.1f}")
        # Where the time went (the answers' Server-Timing): in the app, of which in its SQL
        # statements, and outside it (queued in the socket and the event loop, on the way).
        print("\nwhere the time went, ms (Server-Timing; outside = the client's time less the app's):")
        print(f"{'kind':8} {'app p50':>8} {'app p99':>8} {'db p50':>8} {'db p99':>8} {'out p50':>8} {'out p99':>8}")
        for k in (*KINDS, "all"):
            print(f"{k:8} " + " ".join(f"{med(f'{k}_{part}_{q}'):>8.1f}" for part in ("app", "db", "out")
                                        for q in ("p50", "p99")))
        print(f"the slowest 1 % ({med('tail_n'):.0f} requests a round), ms on average: {med('tail_ms'):.1f}, in the app "
              f"{med('tail_app'):.1f} (the database {med('tail_db'):.1f}), outside it {med('tail_out'):.1f}")
        # What the requests cost the cores: the app's time above is its CPU plus its turns
        # waiting for the interpreter and the cores beside the other requests in flight.
        shared = stack.api_pid == os.getpid()  # a stack in this process: the clients' CPU is the API's
        rest = med("cpu_machine") - med("cpu_api") - med("cpu_postgres") - (0 if shared else med("cpu_clients"))
        print(f"CPU ms a request: the API's processes {med('cpu_api'):.2f}, PostgreSQL {med('cpu_postgres'):.2f}, "
              + ("the clients (the API's process) -" if shared else f"the clients {med('cpu_clients'):.2f}")
              + f", the rest (the worker, Redis, the system) {rest:.2f}; the machine {med('cpu_machine'):.2f} "
              f"of the {1000 * (os.cpu_count() or 1) / med('rps'):.2f} its {os.cpu_count()} cores have a request "
              f"at {med('rps'):.1f} requests/s")
        print(f"api mixed load p99 ms in the app / outside it: {med('all_app_p99'):.1f} / {med('all_out_p99'):.1f}")
        print(f"requests/s: {med('rps'):.1f} (target at least 300)")
        print(f"failed requests: {len(failures)}" + (f" (first: {failures[0]})" if failures else ""))
        ends = finished(base, all_accepted, 900)
        print(f"runs accepted under load: {len(all_accepted)}; their ends: {ends}")
        print(f"api mixed load p99 ms: {med('p99'):.1f}")
        if failures or set(ends) - {"succeeded"}:
            raise SystemExit("some requests failed, or some accepted runs did not succeed")


if __name__ == "__main__":
    main()
