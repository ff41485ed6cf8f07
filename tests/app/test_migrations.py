"""Migration 0016 moves the checkpoints' bytes out of their rows into the artifact store,
and its downgrade moves them back: real rows (runs trained by the worker's own code), on
SQLite and on PostgreSQL."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import create_engine, inspect, text

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import downgrade, upgrade
from app.core.schemas import ExperimentCreate
from app.core.settings import Settings
from app.services.experiments import create_experiment
from app.storage import make_store
from corel.train import checkpoint_from_bytes
from tests.app.conftest import PG_ADMIN_URL, pg_available
from tests.conftest import require
from worker.runner import train_experiment

pytestmark = pytest.mark.no_user


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path) -> Iterator[Settings]:
    if request.param == "sqlite":
        yield Settings(var_dir=tmp_path, broker_url="memory://")
        return
    require(pg_available(), f"PostgreSQL at {PG_ADMIN_URL}")
    name = f"corel_migrate_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield Settings(var_dir=tmp_path, broker_url="memory://",
                       database_url=f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}")
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def checkpoint_rows(settings: Settings, with_data: bool) -> dict[tuple[int, str], tuple]:
    engine = create_engine(settings.db_url)
    columns = "experiment_id, kind, sha256, size" + (", data" if with_data else "")
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT {columns} FROM checkpoints")).all()
        has_data = "data" in {c["name"] for c in inspect(conn).get_columns("checkpoints")}
    engine.dispose()
    assert has_data == with_data
    return {(r[0], r[1]): tuple(r[2:]) for r in rows}


def test_checkpoints_move_into_the_store_and_back(settings):
    upgrade(settings)
    factory = make_sessionmaker(make_engine(settings.db_url))
    with session_scope(factory) as session:
        ids = [create_experiment(session, ExperimentCreate(
            dataset="digits", loss=loss, epochs=2, batch_size=64, lr=0.003)).id
            for loss in ("gaussian", "cosine")]
    for eid in ids:
        assert train_experiment(eid, factory, settings) == "succeeded"
    store = make_store(settings)
    at_head = checkpoint_rows(settings, with_data=False)
    assert sorted(at_head) == sorted((eid, kind) for eid in ids for kind in ("best", "resume"))
    stored = {key: store.read_bytes(sha) for key, (sha, _) in at_head.items()}
    assert all(size == len(stored[key]) for key, (_, size) in at_head.items())

    # Down: every row holds its bytes again, the very bytes the store held.
    downgrade(settings, "0015")
    down = checkpoint_rows(settings, with_data=True)
    assert {key: bytes(data) for key, (_, _, data) in down.items()} == stored
    # Up from rows alone (the store emptied): the bytes go back into the store.
    shutil.rmtree(settings.artifact_dir)
    upgrade(settings)
    up = checkpoint_rows(settings, with_data=False)
    assert up == at_head
    for key, (sha, _) in up.items():
        assert make_store(settings).read_bytes(sha) == stored[key]
    best = checkpoint_from_bytes(stored[(ids[0], "best")])
    assert best["spec"] and best["class_names"]
