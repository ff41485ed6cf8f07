"""No accepted run is lost when the database or the broker blinks.

Each test runs the service on a PostgreSQL cluster and a Redis server of its own
(harness/servers.py), with real workers, and stops, cuts or flushes them mid-run.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.migrate import upgrade
from app.core.settings import Settings
from app.main import create_app
from corel.spec import ExperimentSpec
from corel.train import fit
from harness.servers import PrivatePostgres, PrivateRedis, postgres_bin
from harness.wait import wait_until
from tests.app.conftest import Workers, finished, npz_bytes, wait_for
from tests.conftest import require

# The tests that time answers while their services fail (a refusal within 2 s, a read
# within 0.1 s) run alone, not beside other tests (make test's serial pass), and so does
# the one that compares a resumed run's figures with a run in this process. The others wait
# for recovery with deadlines of a minute or more and run beside other tests.
alone = pytest.mark.serial

RUN = {"dataset": "digits", "epochs": 4, "batch_size": 32, "lr": 1e-3, "loss": "gaussian",
       "lam": 0.8}


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivatePostgres, PrivateRedis]]:
    import shutil

    require(postgres_bin() is not None, "PostgreSQL's initdb and pg_ctl (postgresql package)")
    require(shutil.which("redis-server") is not None, "redis-server (redis-server package)")
    pg, rd = PrivatePostgres(), PrivateRedis()
    try:
        yield pg, rd
    finally:
        pg.close()
        rd.close()


@pytest.fixture()
def service(private: tuple[PrivatePostgres, PrivateRedis], tmp_path: Path
            ) -> Iterator[tuple[Settings, Workers, TestClient]]:
    pg, rd = private
    settings = Settings(
        database_url=pg.url(), broker_url=rd.url, var_dir=tmp_path / "var",
        queue=f"corel-faults-{uuid.uuid4().hex[:8]}", lease_seconds=4.0, heartbeat_seconds=0.5,
        requeue_after_seconds=2.0, requeue_max_seconds=8.0, retry_max_pause=1.0,
        transient_retry_seconds=120.0, log_level="INFO",
    )
    upgrade(settings)
    (tmp_path / "logs").mkdir()
    workers = Workers(settings, tmp_path / "logs")
    with TestClient(create_app(settings)) as client:
        try:
            yield settings, workers, client
        finally:
            workers.stop_all()


def submit(client: TestClient, n: int, **update: object) -> list[int]:
    ids = []
    for seed in range(n):
        r = client.post("/experiments", json={**RUN, "seed": seed, **update})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    return ids


def wait_all(client: TestClient, ids: list[int], workers: Workers, timeout: float = 150) -> list[dict]:
    return [wait_for(client, eid, finished, timeout=timeout, workers=workers) for eid in ids]


def test_runs_queued_while_postgres_stops_all_succeed(private, service) -> None:
    pg, _ = private
    _, workers, client = service
    ids = submit(client, 4)
    workers.start()
    time.sleep(2.0)  # the worker is up and has taken the first task off the queue
    pg.stop()
    time.sleep(5.0)
    pg.start()
    bodies = wait_all(client, ids, workers)
    assert [b["status"] for b in bodies] == ["succeeded"] * 4, (bodies, workers.logs())
    for body in bodies:
        items = client.get(f"/experiments/{body['id']}/metrics").json()["items"]
        assert [m["epoch"] for m in items] == [1, 2, 3, 4]  # none lost, none twice


@alone
def test_a_terminated_connection_resumes_with_the_same_figures(private, service) -> None:
    pg, _ = private
    _, workers, client = service
    spec = {**RUN, "epochs": 10, "batch_size": 16, "seed": 5}
    (eid,) = submit(client, 1, **{k: v for k, v in spec.items() if k not in RUN or RUN[k] != v})
    workers.start()
    wait_for(client, eid, lambda b: b["current_epoch"] >= 1, timeout=60, workers=workers)
    # Cut the worker's connections again and again, mid-transaction as often as not, as
    # a failover, a pgbouncer restart or an idle-connection reaper would.
    cut = 0
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        cut += pg.terminate_clients()
        time.sleep(0.05)
    assert cut > 0
    body = wait_for(client, eid, finished, timeout=150, workers=workers)
    assert body["status"] == "succeeded" and body["error"] is None, (body, workers.logs())
    metrics = client.get(f"/experiments/{eid}/metrics").json()["items"]
    assert [m["epoch"] for m in metrics] == list(range(1, 11))
    # The same machine and kernels: a resumed run ends exactly where an uninterrupted one does.
    whole = fit(ExperimentSpec(**spec))
    assert [m["val_accuracy"] for m in metrics] == [m.val_accuracy for m in whole.history]
    assert [m["train_loss"] for m in metrics] == pytest.approx(
        [m.train_loss for m in whole.history], rel=1e-12)
    assert (body["best_epoch"], body["test_accuracy"]) == (whole.best_epoch, whole.test_accuracy)


def test_runs_whose_queue_the_broker_lost_still_run(private, service) -> None:
    _, rd = private
    _, workers, client = service
    ids = submit(client, 3)
    rd.flush()  # a Redis that restarts without persistence
    workers.start()
    bodies = wait_all(client, ids, workers, timeout=90)
    assert [b["status"] for b in bodies] == ["succeeded"] * 3, (bodies, workers.logs())


def timed(call):
    started = time.monotonic()
    result = call()
    return result, time.monotonic() - started


@alone
def test_the_api_answers_503_while_postgres_is_down_and_recovers(private, service) -> None:
    pg, _ = private
    _, _, client = service
    assert client.get("/experiments").status_code == 200
    pg.stop()
    try:
        for method, path, body in (("GET", "/experiments", None), ("GET", "/experiments/1", None),
                                   ("POST", "/experiments", {"dataset": "digits", "epochs": 1})):
            r, seconds = timed(lambda m=method, p=path, b=body: client.request(m, p, json=b))
            assert r.status_code == 503, (path, r.status_code, r.text)
            assert r.json()["error"] == "service_unavailable" and "retry" in r.json()["detail"]
            assert int(r.headers["retry-after"]) > 0 and seconds < 2.0, (path, seconds)
        r, seconds = timed(lambda: client.get("/ready"))
        assert r.status_code == 503 and r.json()["database"].startswith(("unreachable", "not"))
        assert seconds < 2.0
        r, seconds = timed(lambda: client.get("/health"))
        assert r.status_code == 200 and seconds < 0.1
    finally:
        pg.start()
    assert client.get("/experiments").status_code == 200  # the pool reconnects by itself


@alone
def test_health_and_ready_answer_while_postgres_is_frozen(private, service) -> None:
    import threading

    pg, _ = private
    _, _, client = service
    assert client.get("/experiments").status_code == 200
    pg.freeze()
    hung = [threading.Thread(target=client.get, args=("/experiments",), daemon=True)
            for _ in range(48)]  # more than the 40 request threads
    try:
        for t in hung:
            t.start()
        time.sleep(0.5)  # they hold the request threads, waiting on the database
        r, seconds = timed(lambda: client.get("/health"))
        assert r.status_code == 200 and seconds < 0.1, seconds
        r, seconds = timed(lambda: client.get("/ready"))
        assert r.status_code == 503 and seconds < 2.0, (r.text, seconds)
        for path in ("/experiments", "/experiments/1", "/datasets"):
            r, seconds = timed(lambda p=path: client.get(p))
            assert r.status_code == 503 and r.headers["retry-after"], (path, r.text)
            assert seconds < 2.0, (path, seconds)
    finally:
        pg.thaw()
    for t in hung:
        t.join(timeout=30)
    # Back within Retry-After: new connections are held off for 2 s after a ping that
    # went unanswered, then the pool reconnects.
    wait_until(lambda: client.get("/experiments").status_code == 200, 5,
               "the API to recover after the thaw")


@alone
def test_submitting_while_the_broker_is_down_is_a_quick_503(private, service) -> None:
    _, rd = private
    _, _, client = service
    rd.stop()
    try:
        r, seconds = timed(lambda: client.post("/experiments", json={"dataset": "digits",
                                                                     "epochs": 1}))
        assert r.status_code == 503 and "could not be queued" in r.json()["detail"]
        assert r.headers["retry-after"] and seconds < 1.5, seconds
    finally:
        rd.start()


def test_a_refused_send_withdraws_the_row_or_keeps_it_queued(private, service) -> None:
    """A 503 leaves no row; a row that cannot be withdrawn (claimed meanwhile, or the
    database went away too) stays, and the request counts as accepted."""
    from sqlalchemy import delete, select, update

    from app.core.db import make_engine, make_sessionmaker, session_scope
    from app.core.errors import ServiceUnavailable
    from app.core.models import Experiment
    from app.core.schemas.experiments import ExperimentCreate
    from app.jobs.lifecycle import commit_and_send
    from app.jobs.queue import BrokerUnavailable
    from app.services.experiments import create_experiment

    pg, _ = private
    settings, _, _ = service
    engine = make_engine(settings.db_url)
    factory = make_sessionmaker(engine)

    def submit(send) -> int:
        with factory() as session:
            experiment_id = create_experiment(session, ExperimentCreate(dataset="digits", epochs=1)).id
            commit_and_send(session, Experiment, [experiment_id], lambda: send(experiment_id),
                            "the experiment")
            return experiment_id

    def refused() -> None:
        raise BrokerUnavailable("ConnectionError")

    def status(experiment_id: int) -> str | None:
        with session_scope(factory) as session:
            return session.scalar(select(Experiment.status).where(Experiment.id == experiment_id))

    with factory() as session:
        experiment_id = create_experiment(session, ExperimentCreate(dataset="digits", epochs=1)).id
        with pytest.raises(ServiceUnavailable, match="nothing was stored"):
            commit_and_send(session, Experiment, [experiment_id], refused, "the experiment")
    assert status(experiment_id) is None

    def claimed_meanwhile(experiment_id: int) -> None:  # the reconciler sent it, a worker took it
        with session_scope(factory) as other:
            other.execute(update(Experiment).where(Experiment.id == experiment_id)
                          .values(status="running", attempts=1))
        refused()

    claimed_id = submit(claimed_meanwhile)
    assert status(claimed_id) == "running"

    def database_gone_too(experiment_id: int) -> None:
        pg.stop()
        refused()

    try:
        kept_id = submit(database_gone_too)
    finally:
        pg.start()
    engine.dispose()
    assert status(kept_id) == "queued"  # the reconciler sends it
    with session_scope(factory) as session:
        session.execute(delete(Experiment).where(Experiment.id.in_([claimed_id, kept_id])))
    engine.dispose()


def test_an_embedding_job_survives_a_database_blink_mid_transaction(private, service) -> None:
    """As a training run does: the worker's connection is cut while it stores the job's
    result (held there by a lock the test takes on the results' table); the worker tries
    again, claims its own job again, and stores it once, with the vectors of a job that
    met no fault."""
    import numpy as np
    import psycopg
    from sklearn.datasets import load_digits

    from tests.app.stack.test_embedding_jobs import wait_job

    pg, _ = private
    _, workers, client = service
    d = load_digits()
    upload = npz_bytes(x=d.data[:500].astype(np.float32), y=d.target[:500])
    dataset = client.post("/datasets", files={"file": ("d.npz", upload)}).json()["id"]
    eid = client.post("/experiments", json={"dataset": "npz", "dataset_id": dataset, "epochs": 2,
                                            "lr": 0.003, "batch_size": 64}).json()["id"]
    workers.start()
    assert wait_for(client, eid, finished, timeout=120, workers=workers)["status"] == "succeeded"

    def run_job() -> int:
        r = client.post(f"/experiments/{eid}/embeddings", json={"dataset_id": dataset})
        assert r.status_code == 202, r.text
        return int(r.json()["id"])

    clean = run_job()
    first = wait_job(client, clean, timeout=90)
    assert first["status"] == "succeeded", first
    holder = psycopg.connect(pg.url())
    try:
        holder.execute("LOCK TABLE embedding_results IN ACCESS EXCLUSIVE MODE")
        job = run_job()
        # (asked on a connection of its own: the statistics views are read once per transaction)
        def worker_waits() -> bool:
            with psycopg.connect(pg.url(), autocommit=True) as conn:
                return bool(conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query ILIKE '%embedding_results%'").fetchall())

        wait_until(worker_waits, 60, "the worker to wait for the test's lock", interval=0.05,
                   detail=workers.logs)
        # The blink: every connection cut, the worker's open transaction and the test's lock.
        assert pg.terminate_clients() >= 2
    finally:
        holder.close()
    body = wait_job(client, job, timeout=90)
    assert body["status"] == "succeeded", body
    with psycopg.connect(pg.url()) as conn:
        rows = conn.execute("SELECT j.id, j.attempts, r.representations_sha256 FROM embedding_jobs j "
                            "JOIN embedding_results r ON r.job_id = j.id WHERE j.id IN (%s, %s) "
                            "ORDER BY j.id", (clean, job)).fetchall()
    assert [r[0] for r in rows] == [clean, job]
    assert rows[1][1] == 2  # claimed again (by the same worker, trying again)
    assert rows[1][2] == rows[0][2]
