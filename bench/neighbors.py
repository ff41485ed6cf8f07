"""Nearest-neighbour search at a million rows: corel's exact and HNSW indexes side by side,
in process and over HTTP, against faiss called directly.

Runs the production layout on this machine: PostgreSQL (a database of its own on the
server at COREL_BENCH_PG, default postgresql://postgres@127.0.0.1:5432/postgres, dropped
at the end), Redis (db 13 of COREL_BENCH_REDIS, default 127.0.0.1:6379), ``corel serve``
(the API) and one ``corel worker``, all as subprocesses. Through the API it uploads a
small training set and a 1,000,000-row one (32 features, 100 Gaussian clusters in 10
classes), trains a Gaussian-COREL FFNN (128-d representation) for a few epochs, embeds
the million rows with a batch embedding job, and builds two indexes of the job's rows on
the worker: ``exact`` and ``hnsw``. Then, for each:

* build seconds (the worker's, from GET /indexes/{id}) and the stored size;
* resident memory of the API process before its first search, after it (the index is
  read from the database then, once) and after the HTTP load;
* in-process query p50/p99 and queries/s: the same ``VectorIndex`` loaded from the
  database in this process, one query (a 128-d representation) at a time;
* HTTP ``/neighbors`` p50/p99 for 1 client and for 32 concurrent clients (one raw
  32-feature input per request, octet-stream, k=10), and queries/s;
* recall@10 of the HNSW index against exact search, on the same queries;
* faiss's ``IndexHNSWFlat.search`` called directly on the same index (same vectors, same
  efSearch), and the ratio of corel's in-process query rate to it.

Query timings take turns (corel, faiss, corel, ...) in rounds and report medians.
Targets: recall@10 >= 0.95; HTTP p99 < 20 ms for one client; corel in-process >= 0.8 of
faiss. Run from the repository's root: ``.venv/bin/python bench/neighbors.py``
(``--rows 200000`` for a quicker look).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from app.core.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from app.services.indexes import load_index  # noqa: E402
from app.storage import ensure  # noqa: E402
from app.storage.artifacts import best_checkpoint_bytes  # noqa: E402
from corel.index import VectorIndex, recall_at_k  # noqa: E402
from corel.serving import ServedModel  # noqa: E402
from harness.stack import Stack  # noqa: E402
from harness.wait import wait_until  # noqa: E402

K = 10
FEATURES = 32


def data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 100 Gaussian clusters (10 per class) in 32 features, and their classes."""
    centres = np.random.default_rng(0).normal(size=(100, FEATURES)).astype(np.float32) * 2
    rng = np.random.default_rng(seed)
    cluster = rng.integers(0, 100, rows)
    x = centres[cluster] + rng.normal(size=(rows, FEATURES)).astype(np.float32)
    return x, cluster % 10


def npz(x: np.ndarray, y: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    return buf.getvalue()


def rss_mb(pid: int) -> float:
    """Resident memory of a process (and its children, none for `corel serve`), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wait(client: httpx.Client, path: str, timeout: float = 3600) -> dict[str, Any]:
    def succeeded() -> dict[str, Any] | None:
        body = client.get(path).json()
        if body["status"] in ("failed", "cancelled"):
            raise SystemExit(f"{path}: {body}")
        return dict(body) if body["status"] == "succeeded" else None

    return wait_until(succeeded, timeout, f"{path} to finish", interval=1.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def per_query(search: Callable[[np.ndarray], Any], queries: np.ndarray) -> list[float]:
    times = []
    for row in queries:
        one = row[None, :]
        started = time.perf_counter()
        search(one)
        times.append(time.perf_counter() - started)
    return times


async def http_clients(port: int, path: bytes, bodies: list[bytes], clients: int) -> tuple[float, list[float]]:
    """``clients`` keep-alive connections sending ``bodies`` between them; (queries/s, latencies)."""
    latencies: list[float] = []

    async def client(share: list[bytes]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for body in share:
                started = time.perf_counter()
                writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/octet-stream\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (path, len(body), body))
                await writer.drain()
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(head.decode(errors="replace"))
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
        finally:
            writer.close()

    shares = [bodies[c::clients] for c in range(clients)]
    await asyncio.gather(*(client(s[:1]) for s in shares))  # warm-up: each connection once
    latencies.clear()
    started = time.perf_counter()
    await asyncio.gather(*(client(s) for s in shares))
    return len(latencies) / (time.perf_counter() - started), latencies


def main(argv: list[str] | None = None, stack: Stack | None = None) -> None:
    """``stack``: a running corel to measure; by default one of its own on PostgreSQL (a
    database made for it, the API and one worker), stopped and dropped at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.queries, args.rounds = 2000, 50, 1
    import faiss

    faiss.omp_set_num_threads(1)  # one query at a time, as the API's threads search
    if stack is not None:
        run(stack, args)
        return
    with tempfile.TemporaryDirectory(prefix="corel-bench-neighbors-") as root, Stack.postgres(
            Path(root), workers=1, admin_url=os.environ.get("COREL_BENCH_PG"),
            COREL_MAX_UPLOAD_BYTES=str(400 * 1024 * 1024)) as own:
        run(own, args)


def run(stack: Stack, args: argparse.Namespace) -> None:

    client = httpx.Client(base_url=stack.url, timeout=600)
    started = time.perf_counter()
    x_train, y_train = data(2_000 if args.smoke else 20_000, seed=1)
    ds = client.post("/datasets", files={"file": ("train.npz", npz(x_train, y_train))}).json()["id"]
    spec = {"dataset": "npz", "dataset_id": ds, "model": "ffnn", "hidden": 128, "loss": "gaussian",
            "lam": 0.8, "epochs": 1 if args.smoke else 3, "lr": 1e-3}
    eid = client.post("/experiments", json=spec).json()["id"]
    wait(client, f"/experiments/{eid}")
    x_many, y_many = data(args.rows, seed=2)
    many = client.post("/datasets", files={"file": ("many.npz", npz(x_many, y_many))})
    if many.status_code != 201:
        raise SystemExit(f"upload: {many.text}")
    job = client.post(f"/experiments/{eid}/embeddings", json={"dataset_id": many.json()["id"]}).json()
    wait(client, f"/embeddings/{job['id']}")
    print(f"{args.rows:,} rows x 128 float32 (Gaussian-COREL FFNN on 32 features), embedded by a "
          f"batch job; set-up {time.perf_counter() - started:.0f} s", flush=True)
    indexes = {}
    for kind in ("exact", "hnsw"):
        r = client.post(f"/experiments/{eid}/index", json={"embedding_job_id": job["id"], "kind": kind})
        indexes[kind] = wait(client, f"/indexes/{r.json()['id']}")
        built = indexes[kind]
        extra = f", efSearch {built['ef_search']} (build-time recall@10 {built['recall']:.3f})" if kind == "hnsw" else ""
        print(f"{kind}: built in {built['build_seconds']:.1f} s on the worker, stored "
              f"{built['size_bytes'] / 2**20:.0f} MB{extra}", flush=True)

    # The queries: new rows of the same distribution; their representations for in-process search.
    x_q, _ = data(args.queries, seed=3)
    factory = ensure(make_sessionmaker(make_engine(stack.settings.database_url)), stack.settings)  # the API's store
    with session_scope(factory) as session:
        served = ServedModel.from_bytes(best_checkpoint_bytes(session, eid), "cpu")
    h = served.embed(served.prepare(x_q)).numpy()
    loaded: dict[str, VectorIndex] = {}
    for kind in ("exact", "hnsw"):
        with session_scope(factory) as session:
            loaded[kind] = load_index(session, indexes[kind]["id"])

    # Recall@10 of HNSW against exact search, on the same queries.
    true_d, _ = loaded["exact"].search(h, K)
    found_d, _ = loaded["hnsw"].search(h, K)
    recall = recall_at_k(found_d, true_d)

    # In process: corel's search, one query at a time, and faiss's own, in turns.
    import torch

    torch.set_num_threads(1)
    hnsw = loaded["hnsw"]
    library = hnsw.library_index
    assert library.hnsw.efSearch == hnsw.ef_search
    exact_q = h[: min(200, len(h))]
    times: dict[str, list[float]] = {"corel exact": [], "corel hnsw": [], "faiss": []}
    rates: dict[str, list[float]] = {k: [] for k in times}
    for _ in range(args.rounds):
        for name, search, q in (
            ("corel hnsw", lambda v: hnsw.search(v, K), h),
            ("faiss", lambda v: library.search(v, K), h),
            ("corel exact", lambda v: loaded["exact"].search(v, K), exact_q),
        ):
            t = per_query(search, q)
            times[name] += t
            rates[name].append(len(t) / sum(t))
    ratio = statistics.median(c / f for c, f in zip(rates["corel hnsw"], rates["faiss"], strict=True))

    # Over HTTP: one raw input per request, k=10, through /embed's pipeline.
    bodies = [row.tobytes() for row in x_q]
    http: dict[str, dict[str, Any]] = {}
    for kind in ("exact", "hnsw"):
        before = rss_mb(stack.api_pid)
        path = (f"/experiments/{eid}/neighbors?dtype=float32&shape=1,{FEATURES}&k={K}"
                f"&index_id={indexes[kind]['id']}").encode()
        n = len(bodies) if kind == "hnsw" else min(200, len(bodies))
        asyncio.run(http_clients(stack.port, path, bodies[:1], 1))  # loads the index
        loaded_rss = rss_mb(stack.api_pid)
        one_rate, one = asyncio.run(http_clients(stack.port, path, bodies[:n], 1))
        many_rate, many = asyncio.run(http_clients(stack.port, path, bodies[:n] * (4 if kind == "hnsw" else 1), 32))
        http[kind] = {"rss": (before, loaded_rss, rss_mb(stack.api_pid)), "one": one, "one_rate": one_rate,
                      "many": many, "many_rate": many_rate}

    print()
    print(f"{'':24}{'exact':>14}{'hnsw':>14}")
    print(f"{'build s (worker)':24}{indexes['exact']['build_seconds']:>14.1f}{indexes['hnsw']['build_seconds']:>14.1f}")
    for label, at in (("API RSS MB before (a)", 0), ("API RSS MB loaded (a)", 1), ("API RSS MB after (a)", 2)):
        print(f"{label:24}{http['exact']['rss'][at]:>14.0f}{http['hnsw']['rss'][at]:>14.0f}")
    for label, name in (("in-process p50 ms", "p50"), ("in-process p99 ms", "p99")):
        q = 0.5 if name == "p50" else 0.99
        print(f"{label:24}{1e3 * percentile(times['corel exact'], q):>14.3f}{1e3 * percentile(times['corel hnsw'], q):>14.3f}")
    print(f"{'in-process queries/s':24}{statistics.median(rates['corel exact']):>14.0f}"
          f"{statistics.median(rates['corel hnsw']):>14.0f}")
    for clients, key in (("1 client", "one"), ("32 clients", "many")):
        for q in (0.5, 0.99):
            label = f"http p{int(q * 100)} {clients} ms"
            print(f"{label:24}" + "".join(f"{1e3 * percentile(http[k][key], q):>14.2f}" for k in ("exact", "hnsw")))
        print(f"{'http queries/s ' + clients:24}" + "".join(f"{http[k][key + '_rate']:>14.0f}"
                                                             for k in ("exact", "hnsw")))
    print("(a) resident memory of the API process: before the index's first search, after it "
          "(the index loaded), after the load tests")
    print(f"faiss IndexHNSWFlat.search directly (efSearch {hnsw.ef_search}, 1 thread): "
          f"p50 {1e3 * percentile(times['faiss'], 0.5):.3f} ms, p99 {1e3 * percentile(times['faiss'], 0.99):.3f} ms, "
          f"{statistics.median(rates['faiss']):.0f} queries/s")
    print(f"recall@10: {recall:.3f}")
    print(f"http p99 1 client: {1e3 * percentile(http['hnsw']['one'], 0.99):.2f} ms")
    print(f"ratio corel / faiss: {ratio:.2f}")


if __name__ == "__main__":
    main()
