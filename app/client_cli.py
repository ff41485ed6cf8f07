"""`corel embed`, `corel predict`, `corel cluster`: HTTP clients of a running service."""

from __future__ import annotations

import argparse
import base64
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np


def add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("COREL_URL", "http://127.0.0.1:8000"),
                   help="service base URL (default: $COREL_URL or http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("COREL_API_TOKEN"),
                   help="bearer token (default: $COREL_API_TOKEN)")
    p.add_argument("--experiment", type=int, required=True, help="experiment id")


def add_input_options(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--images", nargs="+", type=Path, help="PNG or JPEG files")
    group.add_argument("--npy", type=Path, help=".npy array, one input per row (uint8 or float)")
    group.add_argument("--text", nargs="+", help="raw strings (text models)")
    group.add_argument("--text-file", type=Path, help="a UTF-8 file, one text per line")


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    if args.images:
        return {"images": [base64.b64encode(p.read_bytes()).decode() for p in args.images]}
    if args.npy:
        array = np.load(args.npy, allow_pickle=False)
        dtype = "uint8" if array.dtype == np.uint8 else "float32"
        array = np.ascontiguousarray(array, dtype=np.uint8 if dtype == "uint8" else "<f4")
        return {"binary": {"dtype": dtype, "shape": list(array.shape),
                           "data": base64.b64encode(array.tobytes()).decode()}}
    if args.text_file:
        return {"texts": [line for line in args.text_file.read_text("utf-8").splitlines() if line]}
    return {"texts": list(args.text)}


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, headers=headers, timeout=600, **kwargs)
    except httpx.HTTPError as exc:
        raise SystemExit(f"corel: cannot reach {args.url}: {exc}") from exc
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise SystemExit(f"corel: {r.status_code}: {detail}")
    return r.json()


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def embed(args: argparse.Namespace) -> int:
    body = _call(args, "POST", "/embed",
                 json={"experiment_id": args.experiment, "output": "binary", **_inputs(args)})
    emb = body["embeddings"]
    array = np.frombuffer(base64.b64decode(emb["data"]), "<f4").reshape(emb["shape"])
    if args.out:
        np.save(args.out, array)
    ck = body["checkpoint"]
    print(_table([[body["experiment_id"], body["n"], body["dim"], ck["epoch"], ck["sha256"][:12],
                   args.out or "-"]],
                 ["experiment", "inputs", "dim", "epoch", "checkpoint", "written to"]))
    return 0


def predict(args: argparse.Namespace) -> int:
    body = _call(args, "POST", "/predict", json={"experiment_id": args.experiment, **_inputs(args)})
    rows = [[i, p["class_index"], p["class_name"], f"{max(p['similarities']):.4f}"]
            for i, p in enumerate(body["predictions"])]
    print(_table(rows, ["input", "class", "name", f"max {body['similarity']} similarity"]))
    return 0


def cluster(args: argparse.Namespace) -> int:
    params = {k: v for k, v in (("metric", args.metric), ("on", args.on)) if v}
    body = _call(args, "GET", f"/experiments/{args.experiment}/clustering", params=params)
    rows = []
    for algo, s in body["results"].items():
        sil = "n/a" if s["silhouette"] is None else f"{s['silhouette']:.4f}"
        rows.append([algo, f"{s['accuracy']:.4f}", f"{s['ari']:.4f}", f"{s['v_measure']:.4f}", sil])
    print(f"experiment {body['experiment_id']}, {body['split']} split, {body['n_samples']} samples, "
          f"{body['metric']} geometry")
    print(_table(rows, ["algorithm", "accuracy", "ARI", "V-measure", "silhouette"]))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("embed", help="representations of inputs from a running service",
                       description="POST /embed: the 128-d final hidden layer of each input.")
    add_client_options(p)
    add_input_options(p)
    p.add_argument("--out", help="write the embeddings to this .npy file")
    p.set_defaults(func=embed)

    p = sub.add_parser("predict", help="predicted classes from a running service",
                       description="POST /predict: class and similarity to every class per input.")
    add_client_options(p)
    add_input_options(p)
    p.set_defaults(func=predict)

    p = sub.add_parser("cluster", help="clustering report of an experiment's latent space",
                       description="GET /experiments/{id}/clustering: K-Means and Gaussian mixture "
                       "scored by Hungarian accuracy, ARI, V-measure and silhouette.")
    add_client_options(p)
    p.add_argument("--metric", choices=("euclidean", "cosine"),
                   help="geometry (default: cosine for Cosine-COREL, else euclidean)")
    p.add_argument("--on", choices=("test", "validation"), help="split (default: test)")
    p.set_defaults(func=cluster)


