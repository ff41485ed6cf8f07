"""`corel embed`, `corel predict`, `corel cluster`: HTTP clients of a running service."""

from __future__ import annotations

import argparse
import base64
import functools
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.core.status import Status
from corel.geometry import GEOMETRIES


def add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("COREL_URL", "http://127.0.0.1:8000"),
                   help="service base URL (default: $COREL_URL or http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("COREL_API_TOKEN"),
                   help="bearer token (default: $COREL_API_TOKEN)")
    p.add_argument("--experiment", type=int, required=True, help="experiment id")


def add_input_options(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--images", nargs="+", type=Path, help="PNG or JPEG files")
    group.add_argument("--npy", type=Path, help=".npy array, one input per row (uint8 or float), "
                       "any number of rows")
    group.add_argument("--text", nargs="+", help="raw strings (text models)")
    group.add_argument("--text-file", type=Path, help="a UTF-8 file, one text per line")
    p.add_argument("--batch", type=_positive, default=1024,
                   help="rows of --npy per request (default 1024; the service takes at most "
                   "COREL_MAX_EMBED_BATCH)")


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """Images and texts as JSON (arrays go as octet-stream batches: ``_array``)."""
    if args.images:
        return {"images": [base64.b64encode(p.read_bytes()).decode() for p in args.images]}
    if args.text_file:
        return {"texts": [line for line in args.text_file.read_text("utf-8").splitlines() if line]}
    return {"texts": list(args.text)}


def _names(args: argparse.Namespace, n: int) -> list[str]:
    """What each of ``n`` inputs is called in a table: an image's file as given, else its
    position (a row of --npy, a text)."""
    if getattr(args, "images", None):
        return [str(p) for p in args.images]
    return [str(i) for i in range(n)]


def _array(args: argparse.Namespace) -> np.ndarray:
    try:
        array = np.load(args.npy, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"corel: cannot read {args.npy} as a .npy array: {exc}") from exc
    if array.ndim == 0 or len(array) == 0:
        raise SystemExit(f"corel: {args.npy} holds no inputs; one input per row is expected")
    return np.ascontiguousarray(array, dtype=np.uint8 if array.dtype == np.uint8 else "<f4")


def _batches(args: argparse.Namespace, path: str, array: np.ndarray, accept: str) -> Iterator[httpx.Response]:
    """The array sent ``--batch`` rows at a time as raw application/octet-stream bodies
    (no base64, no JSON), so that any number of rows fits the service's batch limit."""
    for start in range(0, len(array), args.batch):
        part = array[start:start + args.batch]
        params = {"experiment_id": args.experiment, "dtype": "uint8" if part.dtype == np.uint8 else "float32",
                  "shape": ",".join(map(str, part.shape))}
        if getattr(args, "layer", None):
            params["layer"] = args.layer
        yield _request(args, "POST", path, params=params, content=part.tobytes(),
                       headers={"Content-Type": "application/octet-stream", "Accept": accept})


@functools.cache
def _http() -> httpx.Client:
    """The commands' one client: ``httpx.request`` builds a client, its TLS context (the
    certificate bundle read and parsed, about 20 ms of CPU) and a connection at each call,
    and ``corel embed`` of a large file sends one request a batch."""
    return httpx.Client(timeout=600)


def _request(args: argparse.Namespace, method: str, path: str, *,
             headers: dict[str, str] | None = None, **kwargs: Any) -> httpx.Response:
    headers = dict(headers or {})
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    try:
        r = _http().request(method, args.url.rstrip("/") + path, headers=headers, **kwargs)
    except httpx.HTTPError as exc:
        raise SystemExit(f"corel: cannot reach {args.url}: {exc}") from exc
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text
        raise SystemExit(f"corel: {r.status_code}: {detail}")
    return r


def _call(args: argparse.Namespace, method: str, path: str, **kwargs: Any) -> Any:
    return _request(args, method, path, **kwargs).json()


def _table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def embed(args: argparse.Namespace) -> int:
    if args.npy:
        parts, checkpoints = [], set()
        for r in _batches(args, "/embed", _array(args), "application/octet-stream"):
            rows, dim = (int(v) for v in r.headers["X-Corel-Shape"].split(","))
            parts.append(np.frombuffer(r.content, "<f4").reshape(rows, dim))
            checkpoints.add((r.headers["X-Corel-Epoch"], r.headers["X-Corel-Checkpoint"]))
        if len(checkpoints) > 1:  # the experiment's best checkpoint changed under us
            raise SystemExit("corel: the experiment's checkpoint changed between batches; run again")
        array = np.concatenate(parts)
        (epoch, sha), = checkpoints
    else:
        body = _call(args, "POST", "/embed", json={"experiment_id": args.experiment, "output": "binary",
                                                   "layer": args.layer, **_inputs(args)})
        emb = body["embeddings"]
        array = np.frombuffer(base64.b64decode(emb["data"]), "<f4").reshape(emb["shape"])
        epoch, sha = body["checkpoint"]["epoch"], body["checkpoint"]["sha256"]
    if args.out:
        np.save(args.out, array)
    print(_table([[args.experiment, array.shape[0], array.shape[1], epoch, sha[:12], args.out or "-"]],
                 ["experiment", "inputs", "dim", "epoch", "checkpoint", "written to"]))
    return 0


def predict(args: argparse.Namespace) -> int:
    if args.npy:
        bodies = [r.json() for r in _batches(args, "/predict", _array(args), "application/json")]
    else:
        bodies = [_call(args, "POST", "/predict", json={"experiment_id": args.experiment, **_inputs(args)})]
    predictions = [p for body in bodies for p in body["predictions"]]
    rows = [[name, p["class_index"], p["class_name"], f"{max(p['similarities']):.4f}"]
            for name, p in zip(_names(args, len(predictions)), predictions, strict=True)]
    print(_table(rows, ["input", "class", "name", f"max {bodies[0]['similarity']} similarity"]))
    return 0


def neighbors(args: argparse.Namespace) -> int:
    path = f"/experiments/{args.experiment}/neighbors"
    if args.npy:
        bodies = []
        for start in range(0, len(array := _array(args)), args.batch):
            part = array[start:start + args.batch]
            params = {"dtype": "uint8" if part.dtype == np.uint8 else "float32",
                      "shape": ",".join(map(str, part.shape)), "k": args.k}
            if args.index is not None:
                params["index_id"] = args.index
            bodies.append(_call(args, "POST", path, params=params, content=part.tobytes(),
                                headers={"Content-Type": "application/octet-stream"}))
    else:
        extra = {} if args.index is None else {"index_id": args.index}
        bodies = [_call(args, "POST", path, json={"k": args.k, **extra, **_inputs(args)})]
    results = [r for body in bodies for r in body["results"]]
    # A neighbour is named by its id, its row in the dataset's file (what its image_url and
    # GET /datasets/{id}/rows name), where the run kept it; else by its row in the reference.
    named_by_id = all(n["id"] is not None for r in results for n in r["neighbors"])
    key = "id" if named_by_id else "row"
    if args.out:
        rows = np.asarray([[n["row"] for n in r["neighbors"]] for r in results], np.int64)
        dist = np.asarray([[n["distance"] for n in r["neighbors"]] for r in results], np.float32)
        ids = np.asarray([[n["id"] if n["id"] is not None else -1 for n in r["neighbors"]]
                          for r in results], np.int64)
        np.savez(args.out, rows=rows, ids=ids, distances=dist,
                 labels=np.asarray([[n["label"] for n in r["neighbors"]] for r in results], np.int64))
    searched = (f"index {bodies[0]['index_id']}" if bodies[0]["index_id"] is not None
                else "exact search over the training split")
    print(f"experiment {args.experiment}: the {args.k} nearest rows, {bodies[0]['geometry']} "
          f"geometry ({bodies[0]['n_reference']} rows, {searched})")
    table = [[name, r["knn_prediction"]["class_name"], r["prediction"]["class_name"],
              " ".join(f"{n[key]}:{n['class_name']}" for n in r["neighbors"][:5])
              + (" ..." if len(r["neighbors"]) > 5 else "")]
             for name, r in zip(_names(args, len(results)), results, strict=True)]
    print(_table(table, ["input", "kNN class", "head class", f"nearest ({key}:class)"]))
    if args.out:
        print(f"written to {args.out} (rows, ids, distances, labels: one row per input; ids: "
              "the rows of the dataset's file, -1 where the run did not keep them)")
    return 0


def index(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"kind": args.kind}
    if args.embedding_job is not None:
        body["embedding_job_id"] = args.embedding_job
    row = _call(args, "POST", f"/experiments/{args.experiment}/index", json=body)
    while args.wait and row["status"] in (Status.QUEUED, Status.RUNNING):
        time.sleep(1.0)
        row = _call(args, "GET", f"/indexes/{row['id']}")
    built = "-" if row["build_seconds"] is None else f"{row['build_seconds']:.1f}"
    recall = "-" if row["recall"] is None else f"{row['recall']:.3f}"
    print(_table([[row["id"], row["status"], row["kind"] or row["requested_kind"], row["geometry"],
                   f"{row['n_done']}/{row['n_total']}", built, recall]],
                 ["index", "status", "kind", "geometry", "rows", "build s", "recall@10"]))
    if row["status"] == Status.FAILED:
        raise SystemExit(f"corel: index {row['id']} failed: {row['error']}")
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


def export(args: argparse.Namespace) -> int:
    r = _request(args, "GET", f"/experiments/{args.experiment}/export", params={"format": args.format})
    # The service names the file: .onnx, .pt, or .zip (a text encoder's model with its tokenizer).
    named = re.search(r'filename="([^"/\\]+)"', r.headers.get("content-disposition", ""))
    out = Path(args.out or (named[1] if named else
                            f"experiment-{args.experiment}.{'onnx' if args.format == 'onnx' else 'pt'}"))
    out.write_bytes(r.content)
    what = ("a zip: the model, its tokenizer's files and corel.json" if r.content[:4] == b"PK\x03\x04"
            else "input: the preprocessed tensor, or what its pretrained encoder takes")
    print(f"{out}: {len(r.content)} bytes ({args.format}; {what}; outputs: embeddings and "
          "similarities; the preprocessing is in its metadata)")
    return 0


def _numbers(value: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {value!r}") from exc


def fewshot_sweep(args: argparse.Namespace) -> int:
    """POST /sweeps with fewshot; unless --no-wait, wait for its members and print the
    report's few-shot table (per N and method: mean, sd, min, max, paired difference, p)."""
    base: dict[str, Any] = {"dataset": args.dataset}
    for key, value in (("dataset_id", args.dataset_id), ("encoder", args.encoder), ("encoder_id", args.encoder_id)):
        if value is not None:
            base[key] = value
    body = {"base": base, "grid": {"loss": [v for v in args.losses.split(",") if v.strip()]},
            "fewshot": {"shots": args.shots, "splits": args.splits, "seed": args.seed, "unlabeled": args.unlabeled}}
    queued = _call(args, "POST", "/sweeps", json=body)
    print(f"sweep {queued['id']}: {queued['size']} members ({args.url.rstrip('/')}/ui/sweeps/{queued['id']})")
    if args.no_wait:
        return 0
    while not (sweep := _call(args, "GET", f"/sweeps/{queued['id']}"))["finished"]:
        time.sleep(1.0)
    report = _call(args, "GET", f"/sweeps/{queued['id']}/report")["fewshot"]
    rows = [[r["shots"], r["method"] + ("*" if r["method"] == r["best"] else ""), f"{100 * r['mean']:.1f}",
             f"{100 * r['sd']:.1f}", f"{100 * r['min']:.1f}", f"{100 * r['max']:.1f}",
             "-" if r["method"] == r["best"] else f"{100 * r['diff']:+.1f}", "-" if r["p"] is None else f"{r['p']:.3g}",
             r["splits"]] for r in report["summary"]]
    print(_table(rows, ["N", "method", "mean %", "sd", "min %", "max %", "diff", "p", "draws"]))
    failed = sweep["counts"].get(Status.FAILED, 0)
    if failed:
        raise SystemExit(f"corel: {failed} of the sweep's members failed (GET /experiments?sweep_id={queued['id']})")
    return 0


def models(args: argparse.Namespace) -> int:
    """``corel models``: create, version, promote, show."""
    name = args.name
    if args.action == "create":
        _call(args, "POST", "/models", json={"name": name, "description": args.description})
        print(f"model {name}: created")
    elif args.action == "version":
        body = _call(args, "POST", f"/models/{name}/versions", json={"experiment_id": args.experiment})
        print(f"{name}:{body['version']} = experiment {body['experiment_id']}")
    elif args.action == "promote":
        aliases = _call(args, "GET", f"/models/{name}")["aliases"]
        request: dict[str, Any] = {"version": args.version, "expected_version": aliases.get(args.alias),
                                   "force": args.force}
        if args.margin is not None:
            request["margin"] = args.margin
        queued = _call(args, "POST", f"/models/{name}/aliases/{args.alias}", json=request)
        pid = queued["promotion_id"]
        while (p := _call(args, "GET", f"/models/{name}/promotions/{pid}"))["status"] not in (
                "succeeded", "refused", "conflict", "failed"):
            time.sleep(0.5)
        report = p.get("report") or {}
        figures = report.get("figures") or {}
        print(f"promotion {pid}: {name}@{args.alias} -> version {args.version}: {p['status']}"
              + (f" ({report['reason']})" if report.get("reason") else "")
              + (f" ({p['report'].get('conflict')})" if p["status"] == "conflict" else ""))
        for figure, values in figures.items():
            lo, hi = values["interval"]
            print(f"  {figure}: candidate {values['candidate']:.4f}, incumbent {values['incumbent']:.4f}, "
                  f"difference {values['delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]")
        if p["status"] != "succeeded":
            return 1
    else:
        body = _call(args, "GET", f"/models/{name}")
        rows = [[v["version"], v["experiment_id"],
                 ", ".join(a for a, at in body["aliases"].items() if at == v["version"])] for v in body["versions"]]
        print(_table(rows, ["version", "experiment", "aliases"]))
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("models", help="models with names: create, add versions, promote an alias",
                       description="A model's versions are runs of its contract, served by name "
                       "(name:N, name@alias); an alias moves only through a promotion's gate.")
    p.add_argument("action", choices=("create", "version", "promote", "show"))
    p.add_argument("name", help="the model's name")
    p.add_argument("--url", default=os.environ.get("COREL_URL", "http://127.0.0.1:8000"),
                   help="service base URL (default: $COREL_URL or http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("COREL_API_TOKEN"),
                   help="bearer token (default: $COREL_API_TOKEN)")
    p.add_argument("--description", help="create: what the model is for")
    p.add_argument("--experiment", type=_positive, help="version: the run to add")
    p.add_argument("--alias", default="production", help="promote: the alias to move (default production)")
    p.add_argument("--version", type=_positive, help="promote: the version the alias should name")
    p.add_argument("--margin", type=float, help="promote: the gate's margin (default 0.01)")
    p.add_argument("--force", action="store_true", help="promote: skip the gate (owner or admin)")
    p.set_defaults(func=models)

    p = sub.add_parser("embed", help="representations of inputs from a running service",
                       description="POST /embed: the final hidden layer of each input (the head's h, "
                       "128-d by default), or a pretrained encoder's own output (--layer encoder).")
    add_client_options(p)
    add_input_options(p)
    p.add_argument("--layer", choices=("head", "encoder"), default="head",
                   help="head: the final hidden layer (default); encoder: a run on a pretrained "
                   "encoder's features, the encoder's own output")
    p.add_argument("--out", help="write the embeddings to this .npy file")
    p.set_defaults(func=embed)

    p = sub.add_parser("predict", help="predicted classes from a running service",
                       description="POST /predict: class and similarity to every class per input.")
    add_client_options(p)
    add_input_options(p)
    p.set_defaults(func=predict)

    p = sub.add_parser("neighbors", help="the nearest training rows of inputs",
                       description="POST /experiments/{id}/neighbors: each input's k nearest "
                       "training rows in the loss's geometry, their classes, and the kNN vote.")
    add_client_options(p)
    add_input_options(p)
    p.add_argument("-k", type=_positive, default=10, help="neighbours per input (default 10)")
    p.add_argument("--index", type=_positive, help="an index id (default: the experiment's latest)")
    p.add_argument("--out", help="also write rows, distances and labels to this .npz file")
    p.set_defaults(func=neighbors)

    p = sub.add_parser("index", help="build a nearest-neighbour index of an experiment's rows",
                       description="POST /experiments/{id}/index: index the training split, or a "
                       "batch embedding job's rows, on a worker; /neighbors then searches it.")
    add_client_options(p)
    p.add_argument("--embedding-job", type=_positive, help="index this batch embedding job's rows "
                   "(default: the training split)")
    p.add_argument("--kind", choices=("auto", "exact", "hnsw"), default="auto",
                   help="exact, hnsw, or auto: exact below COREL_INDEX_EXACT_BELOW_ROWS rows")
    p.add_argument("--wait", action="store_true", help="wait until it is built")
    p.set_defaults(func=index)

    p = sub.add_parser("cluster", help="clustering report of an experiment's latent space",
                       description="GET /experiments/{id}/clustering: K-Means and Gaussian mixture "
                       "scored by Hungarian accuracy, ARI, V-measure and silhouette.")
    add_client_options(p)
    p.add_argument("--metric", choices=GEOMETRIES,
                   help="geometry (default: the loss's own, as GET /losses lists it)")
    p.add_argument("--on", choices=("test", "validation"), help="split (default: test)")
    p.set_defaults(func=cluster)

    p = sub.add_parser("fewshot-sweep", help="a few-shot sweep on a running service",
                       description="POST /sweeps with fewshot: each loss trained as a head on seeded "
                       "draws of N examples per class, each tested on the same evaluation rows; waits, "
                       "then prints the table per N and method (* the best; diff and p: paired "
                       "against it). Every member serves like any run.")
    p.add_argument("--url", default=os.environ.get("COREL_URL", "http://127.0.0.1:8000"),
                   help="service base URL (default: $COREL_URL or http://127.0.0.1:8000)")
    p.add_argument("--token", default=os.environ.get("COREL_API_TOKEN"),
                   help="bearer token (default: $COREL_API_TOKEN)")
    p.add_argument("--dataset", required=True, help="a built-in dataset, or the kind of an upload "
                   "(npz, text, images) with --dataset-id")
    p.add_argument("--dataset-id", type=_positive, help="an uploaded dataset (POST /datasets)")
    p.add_argument("--encoder", help="a frozen pretrained encoder (GET /encoders), e.g. minilm")
    p.add_argument("--encoder-id", type=_positive, help="your own uploaded encoder (POST /encoders)")
    p.add_argument("--losses", default="cce,cosine,gaussian,center",
                   help="comma-separated losses, each a method (default: the paper's four)")
    p.add_argument("--shots", type=_numbers, default=[8, 16, 64], help="examples per class (default 8,16,64)")
    p.add_argument("--splits", type=_positive, default=10, help="seeded draws at each N (default 10)")
    p.add_argument("--seed", type=int, default=0, help="the protocol's seed (default 0)")
    p.add_argument("--unlabeled", action="store_true", help="each member also trains on the pool's "
                   "other rows without their labels (self-training: labelled from the shots)")
    p.add_argument("--no-wait", action="store_true", help="print the sweep's id and return")
    p.set_defaults(func=fewshot_sweep)

    p = sub.add_parser("export", help="download a trained model as one ONNX or TorchScript file",
                       description="GET /experiments/{id}/export: the encoder and head in one "
                       "self-contained file, with the preprocessing recorded in its metadata.")
    add_client_options(p)
    p.add_argument("--format", choices=("onnx", "torchscript"), default="onnx")
    p.add_argument("--out", help="file to write (default: experiment-ID.onnx or .pt)")
    p.set_defaults(func=export)
