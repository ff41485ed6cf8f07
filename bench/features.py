"""Frozen features at the hardware's speed: which CPU path keeps the ranking, measured.

In one run on the AG News texts (the shared test split of 7,600, corel's own 70/15/15 split:
its 5,320 training and 1,140 test rows):

1. sentence-transformers' torch ``encode`` at batch 32 (what a user calls);
2. corel's paths over the same all-MiniLM-L6-v2, as a run computes its features
   (corel.encoders.precision): ``fp32`` (sentence-transformers' ``encode`` at batch 16),
   ``bf16`` (a copy with its weights in bfloat16), ``int8`` (ONNX Runtime, the Linear layers'
   weights per channel in int8), those this CPU offers; and what corel's ``auto`` picks on
   the validation split's first 256 rows (the gate a run applies);

each with its texts/s, MAP@R of the test rows against the training rows (cosine), and the
first percentile and the minimum of each row's cosine to its fp32 vector. The parity gate
(issue 60): the first percentile at least 0.99 and MAP@R within 0.005 of fp32's; ``auto``
is the fastest path that passes. The same for EfficientNet-Lite0 on ``--images`` Fashion-MNIST
images against timm's fp32 forward (``--images 0``: none): corel's fp32 there is
channels-last, its bf16 a bfloat16 copy.

Last lines: ``features ratio corel / sentence-transformers texts/s: R`` (the fastest path
that passed its gate) and ``features MAP@R corel / sentence-transformers: A / B``.

Run: ``.venv/bin/python bench/features.py [--data-dir ../shared/datasets] [--images 2000]``.
``--smoke``: 80 texts, 50 images.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data import ag_news_texts, load_dataset
from corel.encoder_catalog import cpu_offers
from corel.encoders import choose_features, files, run_preprocessing
from corel.encoders import load as load_encoder
from corel.encoders import timm_images as images
from corel.retrieval import retrieval_metrics
from corel.spec import ExperimentSpec

GATE_COSINE = 0.99
GATE_MAP = 0.005


def cpu_flags() -> str:
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "unknown"
    have = [f for f in ("avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8") if f in flags]
    return ", ".join(have) or "none of AVX-512, AMX"


def map_at_r(h_test: torch.Tensor, y_test: torch.Tensor, h_train: torch.Tensor, y_train: torch.Tensor) -> float:
    return float(retrieval_metrics(h_test, y_test, h_train, y_train, "cosine")["mean_average_precision_at_r"])


def cosines(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    cos = torch.nn.functional.cosine_similarity(got.double(), ref.double(), dim=1)
    return float(torch.quantile(cos, 0.01)), float(cos.min())


def timed(encode: Callable[[list[str]], np.ndarray], texts: list[str]) -> tuple[torch.Tensor, float]:
    encode(texts[:8])  # warm: the first call's one-off work is not the path's speed
    started = time.perf_counter()
    out = encode(texts)
    return torch.from_numpy(np.asarray(out, dtype=np.float32)), len(texts) / (time.perf_counter() - started)


def text_paths(model: Any, path: Path) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """sentence-transformers' own ``encode`` (what a user calls), then corel's paths as a
    run computes them (corel.encoders.text_transformers: fp32, bf16 weights, int8 ONNX
    Runtime), those this CPU offers."""
    from corel.encoders.text_transformers import FAMILY

    def st(texts: list[str]) -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(model.encode(texts, batch_size=32, show_progress_bar=False))

    enc = load_encoder(run_preprocessing("minilm", "text", "frozen", path))

    def corel_path(name: str) -> Callable[[list[str]], np.ndarray]:
        return lambda texts: FAMILY.compute(name, texts, enc).numpy()

    offers = cpu_offers()
    return {"sentence-transformers": st,
            **{name: corel_path(name) for name in FAMILY.paths() if name == "fp32" or offers[name]}}


def report(rows: dict[str, dict[str, float]], unit: str) -> str:
    """Print the paths' rows; returns the fastest of corel's paths that passed the gate."""
    fp32 = rows["fp32"]
    print(f"{'path':<22}{unit + '/s':>12}{'MAP@R':>9}{'cos p1':>9}{'cos min':>9}  gate")
    passed = []
    for name, row in rows.items():
        ok = row["p1"] >= GATE_COSINE and abs(row["map"] - fp32["map"]) <= GATE_MAP
        if name not in ("sentence-transformers", "timm"):
            passed += [name] if ok else []
        print(f"{name:<22}{row['rate']:>12.1f}{row['map']:>9.4f}{row['p1']:>9.5f}{row['min']:>9.5f}  "
              f"{'pass' if ok else 'FAIL'}")
    best = max(passed, key=lambda n: rows[n]["rate"])
    print(f"auto picks: {best}")
    return best


def texts_part(data_dir: Path, limit: int | None) -> None:
    from corel.encoders.text_transformers import load

    split = ag_news_texts(ExperimentSpec(dataset="ag-news"), data_dir)
    train, test = split.train, split.test
    if limit:
        train, test = (train[0][:limit], train[1][:limit]), (test[0][: limit // 4], test[1][: limit // 4])
    texts = list(train[0]) + list(test[0])
    y_train, y_test = torch.from_numpy(train[1]), torch.from_numpy(test[1])
    path = files.installed("minilm", "text")
    model = load(path)
    outs: dict[str, torch.Tensor] = {}
    rows: dict[str, dict[str, float]] = {}
    for name, encode in text_paths(model, path).items():
        outs[name], rate = timed(encode, texts)
        n = len(train[0])
        rows[name] = {"rate": rate, "map": map_at_r(outs[name][n:], y_test, outs[name][:n], y_train)}
    for name in rows:
        rows[name]["p1"], rows[name]["min"] = cosines(outs[name], outs["fp32"])
    print(f"AG News, all-MiniLM-L6-v2: {len(texts)} texts ({len(train[0])} training, {len(test[0])} test)")
    best = report(rows, "texts")
    val = split.val if not limit else (split.val[0][: limit // 2], split.val[1][: limit // 2])
    auto = choose_features(run_preprocessing("minilm", "text"), list(val[0]), torch.from_numpy(val[1]))
    record = auto["encoder"]["features_path"]
    print(f"corel's auto on {record.get('gate_rows', 0)} validation rows picks: {record['precision']} "
          + " ".join(f"({p}: {g.get('rows_per_s', 0):.1f}/s, cos p1 {g.get('cos_p1', 0):.5f}, "
                     f"{'pass' if g['passed'] else 'fail'})" for p, g in record["gate"].items()))
    st = rows["sentence-transformers"]
    print(f"features ratio corel / sentence-transformers texts/s: {rows[best]['rate'] / st['rate']:.2f}")
    print(f"features MAP@R corel / sentence-transformers: {rows[best]['map']:.4f} / {st['map']:.4f}")


def images_part(data_dir: Path, rows_wanted: int) -> None:
    pixels = load_dataset(ExperimentSpec(dataset="fashion-mnist"), data_dir if data_dir.is_dir() else None)
    x_train, y_train = pixels.x_train[:rows_wanted], pixels.y_train[:rows_wanted]
    x_test, y_test = pixels.x_test[: rows_wanted // 4], pixels.y_test[: rows_wanted // 4]
    x = torch.cat([x_train, x_test])
    model = images.load("efficientnet-lite0", files.installed("efficientnet-lite0", "image"))
    mean, std = torch.full((1, 3, 1, 1), 0.5), torch.full((1, 3, 1, 1), 0.5)

    def timm_forward(batch: torch.Tensor) -> np.ndarray:  # timm's own layout, in float32
        out = []
        with torch.inference_mode():
            for start in range(0, len(batch), images.BATCH):
                out.append(model(images.pixels(batch[start:start + images.BATCH].float(), 96, mean, std)))
        return torch.cat(out).numpy()

    family = images.FAMILY
    meta = run_preprocessing("efficientnet-lite0", "image", "frozen", None, pixels.preprocessing)
    assert meta["encoder"]["mean"] == [0.5] * 3 and meta["encoder"]["image_size"] == 96
    enc = load_encoder(meta)

    def corel_path(name: str) -> Callable[[torch.Tensor], np.ndarray]:
        return lambda batch: family.compute(name, batch, enc).numpy()

    paths = {"timm": timm_forward,
             **{name: corel_path(name) for name in family.paths() if name == "fp32" or cpu_offers()[name]}}
    outs: dict[str, torch.Tensor] = {}
    rows: dict[str, dict[str, float]] = {}
    n = len(x_train)
    for name, forward in paths.items():
        forward(x[:8])
        started = time.perf_counter()
        outs[name] = torch.from_numpy(forward(x))
        rate = len(x) / (time.perf_counter() - started)
        rows[name] = {"rate": rate, "map": map_at_r(outs[name][n:], y_test, outs[name][:n], y_train)}
    for name in rows:
        rows[name]["p1"], rows[name]["min"] = cosines(outs[name], outs["fp32"])
    print(f"Fashion-MNIST, EfficientNet-Lite0 at 96 pixels: {len(x)} images ({n} training)")
    best = report(rows, "images")
    print(f"image features ratio corel / timm images/s: {rows[best]['rate'] / rows['timm']['rate']:.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR") or "../shared/datasets")
    ap.add_argument("--images", type=int, default=2000, help="Fashion-MNIST training images (0: none)")
    ap.add_argument("--smoke", action="store_true", help="80 texts and 50 images: seconds")
    args = ap.parse_args(argv)
    # torch's dynamic quantization is deprecated in favour of torchao (not installed here).
    warnings.filterwarnings("ignore", message=".*quantiz.*")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; CPU: {cpu_flags()}")
    if args.images:
        images_part(Path(args.data_dir), 40 if args.smoke else args.images)
    texts_part(Path(args.data_dir), 64 if args.smoke else None)


if __name__ == "__main__":
    main()
