"""Where a run's tensors live: the device it is given, and its data moved there."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

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


def effective_precision(device: torch.device, precision: str) -> str:
    """The precision a run asking for ``precision`` trains in on ``device``: bf16 where the
    device can (every CPU, through autocast; a GPU that supports bfloat16), else fp32."""
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp32"
    return precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """bfloat16 autocast on ``device`` for a bf16 run (matrix products and convolutions in
    bfloat16, the rest as autocast decides); nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def device_name(device: torch.device) -> str:
    """What a run records as the device it trained on: ``cpu``, or ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return device.type
