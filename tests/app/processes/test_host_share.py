"""Workers on one host divide its cores among themselves without being told (issue 45):
real `corel worker` processes at the product's defaults count each other through the
database and say in their log how many threads they took and why; a run's figures do not
depend on the share (MKL's strict mode, which the workers run in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from app.jobs import workers
from harness.wait import wait_until
from tests.app.conftest import Workers, own_database
from tests.conftest import REPO

# They make no request: make test's open pass would run them unchanged.
pytestmark = pytest.mark.no_user
# Alone, not beside other tests (make test's serial pass): a worker takes fewer threads on a
# host that others keep busy, and these count the threads it takes, or time the host's load.
# The others compute (a share from given figures, a run's bits at a given thread count) and
# run beside other tests.
alone = pytest.mark.serial


def test_a_share_is_the_cpus_divided_by_the_workers_and_what_others_leave_idle() -> None:
    assert workers.share_of(2, 1).threads == 2
    assert workers.share_of(2, 2).threads == 1
    assert workers.share_of(2, 3).threads == 1  # at least one
    assert workers.share_of(8, 3).threads == 2
    assert workers.share_of(8, 3, configured=5).threads == 5  # COREL_WORKER_TORCH_THREADS
    busy = workers.share_of(2, 1, load=(1.3, 2))  # a 2-thread process beside a 1-thread worker
    assert busy.threads == 1 and "1.3 of the host's 2 kept busy" in busy.why
    assert workers.share_of(2, 1, load=(0.3, 2)).threads == 2
    assert workers.share_of(16, 2, load=(14.0, 16)).threads == 2


def test_the_cpu_allowance_follows_the_cgroup_quota(tmp_path: Path) -> None:
    mine = len(os.sched_getaffinity(0))
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert workers.cpu_allowance(quota) == mine
    quota.write_text("50000 100000\n")  # half a CPU: one thread
    assert workers.cpu_allowance(quota) == 1
    assert workers.cpu_allowance(tmp_path / "absent") == mine


@alone
def test_host_load_counts_other_processes_not_this_one(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")

    def write(busy_seconds: float) -> None:
        jiffies = int(busy_seconds * tick)
        stat.write_text(f"cpu  {jiffies} 0 0 1000 0 0 0 0 0 0\ncpu0 0 0 0 0\ncpu1 0 0 0 0\n")

    load = workers.HostLoad(stat)
    write(100.0)
    assert load.others() is None  # the first sample
    time.sleep(0.6)
    start = time.monotonic()
    write(100.0 + 2 * 0.6)  # two CPUs busy elsewhere for the last 0.6 s
    got = load.others()
    assert got is not None and got[1] == 2
    assert 1.0 < got[0] <= 2.3, (got, time.monotonic() - start)


def _log_lines(path: Path, words: str) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if words in line]


@alone
def test_two_workers_on_one_host_take_a_core_each_and_one_all_once_alone(
        settings: Settings, tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) != 2:
        pytest.skip("the figures below are those of a 2-core host (this project's machines)")
    (tmp_path / "var").mkdir()
    with own_database(settings, tmp_path / "var") as own:  # no other worker's presence in it
        assert own.worker_torch_threads == 0  # the product's default
        _two_workers(own.model_copy(update={"log_level": "INFO"}), tmp_path)


def _two_workers(own: Settings, tmp_path: Path) -> None:
    pool = Workers(own, tmp_path)
    try:
        first = pool.start(own)
        log0 = tmp_path / "worker-0.log"
        wait_until(lambda: _log_lines(log0, "torch threads: 2 (2 CPUs shared by 1 worker on this host"),
                   30, "the first worker to take both CPUs", interval=0.2,
                   detail=lambda: log0.read_text()[-3000:])
        pool.start(own)
        log1 = tmp_path / "worker-1.log"
        wait_until(lambda: (_log_lines(log0, "torch threads: 1 (2 CPUs shared by 2 workers on this host")
                            and _log_lines(log1, "torch threads: 1 (2 CPUs shared by 2 workers on this host")),
                   30, "the two workers to take a CPU each", interval=0.2, detail=pool.logs)
        # The worker's own process runs MKL in its strict mode (set by `corel worker` unless
        # the environment says otherwise).
        environ = dict(item.split("=", 1) for item in Path(f"/proc/{first.pid}/environ").read_text()
                       .split("\0") if "=" in item)
        assert environ.get("MKL_CBWR") == os.environ.get("MKL_CBWR", "AUTO,STRICT")
        # One stops: it withdraws, and the other takes the host's cores again.
        pool.stop(first)
        wait_until(lambda: _log_lines(log1, "shared by 1 worker on this host"), 30,
                   "the second worker to take both CPUs again", interval=0.2, detail=pool.logs)
    finally:
        pool.stop_all()


# Each case's two runs (one thread, two) in one process of the worker's environment, every
# case in the same process (one interpreter and torch import for all six), on 384 of digits'
# training rows: 96 steps an epoch at batches of 4 (a product that rounds apart with the
# thread count does so at its first step; all the rows took 98 s on a loaded AVX-512 EPYC).
SHARES = [("gaussian", 4), ("cosine", 4), ("cce", 4), ("center", 4), ("supcon", 4), ("cosine", 128)]
TRAIN = """
import json, sys, torch
from corel.train import fit
out = {}
for case in json.loads(sys.argv[1]):
    loss, batch = case
    out[f"{loss}-{batch}"] = runs = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        r = fit({"dataset": "digits", "epochs": 2, "batch_size": batch, "hidden": 256,
                 "lr": 1e-3, "loss": loss, "lam": 0.8, "train_subset": 384})
        runs[threads] = [[m.train_loss, m.val_accuracy] for m in r.history]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shares() -> dict[str, Any]:
    """Every case's figures at one thread and at two, computed in a process with the
    environment a worker runs in."""
    env = {**workers.worker_environ({k: v for k, v in os.environ.items()
                                     if k not in workers.WORKER_ENV_DEFAULTS}),
           "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", TRAIN, json.dumps(SHARES)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr
    got: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


@pytest.mark.parametrize(("loss", "batch"), SHARES)
def test_a_run_s_figures_do_not_depend_on_its_worker_s_share(loss: str, batch: int, shares: dict[str, Any]) -> None:
    """In the environment a worker runs in, one thread and two give the same bits, so a
    run resumed by a worker with another share ends where an uninterrupted one does. Small
    batches too: with W^T as a view, the dot and cosine heads' products of 4 to 32 rows
    rounded apart with the thread count on an AMD EPYC with AVX-512 (corel.similarity)."""
    got = shares[f"{loss}-{batch}"]
    assert got["1"] == got["2"]
