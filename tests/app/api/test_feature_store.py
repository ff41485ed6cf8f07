"""The artifact store as corel's store of frozen encoders' features (app.storage.features), on
the session's PostgreSQL database and store: bytes by name, one row a name whoever puts it,
and a row whose artifact went is dropped rather than served (issue 70). A run on another host
reading them: tests/worker/test_runner.py; the engine's side: tests/corel/encoders/test_features.py."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from sqlalchemy import select

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.models import FeatureSet, utcnow
from app.storage import ensure, store_of
from app.storage.features import StoredFeatures
from app.storage.refs import collect, referenced


def test_features_are_kept_by_name_once_and_a_lost_artifact_is_not_served(settings, caplog):
    engine = make_engine(settings.db_url)
    try:
        factory = ensure(make_sessionmaker(engine), settings)
        host_a, host_b = StoredFeatures(factory), StoredFeatures(factory)
        name, other = (f"test-{uuid.uuid4().hex}-{part}.npy" for part in ("train", "val"))
        assert host_a.get(name) is None
        data = uuid.uuid4().bytes * 1000
        host_a.put(name, data)
        host_b.put(name, data)  # another host that computed them too: still one row
        assert host_b.get(name) == data
        with factory() as session:
            rows = session.scalars(select(FeatureSet).where(FeatureSet.name == name)).all()
            assert len(rows) == 1 and rows[0].size == len(data)
            assert rows[0].sha256 in referenced(session, [rows[0].sha256])  # gc keeps it
        # Its artifact deleted behind its back: None (computed again), and the row goes.
        host_a.put(other, b"other bytes")
        with session_scope(factory) as session:
            lost = session.get(FeatureSet, other)
            store_of(session).delete(lost.sha256)
        assert host_b.get(other) is None
        with factory() as session:
            assert session.get(FeatureSet, other) is None
        # Its bytes corrupt in the store: refused and logged, deleted, the row dropped; the
        # features computed again are put anew and read back.
        host_a.put(other, b"other bytes")
        with factory() as session:
            row, store = session.get(FeatureSet, other), store_of(session)
            corrupt = store.path(row.sha256)  # type: ignore[attr-defined]  # the session's store: a folder
            corrupt.chmod(0o644)
            corrupt.write_bytes(b"flipped bits")
        with caplog.at_level(logging.WARNING):
            assert host_b.get(other) is None
        assert "do not match its digest" in caplog.text and "kept features are corrupt" in caplog.text
        with factory() as session:
            assert session.get(FeatureSet, other) is None
        host_b.put(other, b"other bytes")
        assert host_a.get(other) == b"other bytes"
        # Read marks it used: gc keeps what was read within the days, drops what was not.
        with session_scope(factory) as session:
            session.get(FeatureSet, name).used_at = utcnow() - timedelta(days=40)
        assert host_a.get(name) == data
        with factory() as session:
            done = collect(session, store_of(session), 3600, features_keep_seconds=30 * 86400.0)
            assert session.get(FeatureSet, name) is not None and done.features_dropped == 0
        with session_scope(factory) as session:
            session.get(FeatureSet, name).used_at = utcnow() - timedelta(days=40)
        with factory() as session:
            done = collect(session, store_of(session), 3600, features_keep_seconds=30 * 86400.0)
            assert session.get(FeatureSet, name) is None and done.features_dropped >= 1
    finally:
        engine.dispose()
