"""Shared fixtures: fixed seeds, and real data that must exist under CI."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from app.jobs.workers import WORKER_ENV_DEFAULTS

# As every worker process runs (app/jobs/workers.py): MKL's products the same bits for
# any number of threads, so that a run trained in a test equals one that a worker trained
# on its share of the cores (MKL reads this at its first call). `make test`'s first pass of
# tests/corel sets a mode of its own.
for _name, _value in WORKER_ENV_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

# Under pytest-xdist (make test: two processes on this 2-core machine) each process computes
# on one thread: two processes of two threads each ran the library's tests several times
# slower than one process alone (OpenMP's threads waiting on cores the other holds). The
# workers the tests start choose their own share of the host (app/jobs/workers.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    # And the other thread pools in the process: numpy's and SciPy's OpenBLAS and
    # scikit-learn's OpenMP, whose threads spin as torch's did (a self-training test of
    # scikit-learn's fits took 3.3 s alone and 12.9 s in the main pass, 39.3 in the kernel
    # pass, on the AVX2-only EPYC). Held for the whole process.
    threadpool_limits(1)
    # And so, unless they choose their own count, do the programs the tests start (a
    # benchmark's, a launch's, a server's; a worker takes its share of the host itself,
    # worker/host_share.py): a smoke run of two threads beside a busy process took 34 s,
    # on one thread 25 (bench/fewshot.py on the AVX-512 EPYC).
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_name, "1")

# After each pass, what the tests started and left running fails the run (tests/leftovers.py).
pytest_plugins = ["tests.leftovers"]

REPO = Path(__file__).resolve().parents[1]
# CI clones the repository with shared/ beside it.
SHARED_DATASETS = REPO.parent / "shared" / "datasets"
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
IN_CI = os.environ.get("CI") == "true"
# The cluster's tests build network namespaces, as root: `make test-cluster` runs them.
collect_ignore = [] if os.environ.get("COREL_TEST_CLUSTER") else ["cluster"]


def require(ok: bool, what: str) -> None:
    """Skip when a real dependency is missing, but fail under CI=true, where it must exist."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and under CI=true that is a failure, not a skip")
    pytest.skip(f"{what} is missing")


def assert_rows_close(got: Any, want: Any, rtol: float = 1e-5, err_msg: str = "") -> None:
    """float32 representations (or similarities) of the same inputs, computed in other
    batches, thread slices or processes, whose products may round differently.

    Rounding in a dot product scales with its terms, not with its result, so an entry
    near zero is held to its row's scale: |got - want| <= rtol * max |row of want|.
    rtol 1e-5 is ~80 float32 epsilons, room for any summation order of these layers.
    """
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = np.abs(want).max(axis=-1, keepdims=True)
    bound = np.broadcast_to(rtol * scale + np.finfo(np.float32).tiny, want.shape)
    np.testing.assert_array_less(np.abs(got - want), bound, err_msg=err_msg)


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


# Spread across processes (`make test` runs pytest-xdist with --dist loadgroup): each test
# file's tests on one process, so that its module fixtures (a trained run, a browser) are
# made once, except the benchmarks' smoke runs, each a program of its own, which spread.
SPREAD_ONE_BY_ONE = {"tests/app/stack/test_bench_smoke.py", "tests/test_bench_cnn_rows.py"}


# make test's serial pass collects this folder alone (collecting the whole suite for its 15
# tests took 17 s of it); a test marked `serial` elsewhere would run in no pass.
SERIAL_FOLDER = "tests/app/processes/"


def misplaced_serial(items: list[tuple[str, bool]]) -> list[str]:
    """The node ids of ``(node id, marked serial)`` pairs marked serial outside SERIAL_FOLDER."""
    return [nodeid for nodeid, serial in items if serial and not nodeid.startswith(SERIAL_FOLDER)]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = misplaced_serial([(item.nodeid, item.get_closest_marker("serial") is not None) for item in items])
    if misplaced:
        raise pytest.UsageError(f"{misplaced}: a test marked serial belongs in {SERIAL_FOLDER} "
                                "(make test's serial pass collects that folder alone)")
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(item.nodeid if path in SPREAD_ONE_BY_ONE else path))
    # The longest work first, so that the pass does not end on one process while the other
    # waits (make test passes --no-loadscope-reorder: xdist then hands the groups out in this
    # order): the benchmarks' programs (10-40 s each), then the groups of most tests first,
    # as xdist's own order would have them. By that order alone the benchmarks, groups of one
    # test, came last.
    spread = [item for item in items if item.nodeid.split("::")[0] in SPREAD_ONE_BY_ONE]
    rest = [item for item in items if item.nodeid.split("::")[0] not in SPREAD_ONE_BY_ONE]
    sizes: dict[str, int] = {}
    for item in rest:
        sizes[_group(item)] = sizes.get(_group(item), 0) + 1
    items[:] = spread + sorted(rest, key=lambda item: -sizes[_group(item)])


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    assert marker is not None  # (every item has one, above)
    return str(marker.args[0])
