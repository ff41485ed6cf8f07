"""A model's alias promoted with its collection re-embedded and re-indexed, then rolled back.

Runs the production layout on this machine (harness's ``Stack.postgres``: a PostgreSQL
database of its own at COREL_BENCH_PG, a Redis database, ``corel serve --no-worker`` and one
``corel worker``; ``--embedded``: the embedded default), or measures the stack it is given. Through the API it uploads a training set and a
collection of ``--rows`` rows (32 features, 100 Gaussian clusters in 10 classes), trains two
Gaussian-COREL runs (versions 1 and 2 of a model ``bench-...``), makes the upload a collection,
and promotes ``production`` to version 1 (its collection embedded and indexed: a batch
embedding job and an index, HNSW from COREL_INDEX_EXACT_BELOW_ROWS rows). Then:

* idle: ``--clients`` clients search the collection by alias (``POST /models/{name}/neighbors``,
  one 32-feature input, k=10) for ``--seconds``: p50 and p99;
* the promotion to version 2 (``force``: the flip's mechanics, not the gate's verdict) while
  the same clients search: the re-embedding rate (the candidate's embedding job: rows / its
  seconds), ``flip ms``: from the candidate's index built (its ``finished_at``) to the first
  answer of version 2, and the clients' p99 during the promotion against idle;
* the rollback to version 1: from its POST to the first answer of version 1 (nothing is
  embedded: version 1's index is kept).

Targets (issue 72): flip under 100 ms, rollback under 1 s, p99 during promotion at most 1.5x
idle; a collection of at least 100,000 rows. Every answer's ``model_version`` is checked
against the index it searched. Run: ``.venv/bin/python bench/promotion.py [--rows 100000]``;
``--smoke``: seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.stack import Stack
from harness.wait import wait_until

FEATURES = 32
ENDED = ("succeeded", "refused", "conflict", "failed")


def data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 100 Gaussian clusters (10 per class) in 32 features, and their classes."""
    centres = np.random.default_rng(0).normal(size=(100, FEATURES)).astype(np.float32) * 2
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, 100, rows)
    return centres[cluster] + rng.normal(size=(rows, FEATURES)).astype(np.float32), cluster % 10


def npz(x: np.ndarray, y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


class Searchers:
    """``clients`` threads searching by alias until stopped: each answer's time, latency,
    version and index."""

    def __init__(self, base: str, name: str, body: dict[str, Any], clients: int) -> None:
        self.base, self.name, self.body, self.clients = base, name, body, clients
        self.answers: list[tuple[float, float, int, int]] = []  # (received, seconds, version, index)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=60) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                r = http.post(f"/models/{self.name}/neighbors", json=self.body)
                took = time.perf_counter() - started
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code} {r.text[:200]}")
                    continue
                got = r.json()
                self.answers.append((time.time(), took, int(got["model_version"]), int(got["index_id"])))

    def __enter__(self) -> Searchers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)


def poll(http: httpx.Client, path: str, statuses: tuple[str, ...], timeout: float = 3600) -> dict[str, Any]:
    """GET ``path`` until its ``status`` is one of ``statuses``: the body."""
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = http.get(path).json()
        if body["status"] in statuses:
            return body
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} is still {body['status']} after {timeout:g} s")
        time.sleep(0.05)


def promote(http: httpx.Client, name: str, version: int, expected: int | None) -> tuple[dict[str, Any], float]:
    posted = time.time()
    r = http.post(f"/models/{name}/aliases/production",
                  json={"version": version, "expected_version": expected, "force": True})
    r.raise_for_status()
    pid = r.json()["promotion_id"]
    body = poll(http, f"/models/{name}/promotions/{pid}", ENDED)
    if body["status"] != "succeeded":
        raise SystemExit(f"promotion {pid} ended {body['status']}: {body.get('error') or body.get('report')}")
    return body, posted


def when(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def main(argv: list[str] | None = None, stack: Stack | None = None) -> None:
    """``stack``: a running corel to measure; by default ``corel serve`` on the embedded
    default in a temporary directory, stopped at the end."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="the collection's rows")
    ap.add_argument("--train", type=int, default=20_000, help="training rows of both runs")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10.0, help="of idle searching")
    ap.add_argument("--embedded", action="store_true", help="the embedded default (SQLite, its own broker) "
                    "in place of the production layout (PostgreSQL, Redis, a worker process)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs")
    args = ap.parse_args(argv)
    if args.smoke:
        args.rows, args.train, args.clients, args.seconds = 3000, 2000, 2, 1.0
    x, y = data(args.train, 1)
    cx, cy = data(args.rows, 2)
    query = {"alias": "production", "collection": 0, "arrays": [cx[0].tolist()], "k": 10}
    with tempfile.TemporaryDirectory() as tmp, (
            contextlib.nullcontext(stack) if stack is not None else
            Stack.embedded(Path(tmp)) if args.embedded else
            Stack.postgres(Path(tmp), workers=1, admin_url=os.environ.get("COREL_BENCH_PG"))) as stack, \
            httpx.Client(base_url=stack.url, timeout=600) as http:
        name = f"bench-{int(time.time() * 1000) % 10**9}"
        train = http.post("/datasets", files={"file": ("train.npz", npz(x, y))}).json()["id"]
        collection = http.post("/datasets", files={"file": ("collection.npz", npz(cx, cy))}).json()["id"]
        runs = []
        for seed in (1, 2):
            r = http.post("/experiments", json={"dataset": "npz", "dataset_id": train, "loss": "gaussian",
                                                "lam": 0.5, "epochs": 2 if args.smoke else 5, "seed": seed,
                                                "hidden": 128, "lr": 3e-3})
            r.raise_for_status()
            runs.append(r.json()["id"])
        for run in runs:
            body = poll(http, f"/experiments/{run}", ("succeeded", "failed", "cancelled"))
            if body["status"] != "succeeded":
                raise SystemExit(f"experiment {run} failed: {body.get('error')}")
        # One model per run of the benchmark: a stack it is given may hold an earlier one.
        http.post("/models", json={"name": name}).raise_for_status()
        for run in runs:
            http.post(f"/models/{name}/versions", json={"experiment_id": run}).raise_for_status()
        http.post(f"/models/{name}/collections", json={"dataset_id": collection}).raise_for_status()
        promote(http, name, 1, None)
        query["collection"] = collection

        def builds() -> dict[int, dict[str, Any]]:
            model = http.get(f"/models/{name}").json()
            return {b["version"]: b for b in model["collections"][0]["builds"]}

        with Searchers(stack.url, name, query, args.clients) as idle:
            time.sleep(args.seconds)
        with Searchers(stack.url, name, query, args.clients) as during:
            flipped, _ = promote(http, name, 2, 1)
            wait_until(lambda: any(a[2] == 2 for a in during.answers), 60, "an answer of version 2")
        two = builds()[2]
        index = http.get(f"/indexes/{two['index_id']}").json()
        job = http.get(f"/embeddings/{two['embedding_job_id']}").json()
        rate = job["n_total"] / max(when(job["finished_at"]) - when(job["started_at"]), 1e-9)
        first = min((a for a in during.answers if a[2] == 2), key=lambda a: a[0])  # of version 2
        first_two = first[0]
        flip_ms = (first_two - when(index["finished_at"])) * 1000
        # Where the flip's milliseconds go: the index built -> the promotion ended (the alias
        # swapped in its transaction) -> the first answer of version 2, and that answer's own time.
        parts = ((when(flipped["finished_at"]) - when(index["finished_at"])) * 1000,
                 (first_two - when(flipped["finished_at"])) * 1000, first[1] * 1000)
        window = [a[1] for a in during.answers if a[0] <= first_two]
        with Searchers(stack.url, name, query, args.clients) as after:
            _, posted = promote(http, name, 1, 2)
            wait_until(lambda: any(a[2] == 1 for a in after.answers), 60, "an answer of version 1")
        rollback = min(a[0] for a in after.answers if a[2] == 1) - posted
        indexes = {v: b["index_id"] for v, b in builds().items()}
        answers = idle.answers + during.answers + after.answers
        mixed = [a for a in answers if indexes[a[2]] != a[3]]
        errors = idle.errors + during.errors + after.errors
    print(f"collection: {args.rows:,} rows, {args.clients} clients; version 2's index {index['kind']} "
          f"({index['n_total']:,} rows, built in {index['build_seconds']:.1f} s)")
    print(f"idle neighbors by alias: p50 {pct([a[1] for a in idle.answers], 50):.1f} ms, "
          f"p99 {pct([a[1] for a in idle.answers], 99):.1f} ms ({len(idle.answers)} requests)")
    print(f"during the promotion: p50 {pct(window, 50):.1f} ms, p99 {pct(window, 99):.1f} ms "
          f"({len(window)} requests)")
    print(f"answers whose version is not their index's: {len(mixed)} of {len(answers)}; errors: {len(errors)}"
          + (f" (first: {errors[0]})" if errors else ""))
    print(f"re-embedding rate: {rate:,.0f} rows/s")
    print(f"flip: index built -> alias swapped {parts[0]:.1f} ms, -> first answer of version 2 {parts[1]:.1f} ms "
          f"(that request took {parts[2]:.1f} ms)")
    print(f"flip ms: {flip_ms:.1f}")
    print(f"rollback seconds: {rollback:.3f}")
    print(f"neighbors p99 during promotion / idle: {pct(window, 99) / pct([a[1] for a in idle.answers], 99):.2f}")
    print(f"({statistics.median([a[1] for a in idle.answers]) * 1000:.1f} ms median idle)")


if __name__ == "__main__":
    main()
