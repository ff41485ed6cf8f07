"""Turning request inputs into model inputs, and running the encoder and head."""

from __future__ import annotations

import binascii
import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pybase64
import torch
from PIL import Image, UnidentifiedImageError

from app.errors import InvalidInput, PayloadTooLarge
from app.schemas import BinaryArray, InferenceRequest
from app.services.model_cache import LoadedModel
from corel.data import prepare_images, prepare_texts, prepare_vectors

ACCEPTS = {
    "image": ("images", "arrays", "binary"),
    "text": ("texts",),
    "vector": ("arrays", "binary"),
}


def batch_size(req: InferenceRequest) -> int:
    if req.binary is not None:
        return int(req.binary.shape[0])
    items = req.images if req.images is not None else req.texts if req.texts is not None else req.arrays
    return len(items or [])


def check_batch(req: InferenceRequest, limit: int) -> None:
    n = batch_size(req)
    if n == 0:
        raise InvalidInput("the batch is empty: send at least one input")
    if n > limit:
        raise PayloadTooLarge(f"a request may carry at most {limit} inputs; this one has {n}")


def _b64(data: str, what: str) -> bytes:
    try:
        # pybase64: SIMD base64, ~10x the standard library on a 1 MB batch.
        return pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{what} is not valid base64") from exc


def decode_binary(binary: BinaryArray, raw: bytes | None = None) -> np.ndarray:
    """The array of a BinaryArray; ``raw`` is given for application/octet-stream bodies."""
    if raw is None:
        raw = _b64(binary.data, "binary.data")
    dtype = np.dtype("<f4") if binary.dtype == "float32" else np.dtype(np.uint8)
    if any(s < 0 for s in binary.shape):
        raise InvalidInput(f"binary.shape must be non-negative; got {binary.shape}")
    expected = int(np.prod(binary.shape)) * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"binary.data holds {len(raw)} bytes but shape {binary.shape} of {binary.dtype} "
            f"needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(binary.shape)


def _decode_image(data: bytes, index: int, loaded: LoadedModel) -> np.ndarray:
    _, height, width = (int(s) for s in loaded.preprocessing["input_shape"])
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format not in ("PNG", "JPEG"):
                raise InvalidInput(f"input {index}: {img.format} images are not accepted; send PNG or JPEG")
            gray = img.convert("L")
            if gray.size != (width, height):
                gray = gray.resize((width, height), Image.Resampling.BILINEAR)
            pixels = np.asarray(gray, dtype=np.float32)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidInput(f"input {index}: not a decodable PNG or JPEG image ({exc})") from exc
    # 8-bit grey levels onto the dataset's own pixel scale (255 for (Fashion-)MNIST, 16 for digits).
    return pixels * (float(loaded.preprocessing["pixel_max"]) / 255.0)


def _per_item_arrays(arrays: list[Any]) -> np.ndarray:
    try:
        out = np.asarray(arrays, dtype=np.float32)
    except (ValueError, TypeError):
        shapes = []
        for i, item in enumerate(arrays):
            try:
                shapes.append(np.asarray(item, dtype=np.float32).shape)
            except (ValueError, TypeError) as exc:
                raise InvalidInput(f"input {i}: not a numeric array") from exc
            if shapes[-1] != shapes[0]:
                raise InvalidInput(
                    f"input {i}: shape {shapes[-1]} differs from input 0's shape {shapes[0]}"
                ) from None
        raise InvalidInput("arrays must be numeric, one array per input") from None
    return out


def model_inputs(req: InferenceRequest, loaded: LoadedModel) -> torch.Tensor:
    """The request's inputs as the model's input tensor, preprocessed exactly as in training."""
    kind = next(k for k in ("images", "texts", "arrays", "binary") if getattr(req, k) is not None)
    if kind not in ACCEPTS[loaded.modality]:
        raise InvalidInput(
            f"experiment {loaded.experiment_id} was trained on {loaded.modality} inputs "
            f"({loaded.spec.dataset}); send {' or '.join(ACCEPTS[loaded.modality])}, not {kind}"
        )
    try:
        if kind == "texts":
            texts = req.texts or []
            for i, text in enumerate(texts):
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InvalidInput(f"input {i}: text is not valid UTF-8 ({exc.reason})") from exc
            return prepare_texts(texts, loaded.preprocessing)
        if kind == "images":
            pixels = [_decode_image(_b64(s, f"input {i}"), i, loaded)
                      for i, s in enumerate(req.images or [])]
            return prepare_images(np.stack(pixels), loaded.preprocessing)
        array = (decode_binary(req.binary, req._raw) if req.binary is not None
                 else _per_item_arrays(req.arrays or []))
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(np.argwhere(~np.isfinite(array.reshape(len(array), -1)))[0][0])
            raise InvalidInput(f"input {bad}: contains NaN or infinite values")
        if loaded.modality == "image":
            return prepare_images(array, loaded.preprocessing)
        return prepare_vectors(array, loaded.preprocessing)
    except ValueError as exc:
        # The library's own checks (shape, range, ...) say what is wrong and what is allowed.
        raise InvalidInput(str(exc)) from exc


# Requests run one at a time on the API's event loop, on one torch thread (setting
# api_torch_threads), which keeps small concurrent requests from fighting over the
# cores. A large batch is worth a thread team: it gets api_batch_threads while it runs.
LARGE_BATCH = 256


@contextmanager
def threads_for(batch: int, batch_threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    wanted = batch_threads if batch >= LARGE_BATCH else before
    if wanted != before:
        torch.set_num_threads(wanted)
    try:
        yield
    finally:
        if wanted != before:
            torch.set_num_threads(before)


@torch.inference_mode()
def embed(loaded: LoadedModel, x: torch.Tensor, batch_threads: int = 1) -> torch.Tensor:
    with threads_for(len(x), batch_threads):
        return loaded.model.encoder(x.to(loaded.device)).float().cpu()


@torch.inference_mode()
def predict(
    loaded: LoadedModel, x: torch.Tensor, batch_threads: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    with threads_for(len(x), batch_threads):
        h = loaded.model.encoder(x.to(loaded.device))
        sims = loaded.model.head.similarities(h).float().cpu()
    return sims.argmax(1), sims


def encode_binary(array: np.ndarray) -> dict[str, Any]:
    array = np.ascontiguousarray(array, dtype="<f4")
    return {"dtype": "float32", "shape": list(array.shape),
            "data": pybase64.b64encode(array.tobytes()).decode("ascii")}
