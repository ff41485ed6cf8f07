"""scikit-learn's 8x8 digits."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np
import torch

from corel.data.base import SPLIT_SEED, Dataset
from corel.data.preprocessing import _image_preprocessing, prepare_images
from corel.data.splits import _split_three, _subset
from corel.spec import ExperimentSpec


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, its images (1797 x 8 x 8, float64) and labels, as
    ``sklearn.datasets.load_digits`` reads them (its package's ``digits.csv.gz``, the label
    the last column), without importing ``sklearn.datasets``: that import (SciPy and more)
    cost a process about a second, ten times the reading, the first time it trained on digits.
    Where the file is not where scikit-learn keeps it, ``load_digits`` itself."""
    path = _digits_file()
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return np.asarray(bunch.images), np.asarray(bunch.target, dtype=np.int64)
    with gzip.open(path, mode="rt", encoding="utf-8") as rows:
        data = np.loadtxt(rows, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def _digits_file() -> Path | None:
    """Where scikit-learn keeps digits' file (its package found, not imported)."""
    found = importlib.util.find_spec("sklearn")
    if found is None or found.origin is None:
        return None
    return Path(found.origin).parent / "datasets" / "data" / "digits.csv.gz"


def _load_digits(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    images, y = digits_arrays()
    rng = np.random.default_rng(SPLIT_SEED)
    train_idx, val_idx, test_idx = _split_three(y, rng)
    train_idx = _subset(train_idx, spec.train_subset, spec.dataset)
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
        rows={"train": train_idx, "val": val_idx, "test": test_idx},
    )
