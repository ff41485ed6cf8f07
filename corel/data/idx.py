"""IDX files: MNIST and Fashion-MNIST (canonical gzipped files, found locally or downloaded)."""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data.base import MNIST_VAL_SIZE, SPLIT_SEED, Dataset, DatasetNotFoundError, PathLike
from corel.data.download import DownloadError
from corel.data.download import download as download_dataset
from corel.data.preprocessing import _image_preprocessing, prepare_images
from corel.data.splits import _check_class_sizes, _stratified_take, _subset
from corel.spec import ExperimentSpec

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
    class_names: tuple[str, ...]
    hint: str = ""


_MNIST = _IdxSource(
    name="mnist",
    title="MNIST",
    subdirs=("mnist", "MNIST", "MNIST/raw"),
    system_dirs=(),
    class_names=tuple(str(d) for d in range(10)),
)


_FASHION_MNIST = _IdxSource(
    name="fashion-mnist",
    title="Fashion-MNIST",
    subdirs=("fashion-mnist", "fashion_mnist", "FashionMNIST", "FashionMNIST/raw"),
    system_dirs=(Path("/usr/share/datasets/fashion-mnist"),),
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
            place = download_dataset(source.name, data_dir)
        except DownloadError as exc:
            download_error = f"The download into {data_dir} failed: {exc}\n"
        else:
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
        "load_dataset(spec, data_dir, download=True) to download them."
    )


IDX_SOURCES = {"mnist": _MNIST, "fashion-mnist": _FASHION_MNIST}


def locate_idx(dataset: str, data_dir: Path | None) -> Path:
    """The folder holding MNIST's or Fashion-MNIST's four files under ``data_dir`` (or in a
    system location); DatasetNotFoundError naming each place looked otherwise."""
    spec = ExperimentSpec.model_validate({"dataset": dataset})
    files = _locate_idx(IDX_SOURCES[dataset], spec, data_dir, False)
    return next(iter(files.values())).parent


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
    train_idx = _subset(train_idx, spec.train_subset, spec.dataset)
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
        rows={"train": train_idx, "val": val_idx, "test": np.arange(len(arrays["y_test"]))},
    )


def _load_mnist(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    return _load_idx_dataset(_MNIST, spec, data_dir, download)


def _load_fashion_mnist(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    return _load_idx_dataset(_FASHION_MNIST, spec, data_dir, download)
