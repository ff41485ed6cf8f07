"""The artifact store: one contract, two backends (a local folder; S3, a real SeaweedFS of
the test's own). Content-addressed writes, verified reads, deletes, the size limit, an S3
server that stops for a while, and settings that name a bucket or credentials S3 refuses."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from app.core.settings import Settings
from app.storage import (
    DigestMismatch,
    LocalStore,
    StorageError,
    make_store,
)

pytestmark = pytest.mark.no_user


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


def test_a_parsed_read_hashes_beside_the_parse_and_refuses_corrupt_bytes(tmp_path, caplog):
    """read_parsed (an index: read once, hashed on a thread while it is parsed) verifies as
    read_bytes does: a parse of corrupt bytes is dropped, never returned."""
    store = LocalStore(tmp_path / "artifacts")
    art = store.put_bytes(b"an index's bytes")
    parsed: list[bytes] = []
    views: list[memoryview] = []

    def parse(data: memoryview, file: Path) -> bytes:
        assert data.readonly and file.read_bytes() == bytes(data)  # the file that holds them
        views.append(data)
        parsed.append(bytes(data))
        return bytes(data).upper()

    assert store.read_parsed(art.sha256, parse) == b"AN INDEX'S BYTES"
    # The file mapped, not copied: a read-only view, valid only while the parse runs.
    with pytest.raises(ValueError, match="released"):
        bytes(views[-1])
    path = store.path(art.sha256)
    time.sleep(0.01)
    path.write_bytes(b"an index's byteZ")  # changed on disk after it was verified
    with caplog.at_level(logging.ERROR, logger="corel.storage"), pytest.raises(DigestMismatch):
        store.read_parsed(art.sha256, parse)
    assert parsed[-1] == b"an index's byteZ"  # parsed, then refused

    def strict(data: memoryview, file: Path) -> bytes:
        raise ValueError("these bytes are not an index")

    with pytest.raises(DigestMismatch):  # bytes that do not parse are named corrupt, not unparsable
        store.read_parsed(art.sha256, strict)
    assert any("do not match" in r.getMessage() for r in caplog.records)
    store.delete(art.sha256)
    with pytest.raises(StorageError, match="no artifact"):
        store.read_parsed(art.sha256, parse)


def test_an_unwritable_folder_names_the_setting(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(StorageError, match="COREL_ARTIFACTS_DIR"):
        make_store(Settings(var_dir=tmp_path, artifacts_dir=blocked / "artifacts")).check()
