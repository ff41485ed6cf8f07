"""worker/runner.py called in-process. A run trains on the torch threads it first started on (experiments.threads), whatever
its worker's share of the host becomes meanwhile, and resumes on them: on some CPUs torch's
float32 results depend on the thread count, and a run whose threads followed the share as
workers came and went differed from the same spec trained alone (issue 68)."""

from __future__ import annotations

import pytest
import torch

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import Experiment
from app.core.schemas import ExperimentCreate
from app.core.settings import Settings
from app.jobs import workers
from app.services.experiments import create_experiment
from app.storage import ensure
from worker import host_share, runner

SPEC = {"dataset": "digits", "epochs": 3, "batch_size": 64, "lr": 0.003}


@pytest.fixture
def factory(tmp_path, monkeypatch):
    settings = Settings(var_dir=tmp_path / "var", broker_url="memory://", artifact_gc_interval_seconds=0)
    upgrade(settings)
    mine = torch.get_num_threads()
    monkeypatch.setattr(host_share, "_current", workers.Share(2, 2, 1, "alone on the host"))
    yield ensure(make_sessionmaker(make_engine(settings.db_url)), settings), settings
    torch.set_num_threads(mine)


def _threads_per_epoch(monkeypatch, change_share_after: int | None = None) -> list[int]:
    """torch's threads at each epoch's end of the runs trained; the share drops to one
    thread (a second worker joined the host) after epoch ``change_share_after``."""
    seen: list[int] = []
    original = runner.DatabaseRecorder.on_epoch_end

    def spy(self, metrics, run):
        seen.append(torch.get_num_threads())
        if metrics.epoch == change_share_after:
            host_share._current = workers.Share(1, 2, 2, "2 CPUs shared by 2 workers on this host")
        return original(self, metrics, run)

    monkeypatch.setattr(runner.DatabaseRecorder, "on_epoch_end", spy)
    return seen


def test_a_run_keeps_its_threads_while_the_host_s_share_changes(factory, monkeypatch):
    factory, settings = factory
    with session_scope(factory) as session:
        eid = create_experiment(session, ExperimentCreate(**SPEC, loss="cosine")).id
    seen = _threads_per_epoch(monkeypatch, change_share_after=1)
    assert runner.train_experiment(eid, factory, settings) == "succeeded"
    assert seen == [2, 2, 2], seen  # it followed the share from the next batch: [2, 1, 1]
    with factory() as session:
        assert session.get(Experiment, eid).threads == 2


def test_a_run_resumes_on_the_threads_it_recorded_not_the_new_worker_s_share(factory, monkeypatch):
    factory, settings = factory
    with session_scope(factory) as session:
        row = create_experiment(session, ExperimentCreate(**SPEC, loss="gaussian", lam=0.8))
        row.threads = 2  # as a worker that had both cores recorded it when it first started
        eid = row.id
    monkeypatch.setattr(host_share, "_current", workers.Share(1, 2, 2, "2 CPUs shared by 2 workers"))
    seen = _threads_per_epoch(monkeypatch)
    assert runner.train_experiment(eid, factory, settings) == "succeeded"
    assert seen == [2, 2, 2], seen
    # A run that starts now takes the share it finds, and keeps it.
    with session_scope(factory) as session:
        fresh = create_experiment(session, ExperimentCreate(**SPEC, loss="cce")).id
    seen.clear()
    assert runner.train_experiment(fresh, factory, settings) == "succeeded"
    assert seen == [1, 1, 1], seen
    with factory() as session:
        assert session.get(Experiment, fresh).threads == 1


def test_a_run_cancelled_while_its_results_are_stored_ends_cancelled_at_the_next_split(factory, monkeypatch):
    """A cancel asked while the latent spaces are computed (a fine-tune's take a minute) ends
    the run there, serving its best checkpoint: it was ignored, and the run succeeded."""
    from app.core.models import Checkpoint, LatentSpace

    factory, settings = factory
    with session_scope(factory) as session:
        eid = create_experiment(session, ExperimentCreate(**SPEC, loss="cosine")).id
    real = runner._latent

    def then_cancel(factory_, result, y, experiment_id, split):
        out = real(factory_, result, y, experiment_id, split)
        with session_scope(factory_) as session:  # asked while the first split was stored
            session.get(Experiment, experiment_id).cancel_requested = True
        return out

    monkeypatch.setattr(runner, "_latent", then_cancel)
    assert runner.train_experiment(eid, factory, settings) == "cancelled"
    with factory() as session:
        row = session.get(Experiment, eid)
        assert (row.status, row.phase) == ("cancelled", None) and row.best_epoch >= 1
        kinds = {c.kind for c in session.query(Checkpoint).filter_by(experiment_id=eid)}
        assert "best" in kinds
        assert session.query(LatentSpace).filter_by(experiment_id=eid).count() == 0
