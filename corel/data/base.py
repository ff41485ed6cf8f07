"""The Dataset every loader returns, the split constants, and the errors."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

SPLIT_SEED = 20_160_419
"""Seed of every train/validation/test split (constant: independent of ``spec.seed``)."""


VAL_FRACTION = 0.15


TEST_FRACTION = 0.15


MNIST_VAL_SIZE = 5_000


AG_NEWS_VAL_FRACTION = 0.10


DEFAULT_MAX_LEN = 64


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
    rows: dict[str, Any] | None = field(default=None, repr=False)
    """Each split's rows as positions (int64 arrays, keyed train / val / test) in the file
    the split was read from: MNIST's training file for train and val, its test file for
    test; an uploaded dataset's rows; None where the loader does not say. A nearest
    neighbour's id (the service's /neighbors) is its training row's position."""
    features_source: str | None = field(default=None, repr=False)
    """Where a frozen encoder's features (and its path's verdict) came from when loaded:
    ``computed``, ``from the store`` (another host computed them) or ``cached`` (this host's
    folder or this process's memory); None without a frozen encoder
    (:mod:`corel.encoders.kept`)."""

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
