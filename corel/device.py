"""Where a run's tensors live: the device it is given, and its data moved there."""

from __future__ import annotations

import copy

import torch

from corel.data import Dataset

SPLITS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The given device, else CUDA when this machine has a GPU, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def to_device(data: Dataset, device: torch.device) -> Dataset:
    """``data`` with every split on ``device`` (the same object on the CPU)."""
    if device.type == "cpu":
        return data
    moved = copy.copy(data)
    for name in SPLITS:
        setattr(moved, name, getattr(data, name).to(device))
    return moved

