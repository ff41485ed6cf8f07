"""worker/runner.py called in-process. A run trains on the torch threads it first started on (experiments.threads), whatever
its worker's share of the host becomes meanwhile, and resumes on them: on some CPUs torch's
float32 results depend on the thread count, and a run whose threads followed the share as
workers came and went differed from the same spec trained alone (issue 68)."""

from __future__ import annotations

import re

import pytest
import torch

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import Experiment
from app.core.schemas.experiments import ExperimentCreate
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


def test_a_run_on_another_host_reads_the_features_from_the_store_and_computes_none(tmp_path, monkeypatch):
    """Issue 70: a frozen encoder's features go into the artifact store. Two worker hosts
    (each its own var_dir, so its own features folder) on one database and store: the first
    run computes the features and records "computed"; a run on the second host, in a process
    that holds none in memory, reads them from the store, computes none, and records "from
    the store". corel gc drops kept features unused for COREL_FEATURES_KEEP_DAYS, and their
    bytes with them."""
    from collections import OrderedDict

    from app.core.models import FeatureSet
    from app.services.datasets import create_upload
    from app.storage import store_of
    from app.storage.refs import collect
    from corel.encoders import features as cache
    from tests.encoder_files import TOPICS

    shared = {"database_url": f"sqlite:///{tmp_path / 'corel.sqlite3'}", "artifacts_dir": tmp_path / "artifacts",
              "broker_url": "memory://", "artifact_gc_interval_seconds": 0, "chance_epochs": 0}
    host_a, host_b = (Settings(var_dir=tmp_path / name, **shared) for name in ("a", "b"))
    upgrade(host_a)
    factory = ensure(make_sessionmaker(make_engine(host_a.db_url)), host_a)
    monkeypatch.setattr(host_share, "_current", workers.Share(2, 2, 1, "alone on the host"))
    table = tmp_path / "topics.csv"
    rows = [f"{sentence} ({i}),{topic}" for topic, sentences in TOPICS.items() for i in range(12)
            for sentence in sentences[i % 4 : i % 4 + 1]]
    table.write_text("text,topic\n" + "\n".join(rows) + "\n")
    with session_scope(factory) as session:
        dataset_id = create_upload(session, "topics.csv", "text", table).id
    spec = {"dataset": "text", "dataset_id": dataset_id, "encoder": "wordllama", "epochs": 2, "batch_size": 8,
            "hidden": 16, "lr": 1e-3}

    real_show = runner.show_phase
    phases: list[tuple[str | None, str | None]] = []

    def show(factory_, ids, phase, detail=None):
        phases.append((phase, detail))
        real_show(factory_, ids, phase, detail)

    monkeypatch.setattr(runner, "show_phase", show)

    def train(settings: Settings, **fields) -> dict:
        with session_scope(factory) as session:
            eid = create_experiment(session, ExperimentCreate(**spec, **fields)).id
        monkeypatch.setattr(cache, "_MEMO", OrderedDict())  # a new worker process: nothing in memory
        before = cache.COMPUTED["texts"]
        phases.clear()
        status = runner.train_experiment(eid, factory, settings)
        with factory() as session:
            row = session.get(Experiment, eid)
            assert status == "succeeded", row.error
            return {"features": row.features, "computed": cache.COMPUTED["texts"] - before,
                    "phases": [p for p, _ in phases], "details": [d for _, d in phases]}

    first = train(host_a, loss="cosine")
    assert first["computed"] == len(rows) and first["features"]["source"] == "computed", first
    assert "computing features" in first["phases"] and "reading features" not in first["phases"], first
    with factory() as session:
        kept = {row.name: row.sha256 for row in session.query(FeatureSet)}
    splits = sorted(name for name in kept if name.endswith(".npy"))
    assert len(splits) == 3, kept  # one a split
    second = train(host_b, loss="gaussian", lam=0.8)
    assert second["computed"] == 0 and second["features"]["source"] == "from the store", second
    # The phase said so while the worker read them, and was cleared at the first batch.
    shown = list(zip(second["phases"], second["details"], strict=True))
    assert second["phases"].count("reading features") == 3, second
    assert all(re.fullmatch(r"features \([\d.]+ kB\) from the artifact store", d)
               for p, d in shown if p == "reading features"), second
    # Nothing computed: "computing features" only named the encoder's load, no row counted.
    assert not any(p == "computing features" and "features of" in d for p, d in shown), second
    assert second["phases"][second["phases"].index("reading features") + 3] is None, second
    # Host b keeps them in its own folder now, byte for byte host a's.
    for name in splits:
        assert (tmp_path / "b" / "features" / name).read_bytes() == (tmp_path / "a" / "features" / name).read_bytes()
    assert train(host_b, loss="cce")["features"]["source"] == "cached"  # its folder, next time
    # Collected like any other artifact: kept while used, dropped once unused past the days.
    with factory() as session:
        store = store_of(session)
        collect(session, store, 0, features_keep_seconds=host_a.features_keep_days * 86400.0)
        assert session.query(FeatureSet).count() == len(kept)
        assert all(store.exists(digest) for digest in kept.values())
        collect(session, store, 0, features_keep_seconds=0)
        assert session.query(FeatureSet).count() == 0
        assert not any(store.exists(digest) for digest in kept.values())


def test_a_pruned_group_lost_between_an_epoch_and_its_rung_is_judged_there_when_it_resumes(factory, monkeypatch):
    """The fault soak's lost rung: the group's epoch 2 (a rung) was recorded, and the database
    went away before the rung's decisions were; the group resumed from epoch 2 and judged
    nothing until epoch 6. Resumed, it judges rung 2 first, and ends as the library's
    uninterrupted pruned group; a group resumed after the decisions were recorded (the
    survivors) does not judge it again."""
    import sqlalchemy.exc

    from app.core.schemas.sweeps import SweepCreate
    from app.services.sweeps import create_sweep
    from corel.spec import ExperimentSpec
    from corel.train import fit_group

    factory, settings = factory
    prune = {"metric": "val_accuracy", "eta": 3, "min_epochs": 2}
    base = {**SPEC, "epochs": 6, "loss": "cosine"}
    lams = [0.1, 0.3, 0.5, 0.7, 0.85, 0.95]
    with session_scope(factory) as session:
        _, (ids,) = create_sweep(session, SweepCreate(base=base, grid={"lam": lams}, prune=prune), 64, 64, settings)
    real = runner.GroupRecorder.on_prune
    calls: list[int] = []

    def database_gone_once(self, group, kept, why, rung):
        calls.append(rung)
        if len(calls) == 1:
            raise sqlalchemy.exc.OperationalError("UPDATE experiments", {}, Exception("server closed the connection"))
        return real(self, group, kept, why, rung)

    monkeypatch.setattr(runner.GroupRecorder, "on_prune", database_gone_once)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        runner.train_group(ids, factory, settings)
    with factory() as session:
        assert {session.get(Experiment, i).status for i in ids} == {"running"}
        assert {session.get(Experiment, i).current_epoch for i in ids} == {2}
    outcome = runner.train_group(ids, factory, settings)  # the redelivery, from epoch 2
    assert calls == [2, 2], calls  # rung 2 judged again on the resume (6 epochs: the only rung)
    whole = fit_group([ExperimentSpec(**base, lam=lam) for lam in lams], prune=prune)
    with factory() as session:
        rows = [session.get(Experiment, i) for i in ids]
        assert [(r.status, r.pruned and r.pruned["rung"]) for r in rows] == [
            ("succeeded", None) if w.pruned is None else ("pruned", w.pruned["rung"]) for w in whole], outcome


def _resume_commits(monkeypatch) -> list[tuple[int, int]]:
    """(experiment, epoch) of each resume checkpoint the runner writes from now on."""
    committed: list[tuple[int, int]] = []
    real_upsert = runner._upsert_checkpoint

    def upsert(session, experiment_id, kind, epoch, art):
        if kind == "resume":
            committed.append((experiment_id, epoch))
        return real_upsert(session, experiment_id, kind, epoch, art)

    monkeypatch.setattr(runner, "_upsert_checkpoint", upsert)
    return committed


def _run_rows(factory, eid: int) -> list[tuple]:
    from app.core.models import EpochMetric

    with factory() as session:
        rows = session.query(EpochMetric).filter_by(experiment_id=eid).order_by(EpochMetric.epoch).all()
        return [(r.epoch, r.train_loss, r.val_accuracy) for r in rows]


def test_short_epochs_commit_together_and_a_run_lost_with_epochs_held_resumes_from_its_last_commit(factory, monkeypatch):
    """COREL_EPOCH_COMMIT_SECONDS: an epoch that ends within it of the last commit is held,
    and written with the next commit (its row, the run's figures, the resume checkpoint of
    the last epoch held); the last epoch always commits. A run whose database went away with
    epochs held resumes from the last commit's checkpoint, trains those epochs again, and
    ends with the rows and result of a run that committed every epoch."""
    import sqlalchemy.exc

    factory, settings = factory
    spec = {**SPEC, "epochs": 5, "loss": "cosine"}
    committed = _resume_commits(monkeypatch)
    with session_scope(factory) as session:
        every, held = (create_experiment(session, ExperimentCreate(**spec)).id for _ in range(2))
    each = settings.model_copy(update={"epoch_commit_seconds": 0.0})
    assert runner.train_experiment(every, factory, each) == "succeeded"
    assert [e for i, e in committed if i == every] == [1, 2, 3, 4, 5]

    # Held for an hour: epoch 2 is made to commit (as if a second had passed), epochs 3 and 4
    # are held when the database goes away.
    hour = settings.model_copy(update={"epoch_commit_seconds": 3600.0})
    real_end = runner.DatabaseRecorder.on_epoch_end
    lost: list[int] = []

    def on_epoch_end(self, metrics, run):
        if metrics.epoch == 2:
            self.last_commit = float("-inf")
        stop = real_end(self, metrics, run)
        if metrics.epoch == 4 and not lost:
            lost.append(4)
            raise sqlalchemy.exc.OperationalError("INSERT INTO epoch_metrics", {}, Exception("server closed the connection"))
        return stop

    monkeypatch.setattr(runner.DatabaseRecorder, "on_epoch_end", on_epoch_end)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        runner.train_experiment(held, factory, hour)
    assert [e for i, e in committed if i == held] == [2]
    assert [r[0] for r in _run_rows(factory, held)] == [1, 2]
    with factory() as session:
        row = session.get(Experiment, held)
        assert (row.status, row.current_epoch) == ("running", 2)
    assert runner.train_experiment(held, factory, hour) == "succeeded"  # the redelivery, from epoch 2
    assert [e for i, e in committed if i == held] == [2, 5]  # epochs 3 and 4 held, 5 the last
    assert _run_rows(factory, held) == _run_rows(factory, every)
    with factory() as session:
        a, b = session.get(Experiment, every), session.get(Experiment, held)
        assert (b.current_epoch, b.best_epoch, b.test_accuracy) == (a.current_epoch, a.best_epoch, a.test_accuracy)
        assert b.train_seconds > 0


def test_a_run_that_fails_with_epochs_held_records_them_as_a_run_committing_each_epoch(factory):
    """A run the guard fails (Gaussian-COREL at lam 0.3 diverges) ends failed with every epoch
    it trained on record, the one it failed at among them, whether its epochs were held or
    committed each."""
    factory, settings = factory
    spec = {**SPEC, "epochs": 10, "loss": "gaussian", "lam": 0.3}
    with session_scope(factory) as session:
        every, held = (create_experiment(session, ExperimentCreate(**spec)).id for _ in range(2))
    assert runner.train_experiment(every, factory, settings.model_copy(update={"epoch_commit_seconds": 0.0})) == "failed"
    assert runner.train_experiment(held, factory, settings.model_copy(update={"epoch_commit_seconds": 3600.0})) == "failed"
    rows = _run_rows(factory, held)
    assert rows == _run_rows(factory, every) and 1 <= len(rows) < 10
    with factory() as session:
        a, b = session.get(Experiment, every), session.get(Experiment, held)
        assert b.current_epoch == a.current_epoch == rows[-1][0] and b.error == a.error


def test_a_stopping_worker_commits_the_epochs_it_holds_before_it_hands_the_run_back(factory, monkeypatch):
    """A worker told to stop hands its run back at the next epoch's end with every epoch it
    trained recorded, the held ones too, and its checkpoint at that epoch: the next worker
    trains on from there, each epoch once, to the figures of a run without a break."""
    factory, settings = factory
    spec = {**SPEC, "epochs": 5, "loss": "cosine"}
    with session_scope(factory) as session:
        every, held = (create_experiment(session, ExperimentCreate(**spec)).id for _ in range(2))
    assert runner.train_experiment(every, factory, settings.model_copy(update={"epoch_commit_seconds": 0.0})) == "succeeded"
    hour = settings.model_copy(update={"epoch_commit_seconds": 3600.0})
    real_end = runner.DatabaseRecorder.on_epoch_end

    def on_epoch_end(self, metrics, run):
        if metrics.epoch == 3:
            runner.STOPPING.set()  # SIGTERM's warm shutdown, as the epoch ends
        return real_end(self, metrics, run)

    monkeypatch.setattr(runner.DatabaseRecorder, "on_epoch_end", on_epoch_end)
    try:
        assert runner.train_experiment(held, factory, hour) == runner.HANDED_BACK
    finally:
        runner.STOPPING.clear()
    with factory() as session:
        row = session.get(Experiment, held)
        assert (row.status, row.current_epoch) == ("queued", 3)
    assert [r[0] for r in _run_rows(factory, held)] == [1, 2, 3]
    assert runner.train_experiment(held, factory, hour) == "succeeded"
    assert _run_rows(factory, held) == _run_rows(factory, every)


def test_a_stacked_group_s_epochs_commit_together_and_at_its_sweep_s_rungs(factory, monkeypatch):
    """A stacked group holds its members' epochs as a run does: held for an hour, a group
    commits at its last epoch, and a pruned sweep's group at its rungs too (a group resumed
    there is judged where the uninterrupted one was); the members' rows, states and results
    are those of the same sweep committing every epoch."""
    from app.core.schemas.sweeps import SweepCreate
    from app.services.sweeps import create_sweep

    factory, settings = factory
    committed = _resume_commits(monkeypatch)
    base = {**SPEC, "epochs": 6, "loss": "cosine"}
    lams = [0.3, 0.7, 0.95]  # pruned: one of the three goes on at rung 2
    prune = {"metric": "val_accuracy", "eta": 3, "min_epochs": 2}
    sweeps = {}
    for every in (True, False):
        for pruned in (False, True):
            with session_scope(factory) as session:
                body = SweepCreate(base=base, grid={"lam": lams}, prune=prune if pruned else None)
                _, (ids,) = create_sweep(session, body, 64, 64, settings)
            commit = settings.model_copy(update={"epoch_commit_seconds": 0.0 if every else 3600.0})
            runner.train_group(ids, factory, commit)
            sweeps[every, pruned] = ids
    for pruned in (False, True):
        held, each = sweeps[False, pruned], sweeps[True, pruned]
        with factory() as session:
            got = [session.get(Experiment, i) for i in held]
            want = [session.get(Experiment, i) for i in each]
            assert [(r.status, r.current_epoch, r.best_epoch, r.test_accuracy, r.pruned) for r in got] == [
                (r.status, r.current_epoch, r.best_epoch, r.test_accuracy, r.pruned) for r in want]
        for a, b in zip(held, each, strict=True):
            assert _run_rows(factory, a) == _run_rows(factory, b)
        # Held: the survivors commit at rung 2 and at the last epoch; those pruned at 2 only.
        epochs = {i: [e for j, e in committed if j == i] for i in held}
        with factory() as session:
            status = {i: session.get(Experiment, i).status for i in held}
        if pruned:
            assert {tuple(epochs[i]) for i in held if status[i] == "pruned"} == {(2,)}
            assert {tuple(epochs[i]) for i in held if status[i] == "succeeded"} == {(2, 6)}
            assert "succeeded" in status.values() and "pruned" in status.values()
        else:
            assert {tuple(epochs[i]) for i in held} == {(6,)} and set(status.values()) == {"succeeded"}
        with factory() as session:
            for i in each:  # committing every epoch, as before
                assert [e for j, e in committed if j == i] == list(range(1, session.get(Experiment, i).current_epoch + 1))
