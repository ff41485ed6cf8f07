"""Frozen features at the hardware's speed: which CPU path keeps the ranking, measured.

In one run on the AG News texts (the shared test split of 7,600, corel's own 70/15/15 split:
its 5,320 training and 1,140 test rows):

1. sentence-transformers' torch ``encode`` at batch 32 (what a user calls);
2. corel's paths over the same all-MiniLM-L6-v2: ``fp32`` (corel's frozen path today:
   ``encode`` at batch 16), ``bf16`` (a copy of the model with its weights in bfloat16),
   ``autocast`` (fp32 weights, the forward under bfloat16 autocast) and ``int8`` (torch's
   dynamic quantization of the Linear layers);

each with its texts/s, MAP@R of the test rows against the training rows (cosine), and the
first percentile and the minimum of each row's cosine to its fp32 vector. The parity gate
(issue 60): the first percentile at least 0.99 and MAP@R within 0.005 of fp32's; ``auto``
is the fastest path that passes. The same for EfficientNet-Lite0 on ``--images`` Fashion-MNIST
images against timm's fp32 forward (``--images 0``: none).

Last lines: ``features ratio corel / sentence-transformers texts/s: R`` (the fastest path
that passed its gate) and ``features MAP@R corel / sentence-transformers: A / B``.

Run: ``.venv/bin/python bench/features.py [--data-dir ../shared/datasets] [--images 2000]``.
``--smoke``: 80 texts, 50 images.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data import ag_news_texts, load_dataset
from corel.encoders import files
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


def text_paths(model: Any) -> dict[str, Callable[[list[str]], np.ndarray]]:
    def encode_with(m: Any, batch: int, autocast: bool = False) -> Callable[[list[str]], np.ndarray]:
        def run(texts: list[str]) -> np.ndarray:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = m.encode(texts, batch_size=batch, convert_to_tensor=True, show_progress_bar=False)
            return out.float().numpy()
        return run

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    int8 = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    return {"sentence-transformers": encode_with(model, 32), "fp32": encode_with(model, 16),
            "bf16": encode_with(bf16, 16), "autocast": encode_with(model, 16, autocast=True),
            "int8": encode_with(int8, 16)}


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
    model = load(files.installed("minilm", "text"))
    outs: dict[str, torch.Tensor] = {}
    rows: dict[str, dict[str, float]] = {}
    for name, encode in text_paths(model).items():
        outs[name], rate = timed(encode, texts)
        n = len(train[0])
        rows[name] = {"rate": rate, "map": map_at_r(outs[name][n:], y_test, outs[name][:n], y_train)}
    for name in rows:
        rows[name]["p1"], rows[name]["min"] = cosines(outs[name], outs["fp32"])
    print(f"AG News, all-MiniLM-L6-v2: {len(texts)} texts ({len(train[0])} training, {len(test[0])} test)")
    best = report(rows, "texts")
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

    def forward_with(m: torch.nn.Module, dtype: torch.dtype | None = None, autocast: bool = False,
                     channels_last: bool = False) -> Callable[[torch.Tensor], np.ndarray]:
        def run(batch: torch.Tensor) -> np.ndarray:
            out = []
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                for start in range(0, len(batch), images.BATCH):
                    xb = images.pixels(batch[start:start + images.BATCH].float(), 96, mean, std)
                    if channels_last:
                        xb = xb.contiguous(memory_format=torch.channels_last)
                    out.append(m(xb.to(dtype) if dtype is not None else xb).float())
            return torch.cat(out).numpy()
        return run

    last = copy.deepcopy(model).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    paths = {"timm": forward_with(model), "fp32": forward_with(model),
             "bf16": forward_with(copy.deepcopy(model).to(torch.bfloat16), torch.bfloat16),
             "autocast": forward_with(model, autocast=True),
             "channels_last": forward_with(last, channels_last=True)}
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR") or "../shared/datasets")
    ap.add_argument("--images", type=int, default=2000, help="Fashion-MNIST training images (0: none)")
    ap.add_argument("--smoke", action="store_true", help="80 texts and 50 images: seconds")
    args = ap.parse_args()
    # torch's dynamic quantization is deprecated in favour of torchao (not installed here).
    warnings.filterwarnings("ignore", message=".*quantiz.*")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; CPU: {cpu_flags()}")
    if args.images:
        images_part(Path(args.data_dir), 40 if args.smoke else args.images)
    texts_part(Path(args.data_dir), 64 if args.smoke else None)


if __name__ == "__main__":
    main()
