"""Dashboard pages with 1,000 experiments in the database (target: < 200 ms a page).

Fills a PostgreSQL database of its own (on the server at COREL_BENCH_PG_ADMIN_URL,
default the local one; dropped at the end) with 1,000 experiments of 30 epochs each,
one 40-member sweep, and a stored latent space, serves the real app with uvicorn in
this process, and times each page as its browser loads it: the HTML, then the API
calls its script makes before the first paint, in the order it makes them. Beside
each page it times the baseline, ``GET /health`` (one round trip through the same
server and middlewares, no database), and prints medians and the ratio to the 200 ms
target. Run from the repository's root: ``.venv/bin/python bench/dashboard_pages.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import numpy as np
import psycopg
import uvicorn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from app.core.migrate import upgrade  # noqa: E402
from app.core.models import Checkpoint, EpochMetric, Experiment, LatentSpace, Sweep, utcnow  # noqa: E402
from app.core.settings import Settings  # noqa: E402
from app.main import create_app  # noqa: E402
from corel.loss_catalog import LOSS_NAMES  # noqa: E402
from harness.wait import wait_until  # noqa: E402

ADMIN = os.environ.get("COREL_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("COREL_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
TARGET_MS = 200.0
LOSSES = LOSS_NAMES


def fill(settings: Settings, n: int) -> dict[str, int]:
    """n experiments (a tenth of them in one sweep), 30 epochs each, and one stored
    latent space with its checkpoint, written by the ORM as a worker would."""
    import torch

    from app.storage import make_store
    from corel.train import checkpoint_to_bytes

    rng = np.random.default_rng(0)
    engine = create_engine(settings.db_url)
    with Session(engine) as s:
        sweep = Sweep(base={"dataset": "digits", "epochs": 30}, grid={"loss": list(LOSSES)}, size=40)
        s.add(sweep)
        s.flush()
        for i in range(n):
            loss = LOSSES[i % len(LOSSES)]
            spec = {"dataset": "digits", "model": "ffnn", "loss": loss, "lam": 0.85, "epochs": 30,
                    "seed": i % 5, "lr": 0.003, "batch_size": 64}
            status = "succeeded" if i % 10 else ("running" if i % 20 else "failed")
            exp = Experiment(spec=spec, dataset="digits", loss=loss, status=status, epochs_total=30,
                             current_epoch=30 if status == "succeeded" else 12, best_epoch=28,
                             best_val_accuracy=0.95, test_accuracy=0.94 if status == "succeeded" else None,
                             sweep_id=sweep.id if i < 40 else None, created_at=utcnow(),
                             # A live lease, so that the reconciler leaves the running rows be.
                             worker="bench", heartbeat_at=utcnow() + timedelta(hours=1))
            s.add(exp)
            s.flush()
            acc = np.sort(rng.uniform(0.5, 0.97, 30))
            s.add_all(EpochMetric(experiment_id=exp.id, epoch=k + 1, train_loss=1.0 / (k + 1),
                                  train_accuracy=float(acc[k]), val_accuracy=float(acc[k]),
                                  test_accuracy=None, is_best=k == 27, seconds=0.1) for k in range(30))
        shown = exp.id  # the newest: a succeeded one with a latent space
        exp.status, exp.test_accuracy = "succeeded", 0.94
        # What the scatter reads of a checkpoint: the class vectors and the class names.
        blob = checkpoint_to_bytes({"model": {"head.W": torch.randn(10, 128)},
                                    "class_names": [str(c) for c in range(10)]})
        store = make_store(settings)
        art = store.put_bytes(blob)
        s.add(Checkpoint(experiment_id=shown, kind="best", epoch=28, size=art.size, sha256=art.sha256))
        reps = store.put_bytes(rng.normal(size=(360, 128)).astype(np.float32).tobytes())
        labels = store.put_bytes(rng.integers(0, 10, 360).astype(np.int64).tobytes())
        s.add(LatentSpace(experiment_id=shown, split="test", n=360, dim=128,
                          representations_sha256=reps.sha256, labels_sha256=labels.sha256))
        s.commit()
        return {"experiment": shown, "sweep": sweep.id}


def pages(ids: dict[str, int]) -> dict[str, list[str]]:
    e, w = ids["experiment"], ids["sweep"]
    return {
        "experiments (/)": ["/", "/experiments?limit=25&offset=0"],
        "experiments, filtered": ["/?loss=cosine", "/experiments?limit=25&offset=0&loss=cosine&status=succeeded"],
        "experiment": [f"/ui/experiments/{e}", f"/experiments/{e}", f"/experiments/{e}/metrics",
                       f"/experiments/{e}/latent/scatter?max_points=3000"],
        "new experiment": ["/ui/new", "/openapi.json"],
        "sweeps": ["/ui/sweeps", "/sweeps?limit=25&offset=0"],
        "sweep": [f"/ui/sweeps/{w}", f"/sweeps/{w}", f"/experiments?sweep_id={w}&limit=200&offset=0",
                  f"/sweeps/{w}/report?clustering=false"],
        "compare": ["/ui/compare", "/experiments?status=succeeded&limit=100"],
        "playground": ["/ui/playground", "/experiments?status=succeeded&limit=100",
                       f"/experiments/{e}/latent/scatter?max_points=2000"],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.experiments, args.repeats = 20, 2
    name = f"corel_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN.rsplit("/", 1)[0] + "/" + name
    try:
        settings = Settings(database_url=url, broker_url=REDIS, var_dir=Path("/tmp") / name,
                            queue=f"corel-bench-{name}", log_level="WARNING")
        upgrade(settings)
        t0 = time.perf_counter()
        ids = fill(settings, args.experiments)
        print(f"filled {args.experiments} experiments x 30 epochs in {time.perf_counter() - t0:.1f} s")
        server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=0,
                                               log_config=None, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_until(lambda: server.started, 60, "uvicorn to start", interval=0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            cold = {}
            for page, calls in pages(ids).items():  # the first load: caches, first-use imports
                t = time.perf_counter()
                for path in calls:
                    assert http.get(path).status_code == 200, path
                cold[page] = 1000 * (time.perf_counter() - t)
            print("first load (cold) ms: " + ", ".join(f"{k} {v:.0f}" for k, v in cold.items()))
            base = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                http.get("/health")
                base.append(1000 * (time.perf_counter() - t))
            baseline = statistics.median(base)
            print(f"\nbaseline GET /health: median {baseline:.2f} ms over {args.repeats}\n")
            print(f"{'page':24} {'calls':>5} {'median ms':>10} {'p90 ms':>8} {'x /health':>10} {'of 200 ms':>10}")
            worst = 0.0
            for page, calls in pages(ids).items():
                times = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    for path in calls:
                        r = http.get(path)
                        r.raise_for_status()
                    times.append(1000 * (time.perf_counter() - t))
                med = statistics.median(times)
                p90 = statistics.quantiles(times, n=10)[-1]
                worst = max(worst, med)
                print(f"{page:24} {len(calls):>5} {med:>10.1f} {p90:>8.1f} {med / baseline:>9.1f}x "
                      f"{med / TARGET_MS:>9.2f}")
            print(f"\nslowest page median {worst:.1f} ms: {'meets' if worst < TARGET_MS else 'MISSES'} "
                  f"the {TARGET_MS:.0f} ms target ({worst / TARGET_MS:.2f} of it)")
        server.should_exit = True
        thread.join(timeout=10)
    finally:
        with psycopg.connect(ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
