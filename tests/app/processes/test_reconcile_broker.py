"""The reconciler against a broker that forgets: a Redis of the test's own is flushed, and
every run, embedding job and index build sent before is sent again at once, whatever its back-off; the
back-off itself is capped at two leases. (End to end, under faults: test_fault_soak.py.)"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import update

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import DatasetUpload, EmbeddingJob, Experiment, NeighborIndex, utcnow
from app.core.schemas.experiments import ExperimentCreate
from app.core.settings import Settings
from app.jobs.broker import EMBED_TASK, INDEX_TASK, TRAIN_TASK, broker_memory_since
from app.jobs.lifecycle import reconcile, requeue_delay
from app.services.experiments import create_experiment
from harness.servers import PrivateRedis
from tests.conftest import require


@pytest.fixture()
def private_redis() -> Iterator[PrivateRedis]:
    require(shutil.which("redis-server") is not None, "redis-server (redis-server package)")
    rd = PrivateRedis()
    try:
        yield rd
    finally:
        rd.close()


def test_the_back_off_is_capped_at_two_leases() -> None:
    settings = Settings(lease_seconds=10.0)
    assert [requeue_delay(settings, n) for n in (1, 2, 3, 10)] == [10.0, 20.0, 20.0, 20.0]
    # An operator's own figures still hold.
    settings = Settings(lease_seconds=10.0, requeue_after_seconds=3.0, requeue_max_seconds=5.0)
    assert [requeue_delay(settings, n) for n in (1, 2, 3)] == [3.0, 5.0, 5.0]


def test_what_was_sent_before_the_broker_forgot_is_sent_again_at_once(tmp_path, private_redis):
    settings = Settings(var_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/corel.sqlite3",
                        broker_url=private_redis.url, lease_seconds=10.0)
    upgrade(settings)
    factory = make_sessionmaker(make_engine(settings.db_url))
    with session_scope(factory) as session:
        ids = [create_experiment(session, ExperimentCreate(dataset="digits", seed=i)).id
               for i in range(2)]
        upload = DatasetUpload(kind="npz", filename="x.npz", size=1, sha256="0" * 64, blob_sha256="0" * 64, summary={})
        session.add(upload)
        session.flush()
        job = EmbeddingJob(experiment_id=ids[0], dataset_id=upload.id, status="queued",
                           n_total=1, n_done=0, cancel_requested=False, created_at=utcnow(),
                           attempts=0, enqueued_at=utcnow(), enqueues=1)
        session.add(job)
        index = NeighborIndex(experiment_id=ids[1], source="train", requested_kind="auto",
                              geometry="euclidean", status="queued", n_total=1, n_done=0,
                              cancel_requested=False, created_at=utcnow(), attempts=0,
                              enqueued_at=utcnow(), enqueues=1)
        session.add(index)
        session.flush()
        job_id, index_id = job.id, index.id
    # Sent a moment ago, many times over: well within their back-off.
    with session_scope(factory) as session:
        for model in (Experiment, EmbeddingJob, NeighborIndex):
            session.execute(update(model).values(
                enqueued_at=utcnow() - timedelta(seconds=1), enqueues=6))
    expected = sorted([(TRAIN_TASK, i) for i in ids] + [(EMBED_TASK, job_id), (INDEX_TASK, index_id)])

    def rounds() -> list[tuple[str, int]]:
        sent: list[tuple[str, int]] = []
        reconcile(factory, settings, lambda task, i: sent.append((task, i)),
                  broker_memory_since(settings))
        return sorted(sent)

    # The first look at this broker finds no marker: nobody can tell what it still holds.
    assert rounds() == expected
    assert rounds() == []  # sent after the marker, within the back-off: left alone
    since = broker_memory_since(settings)
    assert since is not None and broker_memory_since(settings) == since  # kept while it remembers
    private_redis.flush()  # FLUSHALL: the messages are gone, and the marker with them
    assert rounds() == expected
    assert rounds() == []
    # A claimed row (running, its lease fresh) is its worker's: never sent again.
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(Experiment.id == ids[0]).values(
            status="running", heartbeat_at=utcnow(), worker="w"))
    private_redis.flush()
    assert rounds() == sorted([(TRAIN_TASK, ids[1]), (EMBED_TASK, job_id), (INDEX_TASK, index_id)])


def test_no_marker_on_a_broker_that_keeps_its_messages(tmp_path):
    settings = Settings(var_dir=tmp_path)  # the embedded SQLite broker
    assert broker_memory_since(settings) is None
    # And a Redis that does not answer: unknown, not "forgot".
    assert broker_memory_since(Settings(var_dir=tmp_path, broker_url="redis://127.0.0.1:1/0")) is None
