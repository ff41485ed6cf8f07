"""Checkpoints live in the artifact store: the rows keep digests; a run frees the resume
checkpoints it replaced; deleting runs frees what they added; a worker killed between
writing an artifact and committing its row leaves an orphan, never a row that points at
nothing, and gc removes it; the download streams from the store with Range and ETag."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import Checkpoint, LatentSpace, utcnow
from app.core.schemas.experiments import ExperimentCreate
from app.core.settings import Settings
from app.main import create_app
from app.services.experiments import create_experiment, delete_experiment
from app.storage import ensure, make_store
from app.storage.refs import referenced
from tests.conftest import REPO
from worker.runner import train_experiment

pytestmark = pytest.mark.no_user

SPEC = {"dataset": "digits", "epochs": 3, "batch_size": 64, "lr": 0.003}


def folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture
def settings(tmp_path) -> Settings:
    s = Settings(var_dir=tmp_path / "var", broker_url="memory://", artifact_gc_interval_seconds=0,
                 lease_seconds=1.0, heartbeat_seconds=0.25)
    upgrade(s)
    return s


def test_a_run_keeps_what_its_rows_reference_and_deleting_frees_it(settings):
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    store = make_store(settings)
    before = folder_size(settings.var_dir)
    with session_scope(factory) as session:
        ids = [create_experiment(session, ExperimentCreate(**SPEC, loss=loss)).id
               for loss in ("gaussian", "cosine", "cce")]
    for eid in ids:
        assert train_experiment(eid, factory, settings) == "succeeded"
    with factory() as session:
        checkpoints = set(session.scalars(select(Checkpoint.sha256)))
        # The best of each run: earlier epochs' resume checkpoints freed as each replaced the
        # one before, and the last one at the run's success (no one resumes a finished run).
        assert len(checkpoints) == 3
        assert set(session.scalars(select(Checkpoint.kind))) == {"best"}
        latents = set(session.scalars(select(LatentSpace.representations_sha256)))
        assert len(latents) == 9  # three splits of each run
        digests = referenced(session)
        assert checkpoints | latents <= digests
        # Asked about given digests (one query over every column, in parts), it finds each of
        # them, in whichever column names it, and nothing that no row names.
        assert referenced(session, [*digests, *(f"{i:064x}" for i in range(300))]) == digests
        assert all(referenced(session, [d]) == {d} for d in digests)
    assert {d for d, _, _ in store.listing()} == digests  # nothing else: no orphan
    added = folder_size(settings.var_dir) - before
    assert added > 0

    with session_scope(factory) as session:
        for eid in ids:
            delete_experiment(session, eid)
    assert list(store.listing()) == []
    freed = (before + added - folder_size(settings.var_dir)) / added
    assert freed >= 0.9, f"deleting freed {freed:.0%} of the {added:,} bytes the runs added"


CRASH = """
import os, sys
from app.core.db import make_engine, make_sessionmaker
from app.core.settings import Settings
from worker import runner

def crash(*args, **kwargs):  # the artifact is written; the process dies before the row
    os._exit(17)

runner._upsert_checkpoint = crash
settings = Settings()
runner.train_experiment(int(sys.argv[1]), make_sessionmaker(make_engine(settings.db_url)), settings)
"""


def env_of(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COREL_")}
    env.update(COREL_VAR_DIR=str(settings.var_dir), COREL_BROKER_URL="memory://",
               PYTHONPATH=str(REPO))
    return env


def test_a_worker_killed_between_artifact_and_row_leaves_an_orphan_gc_removes(settings):
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    store = make_store(settings)
    with session_scope(factory) as session:
        kept, crashed = (create_experiment(session, ExperimentCreate(**SPEC, loss="cosine")).id
                         for _ in range(2))
    assert train_experiment(kept, factory, settings) == "succeeded"
    done = subprocess.run([sys.executable, "-c", CRASH, str(crashed)], env=env_of(settings),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 17, done.stderr[-2000:]

    with factory() as session:
        rows = referenced(session)
        crashed_rows = session.scalars(select(Checkpoint).where(
            Checkpoint.experiment_id == crashed)).all()
    assert crashed_rows == []  # no row at all, let alone one that points at nothing
    stored = {d for d, _, _ in store.listing()}
    assert rows <= stored and len(stored - rows) == 1  # the orphan

    gc = [sys.executable, "-m", "corel.cli", "gc"]
    spared = subprocess.run(gc, env=env_of(settings), cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert spared.returncode == 0, spared.stderr
    assert "removed 0 artifacts" in spared.stdout and "1 younger than 3600 s" in spared.stdout
    removed = subprocess.run([*gc, "--grace", "0"], env=env_of(settings), cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert removed.returncode == 0, removed.stderr
    assert "removed 1 artifacts" in removed.stdout, removed.stdout
    assert {d for d, _, _ in store.listing()} == rows
    # Once its lease has run out, the killed run is trained again, from the start.
    time.sleep(1.5)
    assert train_experiment(crashed, factory, settings) == "succeeded"


def test_the_checkpoint_download_streams_with_range_and_etag(settings):
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    with session_scope(factory) as session:
        eid = create_experiment(session, ExperimentCreate(**SPEC, loss="gaussian")).id
    assert train_experiment(eid, factory, settings) == "succeeded"
    with TestClient(create_app(settings)) as client:
        whole = client.get(f"/experiments/{eid}/checkpoint")
        assert whole.status_code == 200
        digest = hashlib.sha256(whole.content).hexdigest()
        assert whole.headers["etag"] == f'"{digest}"'
        assert whole.headers["x-checkpoint-sha256"] == digest
        assert whole.headers["accept-ranges"] == "bytes"
        part = client.get(f"/experiments/{eid}/checkpoint", headers={"Range": "bytes=100-199"})
        assert part.status_code == 206
        assert part.content == whole.content[100:200]
        assert part.headers["content-range"] == f"bytes 100-199/{len(whole.content)}"
        # A corrupt artifact is refused, never served.
        path = make_store(settings).local_path(digest)
        path.write_bytes(b"x" + whole.content[1:])
        os.utime(path, ns=(1, 1))
        refused = client.get(f"/experiments/{eid}/checkpoint")
        assert refused.status_code == 500
        assert refused.json()["error"] == "artifact_corrupt", refused.text
        assert "not served" in refused.json()["detail"]


def test_a_frozen_encoder_s_features_pass_shows_its_phase_and_the_tail_its_own(settings, tmp_path,
                                                                              monkeypatch):
    """A run over a frozen encoder shows 'computing features' (how many rows of how many)
    while its features are computed, clears it at the first batch, shows 'storing results'
    after its last epoch, and ends with no phase."""
    from app.core.models import Experiment
    from app.services import encoders
    from tests.encoder_files import timm_weights
    from worker import runner

    shown: list[tuple[str | None, str | None]] = []
    real = runner.show_phase

    def record(factory, ids, phase, detail=None):
        shown.append((phase, detail))
        real(factory, ids, phase, detail)

    monkeypatch.setattr(runner, "show_phase", record)
    # Every report written, not two a second: a split computed within half a second (the
    # validation split's 270 rows on a fast CPU) was otherwise never named (seen in CI).
    monkeypatch.setattr(runner, "PHASE_EVERY_SECONDS", 0.0)
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    weights = timm_weights(tmp_path / "w.safetensors", arch="test_convnext")
    with session_scope(factory) as session:
        enc = encoders.create_encoder(session, settings, "w.safetensors", "timm", weights,
                                      "test_convnext", None).id
        eid = create_experiment(session, ExperimentCreate(
            dataset="digits", encoder_id=enc, epochs=2, batch_size=64, lr=0.01, hidden=16)).id
    assert train_experiment(eid, factory, settings) == "succeeded"
    phases = [p for p, _ in shown]
    first = phases.index(None)
    assert set(phases[:first]) == {"computing features"}, shown
    counts = []  # (split, done, total) of each report: "<encoder> (<split> split) features of D of T rows"
    # First, while the encoder loads and its CPU path is chosen (it said nothing then).
    assert shown[0] == ("computing features", "loading timm:test_convnext and choosing its features' CPU path"), shown
    for _, detail in shown[1:first]:
        split = detail.split(" split) ")[0].rsplit("(", 1)[1]
        done, _, total, _ = detail.split(" features of ")[1].replace(",", "").split()
        counts.append((split, int(done), int(total)))
    assert all(0 < done <= total == 1797 for _, done, total in counts), counts  # digits, every row
    # One count over the dataset (it started again at each split), each report naming its split.
    assert [d for _, d, _ in counts] == sorted(d for _, d, _ in counts) and counts[-1][1] == 1797, counts
    assert [s for s, _, _ in counts] == sorted((s for s, _, _ in counts),
                                               key=["train", "validation", "test"].index), counts
    assert {s for s, _, _ in counts} == {"train", "validation", "test"}, counts
    assert set(phases[first + 1:]) == {"storing results"}, shown
    with factory() as session:
        row = session.get(Experiment, eid)
        assert row.phase is None and row.phase_detail is None


def test_a_slow_checkpoint_write_keeps_the_run_s_lease(settings, monkeypatch):
    """Writing a checkpoint that takes longer than the lease (a large model, an S3 outage
    waited out): the run's heartbeat stays fresh meanwhile, so no other worker may take it
    over, and the run ends as it would have. A lease of one second (the session's is four);
    the first two writes wait 2.5 s each (each of the twelve waited 10 s before: 30 s)."""
    from app.core.models import Experiment
    from app.storage import LocalStore

    settings = settings.model_copy(update={"lease_seconds": 1.0, "heartbeat_seconds": 0.1})
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    with session_scope(factory) as session:
        eid = create_experiment(session, ExperimentCreate(**{**SPEC, "epochs": 2}, loss="cosine")).id
    ages: list[float] = []
    real = LocalStore.put_bytes

    def slow(self, data):
        if len(ages) < 2:  # the first two writes (the epochs' checkpoints); twelve in all
            time.sleep(2.5 * settings.lease_seconds)
        with factory() as session:
            beat = session.get(Experiment, eid).heartbeat_at
        ages.append((utcnow() - beat.replace(tzinfo=utcnow().tzinfo)).total_seconds())
        return real(self, data)

    monkeypatch.setattr(LocalStore, "put_bytes", slow)
    assert train_experiment(eid, factory, settings) == "succeeded"
    assert len(ages) > 2 and max(ages) < settings.lease_seconds, ages
