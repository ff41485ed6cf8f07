"""scikit-learn's 8x8 digits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from corel.data.base import SPLIT_SEED, Dataset
from corel.data.preprocessing import _image_preprocessing, prepare_images
from corel.data.splits import _split_three, _subset
from corel.spec import ExperimentSpec


def _load_digits(spec: ExperimentSpec, data_dir: Path | None, download: bool) -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images)
    y = np.asarray(bunch.target, dtype=np.int64)
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
