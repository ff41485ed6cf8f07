"""Shared fixtures: fixed seeds, and real data that must exist under CI."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# CI clones the repository with shared/ beside it.
SHARED_DATASETS = REPO.parent / "shared" / "datasets"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
IN_CI = os.environ.get("CI") == "true"


def require(ok: bool, what: str) -> None:
    """Skip when a real dependency is missing, but fail under CI=true, where it must exist."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and under CI=true that is a failure, not a skip")
    pytest.skip(f"{what} is missing")


@pytest.fixture(autouse=True)
def _fixed_seeds() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def fashion_dir() -> Path:
    require((FASHION_DIR / "train-images-idx3-ubyte.gz").exists(),
            f"Fashion-MNIST in {FASHION_DIR} (apt-get install dataset-fashion-mnist)")
    return FASHION_DIR


@pytest.fixture(scope="session")
def shared_datasets() -> Path:
    require(SHARED_DATASETS.is_dir(), f"the shared datasets folder {SHARED_DATASETS}")
    return SHARED_DATASETS
