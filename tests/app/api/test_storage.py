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
    DigestMismatch,
    LocalStore,
    StorageError,
    make_store,
)
from app.storage.store import VERIFIED_XATTR

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


def test_a_file_verified_on_this_host_is_not_hashed_again_by_another_process(tmp_path, monkeypatch):
    """The store that writes a file records it verified on the file itself; another
    process's store over the same folder reads it without hashing it again, unless the file
    changed since (another modification time: hashed, and refused where corrupt). A file
    with no record, or a record of other bytes, is hashed, then recorded for the next."""
    root = tmp_path / "artifacts"
    art = LocalStore(root).put_bytes(b"an index's bytes")
    path = LocalStore(root).path(art.sha256)
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(*args: object) -> object:
        hashed.append(1)
        return real(*args)

    monkeypatch.setattr(hashlib, "sha256", counting)
    other = LocalStore(root)  # another process's store: nothing verified in it yet
    assert other.read_parsed(art.sha256, lambda view, file: bytes(view)) == b"an index's bytes"
    assert LocalStore(root).read_bytes(art.sha256) == b"an index's bytes"
    assert hashed == []
    # Storing what is there refreshes its time (gc spares it), and moves its record with it.
    before = path.stat().st_mtime_ns
    time.sleep(0.01)
    LocalStore(root).put_file(path)
    assert path.stat().st_mtime_ns != before
    hashed.clear()
    assert LocalStore(root).read_bytes(art.sha256) == b"an index's bytes" and hashed == []
    # No record (a file stored before records, or a filesystem without them): hashed once,
    # then recorded for the next process.
    os.removexattr(path, VERIFIED_XATTR)
    assert LocalStore(root).read_bytes(art.sha256) == b"an index's bytes" and len(hashed) == 1
    assert LocalStore(root).read_bytes(art.sha256) == b"an index's bytes" and len(hashed) == 1
    # A record that names other bytes, or another time, is not trusted.
    stat = path.stat()
    for record in (f"{'0' * 64} {stat.st_ino} {stat.st_size} {stat.st_mtime_ns}",
                   f"{art.sha256} {stat.st_ino} {stat.st_size} {stat.st_mtime_ns + 1}"):
        os.setxattr(path, VERIFIED_XATTR, record.encode())
        hashed.clear()
        LocalStore(root).read_bytes(art.sha256)
        assert len(hashed) == 1
    # Changed on disk after it was recorded: hashed again, and refused.
    time.sleep(0.01)
    path.write_bytes(b"an index's byteZ")
    with pytest.raises(DigestMismatch):
        LocalStore(root).read_parsed(art.sha256, lambda view, file: bytes(view))
    with pytest.raises(DigestMismatch):
        other.read_bytes(art.sha256)


def test_storing_what_gc_removes_at_that_moment_writes_it_again(tmp_path, monkeypatch):
    """Storing bytes already there only refreshes the file's time; if the collector removes
    the file between the store's look and that refresh, the bytes are written again, never
    reported stored while gone."""
    store = LocalStore(tmp_path / "artifacts")
    art = store.put_bytes(b"a checkpoint")
    real = os.utime

    def collected_first(path, *args, **kwargs):
        os.unlink(path)  # the collector's delete, at the worst moment
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "utime", collected_first)
    assert store.put_bytes(b"a checkpoint") == art
    monkeypatch.setattr(os, "utime", real)
    assert LocalStore(tmp_path / "artifacts").read_bytes(art.sha256) == b"a checkpoint"


def test_an_unwritable_folder_names_the_setting(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(StorageError, match="COREL_ARTIFACTS_DIR"):
        make_store(Settings(var_dir=tmp_path, artifacts_dir=blocked / "artifacts")).check()
