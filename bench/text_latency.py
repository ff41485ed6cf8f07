"""Serving latency of raw texts: ``POST /embed`` of one sentence on a frozen MiniLM run.

Starts the service on the embedded default (``corel serve`` in a temporary directory; or
measures the stack it is given),
trains a frozen all-MiniLM-L6-v2 head on AG News through the API (``--train-subset`` training
rows, one epoch; its features on the path corel's gate picks), then, in one run:

(a) in-process, sentence-transformers' own ``encode`` of the one sentence (the peer: what a
    user's own Python would pay for the features alone);
(a') in-process, corel's own served fp32 path (``corel.encoders.model_inputs``: ONNX Runtime's
    float32 kernels, as the API computes a served text), one text at a time: the compute
    alone, the floor under (b)'s p99, with the slowest text's tokens;
(b) ``POST /embed`` of one sentence, one client, one keep-alive connection, one request at a
    time: p50 and p99; for ``layer: "encoder"`` (MiniLM's own vectors, what Infinity serves)
    and ``layer: "head"`` (the COREL head's h over them);
(c) the same from 16 concurrent clients (each its own connection): p50 and p99, and
    requests/s; then the text queue's passes, texts and tokens a pass, and the time queued
    apart from the time computing (from the service's /metrics).

Target (issue 60): (b)'s p99 under 15 ms on this 2-core machine. The sentences differ per
request (AG News test headlines), so no cache answers them.

Then, unless ``--infinity none``, the same (b) and (c) against Infinity (PyPI's ``infinity-emb``,
in an environment of its own made under ``--infinity`` the first time: harness/infinity.py),
serving the same MiniLM files on the same cores, after corel's stack has stopped answering; and
corel's ``layer: "encoder"`` against Infinity's embeddings of the same texts (cosine). The run's
features path is ``--precision`` (default fp32, Infinity's own; ``auto``: what corel's gate picks).

Last lines: ``embed one text p50/p99 ms, 1 client: A / B`` and ``... 16 clients: C / D`` (the
encoder layer); with Infinity, its two lines, ``ratio p99 corel / infinity, 1 client: R; 16
clients: S; requests/s corel / infinity, 16 clients: T``, and issue 73's three:
``text embed one client p99 ms corel / infinity: A / B``, ``text embed 16 clients requests/s
corel / infinity: C / D``, ``ratio corel / infinity requests/s: R``.
Run: ``.venv/bin/python bench/text_latency.py [--requests 300]``; ``--smoke``: seconds (200 AG
News rows uploaded as a text table instead of the built-in dataset).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.stack import Stack
from harness.wait import wait_until


def headlines(data_dir: Path, n: int) -> list[str]:
    with open(data_dir / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        return [f"{r[1]} {r[2]}" for r in list(csv.reader(fh))[:n]]


def upload(base: str, data_dir: Path, n: int) -> int:
    """The first ``n`` AG News test rows as a text table of this run's own (the smoke run's
    data: the built-in dataset's features of its 2,280 held-out rows cost a minute on 2 cores)."""
    with open(data_dir / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:n]
    lines = ["text,topic"] + [f"\"{(r[1] + ' ' + r[2]).replace(chr(34), '')}\",{r[0]}" for r in rows]
    r = httpx.post(f"{base}/datasets", files={"file": ("news.csv", "\n".join(lines).encode())},
                   data={"kind": "text"}, timeout=60)
    r.raise_for_status()
    return int(r.json()["id"])


def train(base: str, subset: int, dataset_id: int | None = None, precision: str = "auto") -> int:
    spec = {"dataset": "ag-news", "encoder": "minilm", "loss": "cosine", "lam": 0.85, "epochs": 1,
            "lr": 1e-3, "hidden": 128, "batch_size": 32, "train_subset": subset, "precision": precision}
    if dataset_id is not None:  # the whole upload, its own split
        spec = {**spec, "dataset": "text", "dataset_id": dataset_id, "train_subset": None, "epochs": 6,
                "batch_size": 16}
    r = httpx.post(f"{base}/experiments", json=spec, timeout=30)
    r.raise_for_status()
    eid = int(r.json()["id"])

    def finished() -> bool:
        body = httpx.get(f"{base}/experiments/{eid}", timeout=30).json()
        if body["status"] in ("failed", "cancelled"):
            raise SystemExit(f"training failed: {body}")
        return bool(body["status"] == "succeeded")

    wait_until(finished, 3600, f"experiment {eid} to train", interval=0.5)
    return eid


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


def clients(base: str, body: Callable[[str], tuple[str, dict[str, Any]]], texts: list[str], n_clients: int,
            per_client: int) -> tuple[list[float], float]:
    """``n_clients`` threads, each on its own keep-alive connection, one request at a time:
    ``body(text)`` is the request's (path, JSON). The latencies and the requests per second."""
    latencies: list[float] = []
    failed: list[str] = []
    lock = threading.Lock()
    # One TLS context for every client (each client built its own: the certificate bundle
    # read and parsed, about 20 ms of CPU, for a plain-HTTP server).
    tls = httpx.create_ssl_context()

    def one(k: int) -> None:
        mine = []
        try:
            with httpx.Client(base_url=base, timeout=60, verify=tls) as c:
                path, payload = body(texts[k])
                c.post(path, json=payload).raise_for_status()  # warm
                for i in range(per_client):
                    text = texts[(k * per_client + i) % len(texts)]
                    path, payload = body(text)
                    started = time.perf_counter()
                    r = c.post(path, json=payload)
                    mine.append(time.perf_counter() - started)
                    if r.is_error:
                        raise RuntimeError(f"{r.status_code} for {text[:80]!r}: {r.text[:500]}")
        except Exception as exc:  # a client that stopped: the run's figures would be of the others
            with lock:
                failed.append(f"client {k}: {type(exc).__name__}: {exc}")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(n_clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise SystemExit(f"{len(failed)} of {n_clients} clients failed; the first: {failed[0]}")
    return latencies, len(latencies) / (time.perf_counter() - started)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.asarray((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


def queue_metrics(base: str) -> dict[str, float]:
    """The text queue's totals from the service's /metrics: passes, texts, tokens, and the
    mean seconds a request waited and a pass computed."""
    text = httpx.get(f"{base}/metrics", timeout=30).text

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))

    waited = total("corel_text_queued_seconds_count")
    return {"batches": total("corel_text_batch_inputs_count"), "texts": total("corel_text_batch_inputs_sum"),
            "tokens": total("corel_text_batch_tokens_sum"),
            "queued": total("corel_text_queued_seconds_sum") / max(waited, 1),
            "compute": total("corel_text_compute_seconds_sum") / max(total("corel_text_compute_seconds_count"), 1)}


def main(argv: list[str] | None = None, stack: Stack | None = None) -> None:
    """``stack``: a running corel to measure (its run trained here); by default ``corel
    serve`` on the embedded default in a temporary directory, stopped at the end."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR") or "../shared/datasets")
    ap.add_argument("--requests", type=int, default=300, help="requests of (a) and (b); (c): 16 x this / 8")
    ap.add_argument("--train-subset", type=int, default=1000)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "auto", "bf16", "int8"),
                    help="the run's features path (default fp32: Infinity's; auto: the fastest the "
                    "parity gate allows, int8 on most of these CPUs)")
    ap.add_argument("--infinity", default=None,
                    help="Infinity's own environment (made here the first time; default "
                    "build/peers/infinity, and 'none' with --smoke); 'none': corel alone")
    ap.add_argument("--api-threads", type=int, default=0,
                    help="COREL_API_TORCH_THREADS of the service it starts (0: the product's default)")
    ap.add_argument("--smoke", action="store_true", help="a few requests: that it runs (figures mean nothing; "
                    "corel alone unless --infinity names an environment)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.requests, args.train_subset = 16, 256
    if args.infinity is None:
        args.infinity = "none" if args.smoke else "build/peers/infinity"
    texts = headlines(Path(args.data_dir), 2000)
    from sentence_transformers import SentenceTransformer

    from corel.encoders import files

    minilm = files.installed("minilm", "text")
    model = SentenceTransformer(str(minilm), device="cpu", local_files_only=True)
    peer = []
    with torch.inference_mode():
        model.encode(texts[:1], show_progress_bar=False)
        for text in texts[:args.requests]:
            started = time.perf_counter()
            model.encode([text], show_progress_bar=False)
            peer.append(time.perf_counter() - started)
    # The same texts through corel's own served path in process (fp32, the engine the API
    # serves texts on: corel.encoders.model_inputs, nothing kept), one at a time: the compute
    # alone, under any queue, HTTP or client, and what the one-client p99 cannot go below.
    from corel.encoders import model_inputs, run_preprocessing

    served = run_preprocessing("minilm", "text")
    alone = []
    with torch.inference_mode():
        model_inputs(texts[:1], served)  # its session made
        for text in texts[:args.requests]:
            started = time.perf_counter()
            model_inputs([text], served)
            alone.append(time.perf_counter() - started)
    tokens = [int(n) for n in model.tokenize(texts[:args.requests])["attention_mask"].sum(1)]
    slowest = int(np.argmax(alone))
    same = texts[:100]
    with tempfile.TemporaryDirectory() as tmp, (
            contextlib.nullcontext(stack) if stack is not None
            else Stack.embedded(Path(tmp), COREL_DATA_DIR=str(Path(args.data_dir).resolve()),
                                **({"COREL_API_TORCH_THREADS": str(args.api_threads)} if args.api_threads
                                   else {}))) as stack:
        base = stack.url
        own = upload(base, Path(args.data_dir), 200) if args.smoke else None
        eid = train(base, args.train_subset, own, args.precision)
        record = httpx.get(f"{base}/experiments/{eid}", timeout=30).json().get("features") or {}
        print(f"experiment {eid}: frozen MiniLM on AG News, features path {record.get('precision')} "
              f"(asked {record.get('asked')}); torch {torch.__version__}, {torch.get_num_threads()} threads")

        def corel_body(layer: str) -> Callable[[str], tuple[str, dict[str, Any]]]:
            return lambda text: ("/embed", {"experiment_id": eid, "texts": [text], "layer": layer})

        # The encoder's own layer (what Infinity serves), then the head's h over it.
        one, _ = clients(base, corel_body("encoder"), texts, 1, args.requests)
        many, rate = clients(base, corel_body("encoder"), texts, 16, max(2, args.requests // 8))
        head_one, _ = clients(base, corel_body("head"), texts, 1, args.requests)
        head_many, head_rate = clients(base, corel_body("head"), texts, 16, max(2, args.requests // 8))
        queue = queue_metrics(base)
        r = httpx.post(f"{base}/embed", json={"experiment_id": eid, "texts": same, "layer": "encoder"}, timeout=120)
        r.raise_for_status()
        ours = np.asarray(r.json()["embeddings"])
    print(f"(a) sentence-transformers encode, in process: p50 {pct(peer, 50):.1f} ms, p99 {pct(peer, 99):.1f} ms")
    print(f"(a') corel's served fp32 path, in process, one text at a time: p50 {pct(alone, 50):.1f} ms, "
          f"p99 {pct(alone, 99):.1f} ms; the slowest {1000 * alone[slowest]:.1f} ms ({tokens[slowest]} tokens; "
          f"tokens p50 {int(np.median(tokens))}, max {max(tokens)})")
    for layer, (a, b, ab_rate) in {"encoder": (one, many, rate),
                                    "head": (head_one, head_many, head_rate)}.items():
        print(f"(b) POST /embed layer {layer}, 1 client:   p50 {pct(a, 50):.1f} ms, p99 {pct(a, 99):.1f} ms "
              f"({len(a)} requests; median {statistics.median(a) * 1000:.1f} ms)")
        print(f"(c) POST /embed layer {layer}, 16 clients: p50 {pct(b, 50):.1f} ms, p99 {pct(b, 99):.1f} ms, "
              f"{ab_rate:.1f} requests/s ({len(b)} requests)")
    print(f"corel's text queue over the run: {queue['batches']:.0f} passes, mean "
          f"{queue['texts'] / max(queue['batches'], 1):.1f} texts and "
          f"{queue['tokens'] / max(queue['batches'], 1):.0f} tokens a pass; per request mean "
          f"{queue['queued'] * 1000:.2f} ms queued, per pass mean {queue['compute'] * 1000:.2f} ms computing")
    print(f"head layer / encoder layer: p99 1 client {pct(head_one, 99) / pct(one, 99):.2f}, "
          f"requests/s 16 clients {head_rate / rate:.2f}")
    theirs_one = theirs_many = None
    if args.infinity != "none":
        from harness.infinity import VERSION, Infinity, environment

        root = Path(args.infinity).resolve()
        command = environment(root)
        with Infinity(command, minilm, root / "infinity.log") as inf:
            def inf_body(text: str) -> tuple[str, dict[str, Any]]:
                return "/embeddings", {"model": inf.name, "input": [text]}

            theirs_one, _ = clients(inf.url, inf_body, texts, 1, args.requests)
            theirs_many, theirs_rate = clients(inf.url, inf_body, texts, 16, max(2, args.requests // 8))
            theirs = np.asarray(inf.embed(same))
        print(f"(b') Infinity {VERSION} POST /embeddings, 1 client:   p50 {pct(theirs_one, 50):.1f} ms, "
              f"p99 {pct(theirs_one, 99):.1f} ms ({len(theirs_one)} requests)")
        print(f"(c') Infinity {VERSION} POST /embeddings, 16 clients: p50 {pct(theirs_many, 50):.1f} ms, "
              f"p99 {pct(theirs_many, 99):.1f} ms, {theirs_rate:.1f} requests/s ({len(theirs_many)} requests)")
        print(f"encoder layer against Infinity's embeddings of the same {len(same)} texts: cosine min "
              f"{cosines(ours, theirs).min():.7f} (1 - cosine at most {1 - cosines(ours, theirs).min():.1e})")
    print(f"embed one text p50/p99 ms, 1 client: {pct(one, 50):.1f} / {pct(one, 99):.1f}")
    print(f"embed one text p50/p99 ms, 16 clients: {pct(many, 50):.1f} / {pct(many, 99):.1f}")
    if theirs_one is not None and theirs_many is not None:
        print(f"infinity one text p50/p99 ms, 1 client: {pct(theirs_one, 50):.1f} / {pct(theirs_one, 99):.1f}")
        print(f"infinity one text p50/p99 ms, 16 clients: {pct(theirs_many, 50):.1f} / {pct(theirs_many, 99):.1f}")
        print(f"ratio p99 corel / infinity, 1 client: {pct(one, 99) / pct(theirs_one, 99):.2f}; "
              f"16 clients: {pct(many, 99) / pct(theirs_many, 99):.2f}; requests/s corel / infinity, 16 clients: "
              f"{rate / theirs_rate:.2f}")
        print(f"text embed one client p99 ms corel / infinity: {pct(one, 99):.1f} / {pct(theirs_one, 99):.1f}")
        print(f"text embed one client p99 ms, corel's fp32 compute alone in process: {pct(alone, 99):.1f}")
        print(f"text embed 16 clients requests/s corel / infinity: {rate:.1f} / {theirs_rate:.1f}")
        print(f"ratio corel / infinity requests/s: {rate / theirs_rate:.2f}")


if __name__ == "__main__":
    main()
