"""Users' arrays: an .npz of x and y (feature tables become one), and image folders stored as one."""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data.base import Dataset, DatasetNotFoundError, PathLike
from corel.data.preprocessing import (
    _image_preprocessing,
    _vector_preprocessing,
    prepare_images,
    prepare_vectors,
)
from corel.data.splits import _check_class_sizes, _resolve_user_path, _subset, split_rows
from corel.spec import ExperimentSpec


def _looks_like_text(head: bytes) -> bool:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text)


class _StreamedX:
    """What the checks read of an .npz's ``x`` (its dtype, shape and non-finite count),
    found by reading the array through once in pieces: a large upload is checked without
    being held in memory."""

    PIECE = 16 << 20

    def __init__(self, path: Path, member: str) -> None:
        with zipfile.ZipFile(path) as archive, archive.open(member) as f:
            version = np.lib.format.read_magic(f)
            header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                      else np.lib.format.read_array_header_2_0)
            shape, _, dtype = header(f)
            if dtype.hasobject:
                raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
            self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
            self.nonfinite = 0
            expected = math.prod(shape) * dtype.itemsize
            read = 0
            step = max(dtype.itemsize, self.PIECE // dtype.itemsize * dtype.itemsize)
            while piece := f.read(min(step, expected - read)):
                read += len(piece)
                if dtype.kind == "f":
                    values = np.frombuffer(piece, dtype=dtype)
                    self.nonfinite += int(np.count_nonzero(~np.isfinite(values)))
            if read != expected:
                raise EOFError(f"x holds {read} bytes of the {expected} its header announces")

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0


def _nonfinite(x: np.ndarray | _StreamedX) -> int:
    return x.nonfinite if isinstance(x, _StreamedX) else int(np.count_nonzero(~np.isfinite(x)))


def _read_npz(path: Path, stream_x: bool = False) -> tuple[Any, np.ndarray, list[str]]:
    """Validated (x, y as 0..K-1, class names) from an .npz file; with ``stream_x``, x is
    checked in pieces and comes back as its description (:class:`_StreamedX`), not its
    values."""
    if not path.is_file():
        raise DatasetNotFoundError(
            f"npz file {path} does not exist; dataset_path must name an .npz file with arrays "
            "x (N, ...) and y (N,), as written by numpy.savez(path, x=x, y=y)"
        )
    with open(path, "rb") as f:
        head = f.read(8)
    if not head.startswith((b"PK\x03\x04", b"\x93NUMPY")):
        looks = "text (a CSV? upload it as a table)" if _looks_like_text(head) else "something else"
        raise ValueError(
            f"{path} is not an .npz file: an .npz is the zip archive numpy.savez(path, x=x, "
            f"y=y) writes, and this file looks like {looks}")
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
        arrays: dict[str, Any] = {}
        for key in ("x", "y", "class_names"):
            if key not in loaded.files:
                continue
            try:
                if key == "x" and stream_x:
                    arrays[key] = _StreamedX(path, _member(loaded, key))
                else:
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
        bad = _nonfinite(x)
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


def _member(loaded: Any, key: str) -> str:
    """The archive's member that holds array ``key`` (``x.npy``)."""
    return next(name for name in loaded.zip.namelist() if name == f"{key}.npy" or name == key)


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
    otherwise. ``x`` is read through in pieces, never held whole. Summary: ``n``, ``shape`` (of one sample), ``num_features``, ``num_classes``,
    ``class_names``, ``class_counts``.
    """
    x, y, names = _read_npz(Path(path).expanduser(), stream_x=True)
    return {
        "n": len(x),
        "shape": list(x.shape[1:]),
        "num_features": math.prod(x.shape[1:]),
        "num_classes": len(names),
        "class_names": names,
        "class_counts": np.bincount(y, minlength=len(names)).tolist(),
    }


def stored_split(path: Path) -> np.ndarray | None:
    """The user's own splits of an uploaded dataset (codes 0/1/2 in an array ``split``), if any."""
    with np.load(path, allow_pickle=False) as loaded:
        return np.asarray(loaded["split"]) if "split" in loaded.files else None


def _standardize_flag(path: Path) -> bool:
    """Whether the .npz asks for standardised features (a boolean array ``standardize``)."""
    with np.load(path, allow_pickle=False) as loaded:
        return "standardize" in loaded.files and bool(np.asarray(loaded["standardize"]).any())


def _feature_names(path: Path, width: int) -> list[str] | None:
    """The feature columns' names an .npz written from a table carries (``feature_names``),
    if it has one for each of the ``width`` features."""
    with np.load(path, allow_pickle=False) as loaded:
        if "feature_names" not in loaded.files:
            return None
        names = [str(n) for n in np.asarray(loaded["feature_names"]).reshape(-1)]
    return names if len(names) == width and len(set(names)) == width else None


def _load_npz(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    if not spec.dataset_path:
        raise ValueError("dataset 'npz' needs dataset_path: an .npz file with arrays x and y")
    path = _resolve_user_path(spec.dataset_path, data_dir)
    x, y, names = _read_npz(path)
    train_idx, val_idx, test_idx = split_rows(y, names, stored_split(path), spec.val_fraction,
                                              spec.test_fraction)
    train_idx = _subset(train_idx, spec.train_subset, spec.dataset)
    preprocessing = _vector_preprocessing(tuple(x.shape[1:]))
    features = _feature_names(path, int(np.prod(x.shape[1:])))
    if features is not None:  # a table's columns: serving takes inputs by column name
        preprocessing["feature_names"] = features
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
        rows={"train": train_idx, "val": val_idx, "test": test_idx},
    )


def _load_images(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    """A user's image folder (corel.image_folders' .npz: x uint8 (N, C, H, W), y, class_names)."""
    if not spec.dataset_path:
        raise ValueError("dataset 'images' needs dataset_path: an uploaded image folder "
                         "(POST /datasets with a .zip or .tar.gz of class_name/*.png)")
    path = _resolve_user_path(spec.dataset_path, data_dir)
    x, y, names = _read_npz(path)
    if x.ndim != 4 or x.dtype != np.uint8:
        raise ValueError(f"an image dataset holds uint8 images (N, C, H, W); got {x.dtype} {x.shape}")
    channels, height, width = (int(s) for s in x.shape[1:])
    preprocessing = _image_preprocessing("images", (height, width), 255.0, channels)
    train_idx, val_idx, test_idx = split_rows(y, names, stored_split(path), spec.val_fraction,
                                              spec.test_fraction)
    train_idx = _subset(train_idx, spec.train_subset, spec.dataset)
    return Dataset(
        name="images", modality="image",
        x_train=prepare_images(x[train_idx], preprocessing), y_train=torch.from_numpy(y[train_idx]),
        x_val=prepare_images(x[val_idx], preprocessing), y_val=torch.from_numpy(y[val_idx]),
        x_test=prepare_images(x[test_idx], preprocessing), y_test=torch.from_numpy(y[test_idx]),
        class_names=names, input_shape=(channels, height, width), preprocessing=preprocessing,
        rows={"train": train_idx, "val": val_idx, "test": test_idx},
    )
