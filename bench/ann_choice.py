"""Which approximate nearest-neighbour library for corel's index: measured here, side by side.

On the same float32 vectors (a mixture of Gaussian clusters in 128 dimensions, like a
trained representation; no SIFT offline), for each library with HNSW at the same
parameters (M=16, efConstruction=200): build seconds, single-query p50/p99 and queries/s
on one thread, and recall@10 against exact search, at the smallest efSearch (of 16, 32,
64, 128, 256) that reaches recall 0.95. Exact search (torch, one batched matrix product
per chunk, all threads) is the baseline. Libraries not installed are skipped.

Run: ``.venv/bin/python bench/ann_choice.py --rows 200000``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

M, EF_CONSTRUCTION, K = 16, 200, 10
EF_SEARCH = (16, 32, 64, 128, 256)


def data(rows: int, queries: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(100, dim)).astype(np.float32) * 3
    x = centres[rng.integers(0, 100, rows)] + rng.normal(size=(rows, dim)).astype(np.float32)
    q = centres[rng.integers(0, 100, queries)] + rng.normal(size=(queries, dim)).astype(np.float32)
    return np.ascontiguousarray(x, np.float32), np.ascontiguousarray(q, np.float32)


def exact(x: np.ndarray, q: np.ndarray) -> np.ndarray:
    xt, out = torch.from_numpy(x), []
    x2 = (xt * xt).sum(1)
    for start in range(0, len(q), 256):
        qt = torch.from_numpy(q[start:start + 256])
        d = x2[None, :] - 2 * qt @ xt.T
        out.append(torch.topk(d, K, dim=1, largest=False).indices.numpy())
    return np.concatenate(out)


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth, strict=True)]))


def timed_queries(search: Callable[[np.ndarray], np.ndarray], q: np.ndarray) -> tuple[np.ndarray, list[float]]:
    found, times = [], []
    for row in q:
        started = time.perf_counter()
        found.append(search(row[None, :]).reshape(-1)[:K])
        times.append(time.perf_counter() - started)
    return np.asarray(found), times


def faiss_index(x: np.ndarray) -> tuple[Any, Callable[[int], Callable[[np.ndarray], np.ndarray]]]:
    import faiss

    faiss.omp_set_num_threads(1)
    index = faiss.IndexHNSWFlat(x.shape[1], M)
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.add(x)

    def at(ef: int) -> Callable[[np.ndarray], np.ndarray]:
        index.hnsw.efSearch = ef
        return lambda v: index.search(v, K)[1]
    return index, at


def hnswlib_index(x: np.ndarray) -> tuple[Any, Callable[[int], Callable[[np.ndarray], np.ndarray]]]:
    import hnswlib

    index = hnswlib.Index(space="l2", dim=x.shape[1])
    index.init_index(max_elements=len(x), M=M, ef_construction=EF_CONSTRUCTION)
    index.set_num_threads(1)
    index.add_items(x)

    def at(ef: int) -> Callable[[np.ndarray], np.ndarray]:
        index.set_ef(ef)
        return lambda v: index.knn_query(v, k=K)[0]
    return index, at


def usearch_index(x: np.ndarray) -> tuple[Any, Callable[[int], Callable[[np.ndarray], np.ndarray]]]:
    from usearch.index import Index

    index = Index(ndim=x.shape[1], metric="l2sq", dtype="f32", connectivity=M,
                  expansion_add=EF_CONSTRUCTION)
    index.add(np.arange(len(x)), x, threads=1)

    def at(ef: int) -> Callable[[np.ndarray], np.ndarray]:
        index.expansion_search = ef
        return lambda v: index.search(v, K, threads=1).keys
    return index, at


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rows, args.queries = 2000, 100
    x, q = data(args.rows, args.queries, args.dim)
    started = time.perf_counter()
    truth = exact(x, q)
    print(f"{args.rows} x {args.dim} float32, {args.queries} queries, k={K}; exact search "
          f"(torch, batched, {torch.get_num_threads()} threads): {time.perf_counter() - started:.2f} s "
          f"for all queries")
    torch.set_num_threads(1)
    _, exact_times = timed_queries(lambda v: exact(x, v), q[:100])
    print(f"  exact, one query at a time, 1 thread: p50 {1e3 * statistics.median(exact_times):.2f} ms")
    for name, build in (("faiss IndexHNSWFlat", faiss_index), ("hnswlib", hnswlib_index),
                        ("usearch", usearch_index)):
        try:
            started = time.perf_counter()
            _, at = build(x)
            built = time.perf_counter() - started
        except ImportError:
            print(f"{name}: not installed")
            continue
        for ef in EF_SEARCH:
            found, times = timed_queries(at(ef), q)
            r = recall(found, truth)
            if r >= 0.95 or ef == EF_SEARCH[-1]:
                break
        times_ms = sorted(1e3 * t for t in times)
        print(f"{name}: build {built:.1f} s (1 thread where settable); efSearch {ef}: recall@10 "
              f"{r:.3f}, p50 {statistics.median(times_ms):.3f} ms, p99 "
              f"{times_ms[int(0.99 * len(times_ms)) - 1]:.3f} ms, {len(times) / sum(times):.0f} queries/s")


if __name__ == "__main__":
    main()
