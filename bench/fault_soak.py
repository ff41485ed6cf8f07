"""The randomized fault soak: every accepted run finishes soon after the faults stop.

24 digits runs of 100 epochs are submitted over two minutes to the API (``corel serve``) on
a PostgreSQL cluster and a Redis server of the soak's own (append-only file on, as in
docker-compose.yml), with two ``corel worker`` processes at the product's defaults (they
divide the cores among themselves), lease 10 s, heartbeat 2 s. For
240 s, every 10-25 s one fault is dealt from a shuffled deck of six kinds: worker SIGKILL,
API SIGKILL, PostgreSQL stop, PostgreSQL freeze (SIGSTOP), Redis restart, Redis FLUSHALL.
Then no faults: every accepted run must have succeeded within 60 s of the last fault, each
epoch recorded once, with the figures of the same spec trained once without interruption.
The engine is ``harness/soak.py``.

``--smoke`` is the short soak ``make test`` runs (tests/app/processes/test_fault_soak.py, about a
minute): 14 runs of 12 epochs, each kind of fault once (a Redis FLUSHALL first, a worker
killed last), two runs submitted before each fault, which waits until both workers train,
so that every fault, the last one included, meets work in training on a machine of any
speed.

``--s3``: the artifacts (checkpoints) in an S3 server of the soak's own (SeaweedFS), and a
seventh kind of fault, that server stopped for an outage's length.

A pruned sweep (6 lambdas, successive halving with eta 3 from epoch 2) is submitted before
the first fault and trains through them; it must end as the library's uninterrupted pruned
group ends (``--sweep-lams`` with no value: none).

Run from the repository's root: ``.venv/bin/python bench/fault_soak.py --seeds 7 11 23``.
Exit status 1 when a seed fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.jobs.workers import WORKER_ENV_DEFAULTS  # noqa: E402
from harness.soak import SoakConfig, run_soak  # noqa: E402

# The references are trained in this process: in the mode the workers train in.
for _name, _value in WORKER_ENV_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

# --smoke: each kind once. What it must show is that every kind is recovered from with work
# in training (the full soak deals them again and again): a FLUSHALL first, while runs are
# queued behind the training ones; a worker killed last, so that a run is redelivered after
# the last fault. Fed, not paced by the training's share: paced (12 runs of 32 epochs, a
# fault every 3-5 s), a fast machine had trained every run before the last fault.
SMOKE_DECK = ("redis-flush", "postgres-stop", "promotion", "redis-restart", "api-kill", "postgres-freeze",
              "worker-kill")
SMOKE: dict[str, Any] = {"deck": SMOKE_DECK, "feed": 2, "fault_gap": (1.5, 2.5), "outage": (1.5, 3.0),
         "unique_specs": 4}


def main(argv: list[str] | None = None) -> int:
    # Stopped by SIGTERM, the soak still stops its PostgreSQL, Redis and processes.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 11, 23])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--fault-seconds", type=float, default=240.0)
    parser.add_argument("--submit-seconds", type=float, default=120.0)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--wait", type=float, default=300.0,
                        help="how long to watch after the last fault before giving up")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    parser.add_argument("--worker-threads", type=int, default=0,
                        help="COREL_WORKER_TORCH_THREADS of each worker (0, the product's "
                        "default: the workers of the host divide its cores among themselves)")
    parser.add_argument("--s3", action="store_true",
                        help="artifacts in an S3 server of the soak's own (SeaweedFS); the deck "
                        "deals the S3 server stopped too")
    parser.add_argument("--sweep-lams", type=float, nargs="*", default=[0.1, 0.3, 0.5, 0.7, 0.85, 0.95],
                        help="a pruned sweep over these lambdas beside the runs (eta 3 from epoch 2, "
                        "checked against the library's uninterrupted pruned group); none: no sweep")
    parser.add_argument("--deck", nargs="+", metavar="KIND",
                        help="with --smoke: only these faults, in this order")
    parser.add_argument("--smoke", action="store_true",
                        help="the short soak of make test: one seed, 14 runs of 12 epochs, each "
                        "kind of fault once (about a minute)")
    args = parser.parse_args(argv)
    smoke = dict(SMOKE) if args.smoke else {}
    if args.smoke and args.s3:  # the S3 server stopped in the middle of the deck
        smoke["deck"] = (*SMOKE_DECK[:3], "s3-stop", *SMOKE_DECK[3:])
    if args.smoke and args.deck:
        smoke["deck"] = tuple(args.deck)
    if args.smoke:
        args.seeds, args.runs, args.epochs, args.submit_seconds, args.fault_seconds = [3], 2, 12, 1.0, 400.0
        args.wait = 90.0
    failed = 0
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="corel-soak-") as tmp:
            logdir = args.logs / f"seed-{seed}" if args.logs else None
            config = SoakConfig(seed=seed, runs=args.runs, epochs=args.epochs,
                                fault_seconds=args.fault_seconds, submit_seconds=args.submit_seconds,
                                deadline=args.deadline, wait=args.wait, logdir=logdir,
                                worker_threads=args.worker_threads or None, s3=args.s3,
                                sweep_lams=tuple(args.sweep_lams), **smoke)
            print(f"seed {seed}: {config.total_runs} runs x {config.epochs} epochs, faults for "
                  f"{config.fault_seconds:.0f} s", flush=True)
            started = time.monotonic()
            report = run_soak(config, Path(tmp))
            print(report.summary())
            print(f"  wall time {time.monotonic() - started:.0f} s", flush=True)
            failed += not report.ok
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
