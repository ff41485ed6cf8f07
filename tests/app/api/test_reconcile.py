"""The reconciler on the embedded default's SQLite, whose timestamps come back without an
offset. (On PostgreSQL the fault tests exercise it.) It used to fail every round there
with "can't subtract offset-naive and offset-aware datetimes", so a run lost by a
killed worker was never sent again."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import update

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import Experiment, utcnow
from app.core.schemas.experiments import ExperimentCreate
from app.core.settings import Settings
from app.jobs.broker import TRAIN_TASK
from app.jobs.lifecycle import reconcile
from app.services.experiments import create_experiment


def test_lost_runs_are_sent_again_on_sqlite(tmp_path):
    settings = Settings(var_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/corel.sqlite3",
                        broker_url="memory://")
    upgrade(settings)
    factory = make_sessionmaker(make_engine(settings.db_url))
    hour_ago = utcnow() - timedelta(hours=1)
    with session_scope(factory) as session:
        ids = [create_experiment(session, ExperimentCreate(dataset="digits", seed=i)).id
               for i in range(3)]
    stale_queued, dead_running, fresh = ids
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(Experiment.id == stale_queued)
                        .values(enqueued_at=hour_ago, enqueues=1))
        session.execute(update(Experiment).where(Experiment.id == dead_running)
                        .values(status="running", heartbeat_at=hour_ago, enqueued_at=hour_ago))
        session.execute(update(Experiment).where(Experiment.id == fresh)
                        .values(enqueued_at=utcnow(), enqueues=1))
    sent: list[int] = []

    def send(task: str, experiment_id: int) -> None:
        assert task == TRAIN_TASK
        sent.append(experiment_id)

    def rounds() -> list[int]:
        return sorted(i for _, i in reconcile(factory, settings, send))

    assert rounds() == [stale_queued, dead_running]
    assert sorted(sent) == [stale_queued, dead_running]
    # Both were sent just now: not again in the next round, though the worker is still dead.
    assert rounds() == []
    # Once the delay has passed (the copy is still waiting its turn), again.
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(Experiment.id.in_([stale_queued, dead_running]))
                        .values(enqueued_at=hour_ago))
    assert rounds() == [stale_queued, dead_running]
    # Sent, claimed by a worker that reported after the send, then died: sent at once
    # when its lease has run out, whatever the delay.
    lease = settings.lease_seconds
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(Experiment.id == dead_running).values(
            enqueued_at=utcnow() - timedelta(seconds=lease + 10),
            heartbeat_at=utcnow() - timedelta(seconds=lease + 1), enqueues=5))
    assert rounds() == [dead_running]


def test_the_loop_wakes_when_the_next_lease_runs_out(tmp_path):
    """next_lease_expiry: the seconds until the earliest live lease expires, over every kind
    of job (a run and an index build here); leases already out, and finished jobs, do not
    count; None when nothing runs."""
    from app.core.models import NeighborIndex
    from app.jobs.lifecycle import next_lease_expiry

    settings = Settings(var_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/corel.sqlite3",
                        broker_url="memory://", lease_seconds=10.0)
    upgrade(settings)
    factory = make_sessionmaker(make_engine(settings.db_url))
    with session_scope(factory) as session:
        ids = [create_experiment(session, ExperimentCreate(dataset="digits", seed=i)).id for i in range(3)]
    assert next_lease_expiry(factory, settings) is None  # nothing runs
    now = utcnow()
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(Experiment.id == ids[0]).values(
            status="running", heartbeat_at=now - timedelta(seconds=3)))  # out in about 7 s
        session.execute(update(Experiment).where(Experiment.id == ids[1]).values(
            status="running", heartbeat_at=now - timedelta(seconds=30)))  # out already
        session.execute(update(Experiment).where(Experiment.id == ids[2]).values(
            status="succeeded", heartbeat_at=now - timedelta(seconds=9)))  # finished
    wait = next_lease_expiry(factory, settings)
    assert wait is not None and 6.0 < wait <= 7.0, wait
    with session_scope(factory) as session:
        session.add(NeighborIndex(experiment_id=ids[0], source="train", requested_kind="auto",
                                  geometry="euclidean", status="running", n_total=1, n_done=0,
                                  cancel_requested=False, created_at=now, attempts=1, worker="w",
                                  heartbeat_at=now - timedelta(seconds=8)))  # out in about 2 s
    wait = next_lease_expiry(factory, settings)
    assert wait is not None and 1.0 < wait <= 2.0, wait


def test_a_claimed_run_keeps_its_lease_until_its_first_batch(tmp_path):
    """From the claim to the first batch (a download, the data's load, the model's build, a
    cold process's first step) the training loop cannot beat; on a loaded machine that can
    outlast the lease, and another worker took the run over. A LeaseKeeper beats for it
    meanwhile, and stops at the first batch, where the loop's own beats take over."""
    import time

    from app.jobs.lifecycle import WORKER_ID
    from worker.runner import DatabaseRecorder, LeaseKeeper

    settings = Settings(var_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/corel.sqlite3",
                        broker_url="memory://", lease_seconds=0.6, heartbeat_seconds=0.1)
    upgrade(settings)
    factory = make_sessionmaker(make_engine(settings.db_url))
    with session_scope(factory) as session:
        eid = create_experiment(session, ExperimentCreate(dataset="digits")).id
        session.execute(update(Experiment).where(Experiment.id == eid).values(
            status="running", worker=WORKER_ID, heartbeat_at=utcnow(), enqueued_at=utcnow()))
    sent: list[int] = []

    def rounds() -> list[int]:
        return sorted(i for _, i in reconcile(factory, settings, lambda task, i: sent.append(i)))

    keeper = LeaseKeeper([eid], factory, settings).start()
    recorder = DatabaseRecorder(eid, factory, settings, keeper)
    time.sleep(4 * settings.lease_seconds)  # a set-up four leases long
    assert rounds() == [] and sent == []  # still this worker's
    recorder.on_batch_end(0)  # the loop's first batch: the keeper stops
    assert recorder.setup is None and not keeper._thread.is_alive()
    time.sleep(2 * settings.lease_seconds)  # the loop beats no more (as if it hung)
    assert rounds() == [eid]  # so the run is sent again, for another worker
