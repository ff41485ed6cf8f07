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
from app.core.schemas.experiments import ExperimentCreate
from app.core.settings import Settings
from app.services.experiments import create_experiment
from app.storage import make_store
from corel.train import checkpoint_from_bytes
from tests.app.conftest import PG_ADMIN_URL, pg_available, pg_database_url
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
                       database_url=pg_database_url(name))
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
    assert sorted(at_head) == sorted((eid, "best") for eid in ids)  # a finished run's resume one freed
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


# Every table whose bytes migration 0017 moves: (table, key, [(bytes column, digest column)]).
MOVED_0017 = (
    ("latent_spaces", "id", (("representations", "representations_sha256"), ("labels", "labels_sha256"))),
    ("embedding_results", "job_id", (("representations", "representations_sha256"),
                                     ("labels", "labels_sha256"))),
    ("figures", "id", (("png", "sha256"),)),
)


def stored_everywhere(settings: Settings) -> dict[str, dict]:
    """What the rows name at head, read from the store: table -> key -> bytes."""
    store = make_store(settings)
    engine = create_engine(settings.db_url)
    out: dict[str, dict] = {}
    with engine.connect() as conn:
        for table, key, pairs in MOVED_0017:
            for row in conn.execute(text(f"SELECT {key}, {', '.join(d for _, d in pairs)} FROM {table}")):
                for (data, _), sha in zip(pairs, row[1:], strict=True):
                    out.setdefault(f"{table}.{data}", {})[row[0]] = store.read_bytes(sha)
        out["dataset_blobs"] = {i: store.read_bytes(s) for i, s in conn.execute(
            text("SELECT id, blob_sha256 FROM datasets"))}
        out["encoder_blobs"] = {s: store.read_bytes(s) for (s,) in conn.execute(
            text("SELECT sha256 FROM encoders"))}
        out["index"] = {i: store.read_bytes(s) for i, s in conn.execute(
            text("SELECT id, sha256 FROM neighbor_indexes"))}
    engine.dispose()
    return out


def in_rows(settings: Settings) -> dict[str, dict]:
    """The same, read from the rows of revision 0015."""
    engine = create_engine(settings.db_url)
    out: dict[str, dict] = {}
    with engine.connect() as conn:
        for table, key, pairs in MOVED_0017:
            for row in conn.execute(text(f"SELECT {key}, {', '.join(d for d, _ in pairs)} FROM {table}")):
                for (data, _), value in zip(pairs, row[1:], strict=True):
                    out.setdefault(f"{table}.{data}", {})[row[0]] = bytes(value)
        out["dataset_blobs"] = {i: bytes(d) for i, d in conn.execute(
            text("SELECT dataset_id, data FROM dataset_blobs"))}
        out["encoder_blobs"] = {s: bytes(d) for s, d in conn.execute(
            text("SELECT sha256, data FROM encoder_blobs"))}
        index: dict[int, bytes] = {}
        for i, d in conn.execute(text("SELECT index_id, data FROM neighbor_index_chunks ORDER BY seq")):
            index[i] = index.get(i, b"") + bytes(d)
        out["index"] = index
    engine.dispose()
    return out


def test_every_artifact_moves_into_the_store_and_back(settings, tmp_path):
    """Rows of every kind, made by the service's and the worker's own code (an upload, an
    uploaded encoder, a run's latent spaces, a figure, a batch embedding job, an index):
    down to 0015 their bytes are in the rows again, and up from rows alone (the store
    emptied) the same artifacts are back, read and served."""
    import numpy as np
    from sklearn.datasets import load_digits

    from app.core.schemas.indexes import IndexCreate
    from app.services import embedding_jobs, encoders, figures, indexes
    from app.services.datasets import create_upload
    from app.storage import ensure
    from tests.encoder_files import timm_weights
    from worker.embedding import embed_dataset
    from worker.indexing import build_index

    upgrade(settings)
    factory = ensure(make_sessionmaker(make_engine(settings.db_url)), settings)
    d = load_digits()
    npz = tmp_path / "digits.npz"
    np.savez(npz, x=d.data.astype(np.float32), y=d.target)
    weights = timm_weights(tmp_path / "w.safetensors")
    with session_scope(factory) as session:
        upload = create_upload(session, "digits.npz", "npz", npz).id
        encoders.create_encoder(session, settings, "w.safetensors", "timm", weights,
                                "test_efficientnet", None)
        eid = create_experiment(session, ExperimentCreate(
            dataset="npz", dataset_id=upload, epochs=2, batch_size=64, lr=0.003)).id
    assert train_experiment(eid, factory, settings) == "succeeded"
    with session_scope(factory) as session:
        figures.latent_png(session, eid)
        job = embedding_jobs.create_job(session, eid, upload).id
        index = indexes.create_index(session, eid, IndexCreate(kind="exact"), settings).id
    assert embed_dataset(job, factory, settings) == "succeeded"
    assert build_index(index, factory, settings) == "succeeded"
    at_head = stored_everywhere(settings)
    assert all(at_head[k] for k in at_head), {k: len(v) for k, v in at_head.items()}

    downgrade(settings, "0015")
    assert in_rows(settings) == at_head
    shutil.rmtree(settings.artifact_dir)
    upgrade(settings)
    assert stored_everywhere(settings) == at_head
    with factory() as session:  # read back through the services, from the store
        assert indexes.load_index(session, index).to_bytes() == at_head["index"][index]
        reps, labels, _ = embedding_jobs.load_result(session, job)
        assert reps.tobytes() == at_head["embedding_results.representations"][job]
        assert len(labels) == len(d.target)
