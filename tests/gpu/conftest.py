"""Tests that need CUDA: `make test-gpu` runs them (and fails without a GPU); `make test`
skips them on a machine without one, the one skip allowed under CI=true."""

from __future__ import annotations

import os

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    if os.environ.get("COREL_REQUIRE_CUDA"):
        raise pytest.UsageError("make test-gpu: torch sees no CUDA device here")
    skip = pytest.mark.skip(reason="no CUDA device (torch.cuda.is_available() is false)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
