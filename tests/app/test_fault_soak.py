"""The short fault soak in `make test`: 12 runs, 8 faults (each of the six kinds at least
once, a Redis FLUSHALL first, while the queue is deep), and every accepted run must have
succeeded one minute after the last fault (beyond the time the training left then takes at
the soak's own rate: harness/soak.py), each epoch recorded once, with the figures of an
uninterrupted run, and no row left behind by a refused submission. The full soak (24 runs,
240 s of faults, three seeds) is ``bench/fault_soak.py``; the engine is harness/soak.py.
"""

from __future__ import annotations

import shutil

import pytest

from harness.servers import postgres_bin
from harness.soak import SoakConfig, run_soak
from tests.conftest import require

# Alone, not beside other tests (make test): its deadlines follow the training's pace.
# Its services are its own, in the open mode: make test-as-user would run it unchanged.
pytestmark = [pytest.mark.serial, pytest.mark.no_user]

DECK = ("redis-flush", "worker-kill", "postgres-stop", "redis-restart", "api-kill",
        "postgres-freeze", "redis-flush", "worker-kill")


def test_every_accepted_run_finishes_within_a_minute_of_the_last_fault(tmp_path):
    require(postgres_bin() is not None, "PostgreSQL's initdb and pg_ctl (postgresql package)")
    require(shutil.which("redis-server") is not None, "redis-server (redis-server package)")
    # The faults are paced by the training (the k-th once k/10 of the epochs are done, at
    # least 3-5 s after the one before): with a deck dealt every 6-10 s, the runs all
    # finished before its end on a fast machine (faster still with the fused Gaussian
    # step), while on one half as fast most of the work was still queued then. 32 epochs
    # a run (64 took 400 s here, most of make test's serial part): paced, the deck still
    # meets work queued at every fault, and about a fifth of the work is left after the
    # last. The minute after the last fault is for recovering.
    config = SoakConfig(seed=3, runs=12, epochs=32, submit_seconds=8.0, fault_seconds=400.0,
                        fault_gap=(3.0, 5.0), outage=(2.0, 5.0), deadline=60.0, wait=90.0,
                        unique_specs=4, deck=DECK, paced=True, logdir=tmp_path / "logs")
    report = run_soak(config, tmp_path)
    print(report.summary())
    assert [kind for _, kind in report.faults] == list(DECK)
    logs = ""
    if not report.ok:
        logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(config.logdir.glob("*worker*.log")))
    assert report.ok, report.summary() + "\n" + logs
    # Runs were still training when the last fault struck: recovery was exercised (seconds
    # of work left then, not ten: on a fast CPU the paced deck left 9 s of it).
    assert report.all_finished_after is not None and report.all_finished_after >= 5, report.summary()
