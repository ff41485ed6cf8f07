"""The same sweep on one worker host and on two: wall time and ratio.

A cluster of network namespaces on this machine (harness/hosts.py: a database
host, an API host, worker hosts with their own var directories, no shared disk). Each
worker host is pinned to a core of its own (``taskset``) with one torch thread. A sweep
of ``--members`` experiments (not stacked: one task each) is queued through the API
host and timed from the POST to its last member's end, first with one worker host
running, then with two; the two are alternated ``--repeats`` times and the medians
compared. Needs root (``ip netns``).

    sudo .venv/bin/python bench/scale_out.py [--members 8] [--epochs 10] [--repeats 3]
                                             [--dataset fashion-mnist|digits] [--train-subset 6000]

The last line is ``ratio 2 hosts / 1 host: X`` (the one host's median time over the two
hosts'; the target is at least 1.8).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from celery import Celery
from sklearn.datasets import load_digits

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.hosts import API_TOKEN, Cluster, cluster_available

SETTINGS = {"COREL_DOWNLOAD": "false"}


def sweep_seconds(api: httpx.Client, base: dict[str, object], members: int, epochs: int,
                  seed: int, cluster: Cluster | None = None, hosts: int = 0) -> float:
    """Seconds from the POST to the sweep's last member's end; with ``hosts``, checks that
    its members were trained on that many worker hosts."""
    body = {"base": {**base, "epochs": epochs, "loss": "cosine", "seed": seed},
            "grid": {"lam": [round(0.1 + 0.8 * i / max(members - 1, 1), 4) for i in range(members)]},
            "vectorize": False}
    started = time.perf_counter()
    r = api.post("/sweeps", json=body)
    r.raise_for_status()
    sweep = r.json()["id"]
    while True:
        progress = api.get(f"/sweeps/{sweep}").json()
        if progress["done"] == members:
            took = time.perf_counter() - started
            counts = progress["counts"]
            assert counts.get("succeeded") == members, progress
            if cluster is not None:
                trained = cluster.sql("SELECT split_part(worker, ':', 1), count(*) FROM experiments "
                                      "WHERE sweep_id = %s GROUP BY 1 ORDER BY 1", sweep)
                print(f"  {len(trained)} host(s) trained it: "
                      + ", ".join(f"{h} {n}" for h, n in trained), flush=True)
                assert len(trained) == hosts, trained
            return took
        time.sleep(0.25)  # the API shares the cores: ask seldom


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--dataset", choices=("fashion-mnist", "digits"), default="fashion-mnist")
    parser.add_argument("--train-subset", type=int, default=6000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.members, args.epochs, args.repeats, args.dataset = 2, 1, 1, "digits"
    why = cluster_available()
    if why:
        print(f"cannot build the cluster: {why}", file=sys.stderr)
        return 2
    cluster = Cluster(SETTINGS)
    try:
        cluster.migrate()
        url = cluster.start_api()
        # The API host serves the cluster's network, so it asks for its admin token.
        with httpx.Client(base_url=url, timeout=60,
                          headers={"Authorization": f"Bearer {API_TOKEN}"}) as api:
            if args.dataset == "digits":  # uploaded through the API host, as a user's table is
                d = load_digits()
                buf = io.BytesIO()
                np.savez(buf, x=d.data.astype(np.float32), y=d.target)
                r = api.post("/datasets", files={"file": ("digits.npz", buf.getvalue())})
                r.raise_for_status()
                base: dict[str, object] = {"dataset": "npz", "dataset_id": r.json()["id"],
                                           "lr": 0.003, "batch_size": 64}
            else:  # Debian's dataset-fashion-mnist, on every worker host
                base = {"dataset": "fashion-mnist", "train_subset": args.train_subset,
                        "lr": 1e-3, "batch_size": 128}
            cluster.start_worker("w1", cpu=0)
            cluster.start_worker("w2", cpu=1)
            control = Celery("corel", broker=cluster.redis_url)

            def w2_consumes(on: bool) -> None:
                """Take the second host out of the queue's rotation, or back, warm: a worker
                started afresh takes seconds before it consumes, which is not scaling."""
                call = control.control.add_consumer if on else control.control.cancel_consumer
                assert call("corel", destination=["celery@corel-w2"], reply=True, timeout=10)

            sweep_seconds(api, base, min(8, args.members), 1, seed=0)  # warm-up: caches, imports, connections
            one: list[float] = []
            two: list[float] = []
            for repeat in range(args.repeats):
                w2_consumes(False)
                one.append(sweep_seconds(api, base, args.members, args.epochs, repeat + 1, cluster, 1))
                w2_consumes(True)
                two.append(sweep_seconds(api, base, args.members, args.epochs, repeat + 1, cluster, 2))
                print(f"repeat {repeat + 1}: 1 host {one[-1]:.2f} s, 2 hosts {two[-1]:.2f} s, "
                      f"ratio {one[-1] / two[-1]:.2f}", flush=True)
    finally:
        cluster.close()
    t1, t2 = statistics.median(one), statistics.median(two)
    what = args.dataset if args.dataset == "digits" else f"{args.dataset}, {args.train_subset} rows"
    print(f"sweep of {args.members} experiments x {args.epochs} epochs ({what}, FFNN), "
          f"medians of {args.repeats}: 1 worker host {t1:.2f} s, 2 worker hosts {t2:.2f} s")
    print(f"ratio 2 hosts / 1 host: {t1 / t2:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
