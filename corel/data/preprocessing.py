"""Serve-time preprocessing of images and feature vectors, the same functions the loaders build their tensors with."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch


def _image_preprocessing(name: str, hw: tuple[int, ...], pixel_max: float,
                         channels: int = 1) -> dict[str, Any]:
    return {
        "modality": "image",
        "dataset": name,
        "input_shape": [channels, *hw],
        "layout": "NCHW",
        "pixel_max": pixel_max,
        "transform": "x / pixel_max (raw pixel values as stored in the dataset files)",
    }


def _check_preprocessing(
    preprocessing: Mapping[str, Any], modality: str, keys: Sequence[str]
) -> None:
    if not isinstance(preprocessing, Mapping):
        raise ValueError("preprocessing must be the dict stored in Dataset.preprocessing")
    found = preprocessing.get("modality")
    if found != modality:
        advice = (
            f"use prepare_{found}s for it"
            if found in ("image", "text", "vector")
            else "pass the dict stored in Dataset.preprocessing"
        )
        raise ValueError(f"this preprocessing is for {found!r} inputs, not {modality!r}; {advice}")
    missing = [k for k in keys if k not in preprocessing]
    if missing:
        raise ValueError(f"preprocessing lacks {', '.join(missing)}; it is incomplete or stale")


def prepare_images(
    images: np.ndarray | torch.Tensor, preprocessing: Mapping[str, Any]
) -> torch.Tensor:
    """Raw images -> model input, exactly as in training: float32 (N, C, H, W) = raw / pixel_max.

    ``images``: (N, C, H, W), or (N, H, W) for one channel, uint8 or float, with raw pixel
    values as the dataset stores them (0..255 for MNIST, Fashion-MNIST and image folders,
    0..16 for digits).
    """
    _check_preprocessing(preprocessing, "image", ("input_shape", "pixel_max"))
    shape = tuple(int(s) for s in preprocessing["input_shape"])
    pixel_max = float(preprocessing["pixel_max"])
    arr = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if arr.ndim == len(shape) and shape[0] == 1:
        arr = arr[:, None]
    if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
        hw = " x ".join(str(s) for s in shape[1:])
        one = f"(N, {', '.join(map(str, shape[1:]))}) or " if shape[0] == 1 else ""
        got = tuple(int(s) for s in arr.shape)
        if got == shape or (shape[0] == 1 and got == shape[1:]):
            why = "one image without its batch dimension: send images[None]"
        elif arr.ndim >= 2 and got[-2:] != shape[-2:]:
            why = f"the images are {got[-2]} x {got[-1]} pixels, the model takes {hw} (got {got})"
        else:
            why = f"got shape {got}"
        raise ValueError(
            f"images must have shape {one}(N, {', '.join(map(str, shape))}) ({hw} pixels, "
            f"{'one channel' if shape[0] == 1 else f'{shape[0]} channels'}); {why}"
        )
    if arr.dtype.kind not in "uif":
        raise ValueError(f"images must be a uint8 or float array, got dtype {arr.dtype}")
    out = arr.astype(np.float32)  # always a copy, so the division below is in place
    # uint8 pixels are finite and within range when the scale is 255 (MNIST, Fashion-MNIST).
    if out.size and not (arr.dtype == np.uint8 and pixel_max >= 255):
        if not np.isfinite(out).all():
            raise ValueError("images contain NaN or infinite values")
        lo, hi = float(out.min()), float(out.max())
        if lo < 0 or hi > pixel_max:
            raise ValueError(
                f"pixel values must lie in [0, {pixel_max:g}] (raw values, as stored in the "
                f"dataset files); got values in [{lo:g}, {hi:g}]"
            )
    np.divide(out, np.float32(pixel_max), out=out)
    return torch.from_numpy(out)


def _vector_preprocessing(sample_shape: tuple[int, ...]) -> dict[str, Any]:
    return {
        "modality": "vector",
        "dataset": "npz",
        "input_shape": [math.prod(sample_shape)],
        "raw_shape": list(sample_shape),
        "transform": "flatten each sample to float32; no scaling",
    }


def _wrong_width(got: tuple[int, ...], d: int, raw_shape: tuple[int, ...],
                 names: Sequence[str] | None) -> str:
    """What a batch of vectors of the wrong shape should have been, in the inputs' terms."""
    want = f"each input must be {d} numbers"
    if names:
        shown = ", ".join(repr(n) for n in names[:8])
        more = f" and {len(names) - 8} more" if len(names) > 8 else ""
        want += f" (the columns {shown}{more})"
    if raw_shape != (d,):
        want += f" or an array of shape {raw_shape}"
    if len(got) == 2:
        return f"{want}; got {got[1]} (inputs of shape {tuple(got)})"
    return f"{want}; got {'a single number' if not got else f'inputs of shape {tuple(got)}'}"


def prepare_vectors(x: np.ndarray | torch.Tensor, preprocessing: Mapping[str, Any]) -> torch.Tensor:
    """Raw samples (N, *raw_shape) or (N, D) -> float32 (N, D), exactly as in training."""
    _check_preprocessing(preprocessing, "vector", ("input_shape", "raw_shape"))
    (d,) = (int(s) for s in preprocessing["input_shape"])
    raw_shape = tuple(int(s) for s in preprocessing["raw_shape"])
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.ndim < 1 or tuple(arr.shape[1:]) not in (raw_shape, (d,)):
        raise ValueError(_wrong_width(arr.shape, d, raw_shape, preprocessing.get("feature_names")))
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"x must be numeric, got dtype {arr.dtype}")
    out = arr.reshape(len(arr), d).astype(np.float32)
    if not np.isfinite(out).all():
        raise ValueError("x contains NaN or infinite values")
    scale = preprocessing.get("standardize")
    if scale is not None:  # features standardised in training: the same here
        mean = np.asarray(scale["mean"], dtype=np.float64)
        std = np.asarray(scale["std"], dtype=np.float64)
        out = ((out - mean) / std).astype(np.float32)
    return torch.from_numpy(out)
