"""Embedding throughput: in-process model vs POST /embed, and single-image latency.

Starts the service on the embedded default (``corel serve`` in a temporary
directory), trains a Fashion-MNIST FFNN for one epoch through the API, then, in
one run:

(a) in-process: the same checkpoint's encoder on 1024-image uint8 batches of the
    Fashion-MNIST test set, including the same preprocessing (samples/s);
(b) ``POST /embed`` with the same 1024-image batches in both compact binary
    forms: base64 arrays in JSON (uint8 in, float32 out) and raw
    ``application/octet-stream`` bodies; one keep-alive connection, the client
    decoding every answer into an array (samples/s);
(c) single-image ``POST /embed`` requests from 32 concurrent clients
    (requests/s, p50 and p99 latency).

Targets: (b) >= 50% of (a); (c) p99 < 50 ms. Medians are reported.
Run: ``.venv/bin/python bench/embed_throughput.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pybase64
import torch

from corel.data import prepare_images, read_idx
from corel.training import checkpoint_from_bytes, model_from_checkpoint

FASHION = Path("/usr/share/datasets/fashion-mnist")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_service(var: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COREL_")}
    env["COREL_VAR_DIR"] = str(var)
    env["COREL_LOG_LEVEL"] = "WARNING"
    log = open(var.parent / "serve.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "corel.cli", "serve", "--port", str(port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the service did not start; see " + str(var.parent / "serve.log"))


def train(base: str) -> int:
    spec = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "lam": 0.85,
            "epochs": 1, "lr": 1e-3}
    eid = httpx.post(f"{base}/experiments", json=spec).json()["id"]
    while True:
        body = httpx.get(f"{base}/experiments/{eid}").json()
        if body["status"] in ("succeeded", "failed", "cancelled"):
            if body["status"] != "succeeded":
                raise SystemExit(f"training failed: {body}")
            return int(eid)
        time.sleep(0.5)


def checkpoint_of(var: Path, eid: int) -> dict:
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{var / 'corel.sqlite3'}")
    with engine.connect() as conn:
        blob = conn.execute(text("SELECT data FROM checkpoints WHERE experiment_id = :e AND kind = 'best'"),
                            {"e": eid}).scalar_one()
    engine.dispose()
    return checkpoint_from_bytes(blob)


def binary(images: np.ndarray) -> dict:
    return {"dtype": "uint8", "shape": list(images.shape),
            "data": base64.b64encode(np.ascontiguousarray(images).tobytes()).decode()}


def in_process(ckpt: dict, batches: list[np.ndarray], repeats: int) -> list[float]:
    _, model = model_from_checkpoint(ckpt, "cpu")
    pre = json.loads(ckpt["preprocessing"])
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        with torch.inference_mode():
            for batch in batches:
                model.encoder(prepare_images(batch, pre)).numpy()
        rates.append(sum(len(b) for b in batches) / (time.perf_counter() - started))
    return rates


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: bytes,
                   content_type: bytes, body: bytes, accept: bytes = b"application/json") -> bytes:
    """One request on a keep-alive HTTP/1.1 connection; returns the response body.

    A minimal client, so that the load generator costs little of the two cores."""
    writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: %s\r\nAccept: %s\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (path, content_type, accept, len(body), body))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return await reader.readexactly(length)


async def over_http(port: int, eid: int, batches: list[np.ndarray], repeats: int,
                    raw: bool, connections: int = 1) -> list[float]:
    """(b): 1024-image requests over ``connections`` keep-alive connections, each sending
    its share one after another; the client decodes every answer to an array."""
    if raw:
        requests = [(b"/embed?experiment_id=%d&dtype=uint8&shape=%s"
                     % (eid, ",".join(map(str, b.shape)).encode()),
                     b"application/octet-stream", np.ascontiguousarray(b).tobytes(),
                     b"application/octet-stream") for b in batches]
    else:
        requests = [(b"/embed", b"application/json",
                     json.dumps({"experiment_id": eid, "binary": binary(b),
                                 "output": "binary"}).encode(),
                     b"application/json") for b in batches]

    async def send_share(conn, share: range) -> None:
        reader, writer = conn
        for i in share:
            body = await _request(reader, writer, *requests[i])
            if raw:
                out = np.frombuffer(body, "<f4").reshape(len(batches[i]), -1)
            else:
                emb = json.loads(body)["embeddings"]
                out = np.frombuffer(pybase64.b64decode(emb["data"]), "<f4").reshape(emb["shape"])
            assert out.shape == (len(batches[i]), 128)

    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(connections)]
    rates = []
    try:
        await asyncio.gather(*(send_share(c, range(1)) for c in conns))  # warm-up
        shares = [range(c, len(batches), connections) for c in range(connections)]
        for _ in range(repeats):
            started = time.perf_counter()
            await asyncio.gather(*(send_share(c, share) for c, share in zip(conns, shares, strict=True)))
            rates.append(sum(len(b) for b in batches) / (time.perf_counter() - started))
    finally:
        for _, writer in conns:
            writer.close()
    return rates


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8, help="1024-image batches per pass")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--per-client", type=int, default=60)
    args = parser.parse_args()

    images = read_idx(FASHION / "t10k-images-idx3-ubyte.gz")
    batches = [images[i * 1024:(i + 1) * 1024] for i in range(args.batches)]
    with tempfile.TemporaryDirectory() as tmp:
        var = Path(tmp) / "var"
        port = free_port()
        proc = start_service(var, port)
        base = f"http://127.0.0.1:{port}"
        try:
            eid = train(base)
            ckpt = checkpoint_of(var, eid)
            print(f"service on {base}, experiment {eid} (Fashion-MNIST FFNN, Gaussian-COREL), "
                  f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cores")
            a = in_process(ckpt, batches, args.repeats)
            b_json = asyncio.run(over_http(port, eid, batches, args.repeats, raw=False))
            b_raw = asyncio.run(over_http(port, eid, batches, args.repeats, raw=True))
            b_raw2 = asyncio.run(over_http(port, eid, batches, args.repeats, raw=True,
                                           connections=2))
            rps, lat = asyncio.run(concurrent(port, eid, images, args.clients, args.per_client))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    ma, mb, mr = statistics.median(a), statistics.median(b_json), statistics.median(b_raw)
    mr2 = statistics.median(b_raw2)
    ms = sorted(x * 1000 for x in lat)
    p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, round(0.99 * len(ms)) - 1)]
    print(f"(a) in-process encoder, 1024-image batches : median {ma:10.0f} samples/s")
    print(f"(b) POST /embed, 1024-image batches, base64 arrays in JSON   : median {mb:10.0f} "
          f"samples/s = {mb / ma:.2f} of (a)")
    print(f"(b) POST /embed, 1024-image batches, application/octet-stream: median {mr:10.0f} "
          f"samples/s = {mr / ma:.2f} of (a) (target >= 0.50)")
    print(f"(b) the same octet-stream batches over 2 connections at once     : median {mr2:10.0f} "
          f"samples/s = {mr2 / ma:.2f} of (a)")
    print(f"(c) {args.clients} concurrent clients, single images: {rps:.0f} requests/s, "
          f"p50 {p50:.1f} ms, p99 {p99:.1f} ms over {len(ms)} requests (target p99 < 50 ms)")


if __name__ == "__main__":
    main()
