"""Embedding throughput: in-process model vs POST /embed, and single-image latency.

Starts the service on the embedded default (``corel serve`` in a temporary
directory), trains a Fashion-MNIST FFNN for one epoch through the API, then, in
one run:

(a) in-process: the same checkpoint's encoder on 1024-image uint8 batches of the
    Fashion-MNIST test set, including the same preprocessing (samples/s);
(b) ``POST /embed`` with the same 1024-image batches in both compact binary
    forms: base64 arrays in JSON (uint8 in, float32 out) on one keep-alive
    connection, and raw ``application/octet-stream`` bodies on one and on two
    connections; the client decodes every answer into an array (samples/s);
(c) single-image ``POST /embed`` requests from 32 concurrent clients
    (requests/s, p50 and p99 latency), three times.

(a) and the forms of (b) take turns, one pass each per round, and each ratio
compares passes made moments apart: the machine is shared and its load drifts.
The clients run on the same cores as the service, so they are kept lean.
Targets: (b) >= 50% of (a); (c) p99 < 50 ms. Medians are reported.
Run: ``.venv/bin/python bench/embed_throughput.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pybase64
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from corel.data import read_idx
from corel.serving import ServedModel
from harness.stack import Stack
from harness.wait import wait_until

FASHION = Path("/usr/share/datasets/fashion-mnist")


def train(base: str, train_subset: int | None = None) -> int:
    spec = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "lam": 0.85,
            "epochs": 1, "lr": 1e-3, "train_subset": train_subset}
    eid = httpx.post(f"{base}/experiments", json=spec).json()["id"]

    def finished() -> bool:
        body = httpx.get(f"{base}/experiments/{eid}").json()
        if body["status"] in ("failed", "cancelled"):
            raise SystemExit(f"training failed: {body}")
        return bool(body["status"] == "succeeded")

    wait_until(finished, 3600, f"experiment {eid} to train", interval=0.5)
    return int(eid)


def binary(images: np.ndarray) -> dict:
    return {"dtype": "uint8", "shape": list(images.shape),
            "data": base64.b64encode(np.ascontiguousarray(images).tobytes()).decode()}


def in_process(served: ServedModel, batches: list[np.ndarray]) -> float:
    """(a): one pass of the checkpoint's served model (corel.serving, the pipeline the
    API uses) over the batches, in this process on all its torch threads. Samples/s."""
    started = time.perf_counter()
    for batch in batches:
        served.embed(served.prepare(batch)).numpy()
    return sum(len(b) for b in batches) / (time.perf_counter() - started)


class Connection:
    """One keep-alive HTTP/1.1 connection on a blocking socket: a minimal client, so that
    the load generator costs little of the two cores it shares with the service (its
    threads give up the GIL while they send and receive)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Room in the kernel for a whole request and answer, as a bulk client would ask.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)

    def post(self, path: bytes, content_type: bytes, body: bytes | np.ndarray, accept: bytes) -> bytearray:
        size = body.nbytes if isinstance(body, np.ndarray) else len(body)
        self.sock.sendall(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: %s\r\nAccept: %s\r\n"
                          b"Content-Length: %d\r\n\r\n" % (path, content_type, accept, size))
        self.sock.sendall(body)
        head = b""
        while (end := head.find(b"\r\n\r\n")) < 0:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("the service closed the connection")
            head += chunk
        lines = head[:end].split(b"\r\n")
        length = _content_length(lines)
        out = bytearray(length)  # the answer, in memory of its own
        got = len(head) - end - 4
        out[:got] = head[end + 4:]
        view = memoryview(out)
        while got < length:
            n = self.sock.recv_into(view[got:])
            if not n:
                raise RuntimeError("the service closed the connection")
            got += n
        if not lines[0].startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{lines[0].decode()}: {bytes(out[:300]).decode(errors='replace')}")
        return out

    def close(self) -> None:
        self.sock.close()


def batch_requests(eid: int, batches: list[np.ndarray], raw: bool) -> list[tuple]:
    if raw:
        return [(b"/embed?experiment_id=%d&dtype=uint8&shape=%s" % (eid, ",".join(map(str, b.shape)).encode()),
                 b"application/octet-stream", np.ascontiguousarray(b), b"application/octet-stream")
                for b in batches]
    return [(b"/embed", b"application/json",
             json.dumps({"experiment_id": eid, "binary": binary(b), "output": "binary"}).encode(),
             b"application/json") for b in batches]


def over_http(conns: list[Connection], requests: list[tuple], raw: bool) -> float:
    """(b): one pass of 1024-image requests, shared among the connections, each sending
    its share one after another; every answer is decoded into an array. Samples/s."""

    def send_share(conn: Connection, share: range) -> None:
        for i in share:
            body = conn.post(*requests[i])
            if raw:
                out = np.frombuffer(body, "<f4").reshape(-1, 128)
            else:
                emb = json.loads(body)["embeddings"]
                out = np.frombuffer(pybase64.b64decode(emb["data"]), "<f4").reshape(emb["shape"])
            assert out.shape == (1024, 128)

    shares = [range(c, len(requests), len(conns)) for c in range(len(conns))]
    started = time.perf_counter()
    if len(conns) == 1:
        send_share(conns[0], shares[0])
    else:
        threads = [threading.Thread(target=send_share, args=(c, share)) for c, share in zip(conns, shares, strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return len(requests) * 1024 / (time.perf_counter() - started)


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes,
                   content_type: bytes, body: bytes) -> bytes:
    """One request on a keep-alive connection, for the many concurrent clients of (c)."""
    writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: %s\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path, content_type, len(body), body))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    return await reader.readexactly(_content_length(head.split(b"\r\n")))


def _content_length(head_lines: list[bytes]) -> int:
    return next(int(line.split(b":")[1]) for line in head_lines
                if line.lower().startswith(b"content-length:"))


async def _client(port: int, bodies: list[bytes], latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in bodies:
            started = time.perf_counter()
            await _request(reader, writer, b"/embed", b"application/json", body)
            latencies.append(time.perf_counter() - started)
    finally:
        writer.close()


async def concurrent(port: int, eid: int, images: np.ndarray, clients: int, per_client: int):
    bodies = [json.dumps({"experiment_id": eid, "binary": binary(images[i:i + 1])}).encode()
              for i in range(clients * per_client)]
    # Warm-up: every connection once.
    await asyncio.gather(*(_client(port, bodies[c:c + 1], []) for c in range(clients)))
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(*(_client(port, bodies[c * per_client:(c + 1) * per_client], latencies)
                           for c in range(clients)))
    elapsed = time.perf_counter() - started
    return len(latencies) / elapsed, latencies


def run_async(coro: Any) -> Any:
    """The load generator of (c) on uvloop when it is there (it is with uvicorn[standard]):
    less of the shared cores spent on the clients' side."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None, stack: Stack | None = None) -> None:
    """``stack``: a running corel to measure (its first experiment trained here); by default
    ``corel serve`` on the embedded default in a temporary directory, stopped at the end."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8, help="1024-image batches per pass")
    parser.add_argument("--rounds", type=int, default=15,
                        help="rounds of one pass each of (a) and the (b) forms, interleaved")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--per-client", type=int, default=60)
    parser.add_argument("--c-runs", type=int, default=3, help="runs of (c)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.batches, args.rounds, args.clients, args.per_client, args.c_runs = 1, 1, 2, 5, 1

    images = read_idx(FASHION / "t10k-images-idx3-ubyte.gz")
    batches = [images[i * 1024:(i + 1) * 1024] for i in range(args.batches)]
    forms = {"json": "base64 arrays in JSON, 1 connection",
             "raw": "application/octet-stream, 1 connection",
             "raw2": "application/octet-stream, 2 connections"}
    rates: dict[str, list[float]] = {"a": [], **{k: [] for k in forms}}
    ratios: dict[str, list[float]] = {k: [] for k in forms}
    with tempfile.TemporaryDirectory() as tmp, (
            contextlib.nullcontext(stack) if stack is not None else Stack.embedded(Path(tmp))) as stack:
        base, port = stack.url, stack.port
        eid = train(base, 1024 if args.smoke else None)
        served = ServedModel.from_checkpoint(stack.checkpoint(eid), "cpu")
        print(f"service on {base}, experiment {eid} (Fashion-MNIST FFNN, Gaussian-COREL), "
              f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
        requests = {"json": batch_requests(eid, batches, raw=False),
                    "raw": batch_requests(eid, batches, raw=True)}
        requests["raw2"] = requests["raw"]
        conns = {"json": [Connection(port)], "raw": [Connection(port)],
                 "raw2": [Connection(port), Connection(port)]}
        in_process(served, batches)  # warm-up, and the service's model cache
        for form in forms:
            over_http(conns[form], requests[form][:len(conns[form])], form != "json")
        # Interleaved rounds: the machine's load drifts, and each ratio compares passes
        # made moments apart.
        for _ in range(args.rounds):
            a = in_process(served, batches)
            rates["a"].append(a)
            for form in forms:
                b = over_http(conns[form], requests[form], form != "json")
                rates[form].append(b)
                ratios[form].append(b / a)
        for cs in conns.values():
            for c in cs:
                c.close()
        runs = [run_async(concurrent(port, eid, images, args.clients, args.per_client))
                for _ in range(args.c_runs)]
    print(f"(a) in-process encoder, 1024-image batches: median {statistics.median(rates['a']):9.0f} "
          f"samples/s over {args.rounds} rounds")
    for form, label in forms.items():
        r = sorted(ratios[form])
        print(f"(b) POST /embed, {label:40s}: median {statistics.median(rates[form]):9.0f} samples/s; "
              f"ratio to (a) median {statistics.median(r):.2f} (rounds {r[0]:.2f}..{r[-1]:.2f})"
              + (" (target >= 0.50)" if form != "json" else ""))
    for rps, lat in runs:
        ms = sorted(x * 1000 for x in lat)
        p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, round(0.99 * len(ms)) - 1)]
        print(f"(c) {args.clients} concurrent clients, single images: {rps:.0f} requests/s, "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(ms)} requests (target p99 < 50 ms)")


if __name__ == "__main__":
    main()
