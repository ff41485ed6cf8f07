"""The artifact store: bytes addressed by their content (sha256), in a local folder or an
S3 bucket. The database keeps what an artifact is (its digest and size, in the row that
uses it), never its bytes.

An artifact is written whole before any row names it (:meth:`ArtifactStore.put_file`
streams a file through a hash into place, so a crash leaves at most an orphan that
:func:`app.storage.refs.collect` removes), read back verified (a digest that does not
match is refused, logged and never served), and deleted when nothing references it
(:mod:`app.storage.refs`). A file is hashed once on its host, not once per process: the
local store's process that writes a file, or first hashes one, records what it verified on
the file itself (:data:`VERIFIED_XATTR`: the digest, the file's inode, size and modification
time), and another process's read of the same file, unchanged since, trusts the record, as
every process trusts the S3 store's local copies, verified once when fetched.

Both backends keep nothing whole in memory: writes stream from a file, reads stream to
one. The S3 store keeps a local cache of what it has read (``cache_dir``), so that a
worker that resumes a run, or an API that serves a model, reads an artifact from S3 once.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from app.core.errors import DomainError

log = logging.getLogger("corel.storage")

CHUNK = 1 << 20
# The extended attribute that records a local file verified on this host ("digest inode
# size mtime_ns"); a file changed in place gets another modification time, and is hashed
# again. Where the filesystem keeps no user attributes, each process hashes once.
VERIFIED_XATTR = "user.corel.verified"
DIGEST = re.compile(r"^[0-9a-f]{64}$")

T = TypeVar("T")


class StorageError(DomainError):
    """The store cannot do what was asked (the setting at fault is in the message)."""

    status_code = 500
    error = "artifact_store"


class StoreUnavailable(StorageError):
    """The store did not answer (an S3 endpoint down, a folder not writable): waited out
    by the worker, a 503 at the API."""

    status_code = 503
    error = "service_unavailable"


class ArtifactMissing(StorageError):
    """No artifact of this digest: a row points at nothing (a bug, or a store emptied by
    hand)."""

    error = "artifact_missing"


class DigestMismatch(StorageError):
    """The bytes stored under a digest are not that digest's: refused, never served."""

    error = "artifact_corrupt"


class TooLarge(StorageError):
    """An artifact larger than the store's limit."""

    status_code = 413
    error = "payload_too_large"

    def __init__(self, limit: int):
        super().__init__(f"the artifact is larger than the limit of {limit:,} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Artifact:
    """A stored artifact: its content digest and its size in bytes."""

    sha256: str
    size: int


def check_digest(digest: str) -> str:
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise ValueError(f"an artifact's digest is 64 lowercase hex digits (sha256), not {digest!r}")
    return digest


@contextmanager
def _mapped(path: Path) -> Iterator[memoryview]:
    """``path``'s bytes as a read-only view of the file mapped into memory (its pages read
    in at once), for the block; an empty file, an empty view. Content-addressed files are
    never rewritten in place (a store writes a new file and renames it over), and one
    deleted while mapped stays readable until unmapped."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        if hasattr(mmap, "MAP_SHARED"):  # Unix
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mapped = mmap.mmap(fh.fileno(), size, flags=flags, prot=mmap.PROT_READ)
        else:
            mapped = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    try:
        yield view
    finally:
        # Something the block made that still points into it keeps it mapped until it goes.
        with suppress(BufferError):
            view.release()
        with suppress(BufferError):
            mapped.close()


def hash_file(path: Path) -> Artifact:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return Artifact(h.hexdigest(), size)


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    """What a verified file must still be: its inode, size and modification time (ns)."""
    return st.st_ino, st.st_size, st.st_mtime_ns


def _verified_record(digest: str, stamp: tuple[int, int, int]) -> bytes:
    return " ".join([digest, *map(str, stamp)]).encode()


class ArtifactStore:
    """What both backends offer. Subclasses implement the ``_`` methods over a key per
    digest; everything else (hashing, verifying, the size limit, temp files) is here."""

    kind = "?"

    def __init__(self, staging_dir: Path, max_bytes: int | None = None):
        self.staging_dir = Path(staging_dir)
        self.max_bytes = max_bytes

    # --- writing --------------------------------------------------------------------

    def put_file(self, path: Path) -> Artifact:
        """Store a file's bytes; returns their digest and size. Storing what is already
        there writes nothing (and refreshes its time, so that gc spares it)."""
        art = hash_file(Path(path))
        if self.max_bytes is not None and art.size > self.max_bytes:
            raise TooLarge(self.max_bytes)
        self._store(Path(path), art)
        return art

    def put_bytes(self, data: bytes) -> Artifact:
        """Store bytes held in memory (small artifacts: a checkpoint of a small head, a
        figure); large ones go through :meth:`put_file` or :meth:`put_stream`."""
        return self.put_stream([data])

    def put_stream(self, chunks: Iterable[bytes]) -> Artifact:
        """Store what ``chunks`` yields, spooled through a temporary file and hashed on the
        way: never held whole in memory. Past ``max_bytes`` it stops reading: TooLarge."""
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="put-", suffix=".part", dir=self.staging_dir)
        path = Path(name)
        try:
            h, size = hashlib.sha256(), 0
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    size += len(chunk)
                    if self.max_bytes is not None and size > self.max_bytes:
                        raise TooLarge(self.max_bytes)
                    h.update(chunk)
                    f.write(chunk)
            art = Artifact(h.hexdigest(), size)
            self._store(path, art, move=True)
            return art
        finally:
            path.unlink(missing_ok=True)

    # --- reading --------------------------------------------------------------------

    def local_path(self, digest: str) -> Path:
        """A local file holding the artifact, verified against its digest (DigestMismatch
        otherwise, logged): the local store's own file, or the S3 store's cached copy."""
        raise NotImplementedError

    def read_bytes(self, digest: str) -> bytes:
        """The whole artifact in memory, verified (for what is loaded whole anyway: a
        checkpoint into torch, a latent space into numpy)."""
        return self.local_path(digest).read_bytes()

    def open(self, digest: str) -> IO[bytes]:
        """The artifact as a file to stream from, verified."""
        return open(self.local_path(digest), "rb")

    def read_parsed(self, digest: str, parse: Callable[[memoryview, Path], T]) -> T:
        """``parse(view, file)`` of the artifact's whole bytes, verified (for what is parsed
        whole and large: an index): a read-only view of them, valid only while ``parse``
        runs (it copies what it keeps), and the local file that holds them (it may read that
        instead). A store that hashes its file beside the parse may do better."""
        path = self.local_path(digest)
        with _mapped(path) as view:
            return parse(view, path)

    # --- what is there --------------------------------------------------------------

    def exists(self, digest: str) -> bool:
        raise NotImplementedError

    def delete(self, digest: str) -> bool:
        """Remove the artifact; False if it was not there."""
        raise NotImplementedError

    def listing(self) -> Iterator[tuple[str, int, float]]:
        """Every stored artifact: (digest, size, time written, seconds since the epoch)."""
        raise NotImplementedError

    def check(self) -> None:
        """Reachable and writable, or StorageError naming the setting at fault."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    # --- for subclasses -------------------------------------------------------------

    def _store(self, path: Path, art: Artifact, move: bool = False) -> None:
        raise NotImplementedError

    def _verified(self, path: Path, digest: str) -> Path:
        self._refuse_unless(digest, hash_file(path).sha256)
        return path

    def _refuse_unless(self, digest: str, actual: str) -> None:
        if actual != digest:
            log.error("artifact refused: its bytes do not match its digest", extra={
                "digest": digest, "actual": actual, "store": self.describe()})
            raise DigestMismatch(f"artifact {digest[:12]}... is corrupt in the {self.kind} store "
                                 f"(its bytes hash to {actual[:12]}...); it is not served")


class LocalStore(ArtifactStore):
    """Artifacts as files ``root/ab/abcdef...`` (the default: ``var/artifacts``).
    Written to a temporary file in the same folder tree and renamed into place, so that a
    reader never sees half an artifact."""

    kind = "local"

    def __init__(self, root: Path, max_bytes: int | None = None):
        super().__init__(Path(root) / "tmp", max_bytes)
        self.root = Path(root)
        # Files already verified in this process, by (inode, size, mtime): verified once,
        # not at every read (a file changed in place gets a new mtime and is hashed again).
        self._verified_once: dict[str, tuple[int, int, int]] = {}

    def describe(self) -> str:
        return f"local folder {self.root} (COREL_ARTIFACTS_DIR)"

    def path(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[:2] / digest

    def _store(self, path: Path, art: Artifact, move: bool = False) -> None:
        target = self.path(art.sha256)
        if target.exists():
            try:
                verified = self._host_verified(target, art.sha256, _stamp(target.stat()))
                os.utime(target)  # gc spares it; a record of it verified moves with its time
                if verified:
                    self._record_verified(target, art.sha256, _stamp(target.stat()))
                return
            except FileNotFoundError:
                pass  # collected meanwhile: written again below
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        try:
            if move:
                os.replace(path, tmp)
            else:
                shutil.copyfile(path, tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
                stamp = _stamp(os.fstat(f.fileno()))
            # The bytes just hashed on their way in (a copy of them): recorded as verified
            # before the file takes its name, which keeps its inode and times.
            self._record_verified(tmp, art.sha256, stamp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def _stamped(self, digest: str) -> tuple[Path, tuple[int, int, int]]:
        path = self.path(digest)
        try:
            st = path.stat()
        except FileNotFoundError:
            raise ArtifactMissing(f"no artifact {digest[:12]}... in the {self.describe()}") from None
        return path, _stamp(st)

    def _known_good(self, path: Path, digest: str, stamp: tuple[int, int, int]) -> bool:
        """Verified already, unchanged since: by this process, or by another on this host."""
        if self._verified_once.get(digest) == stamp:
            return True
        if self._host_verified(path, digest, stamp):
            self._verified_once[digest] = stamp
            return True
        return False

    @staticmethod
    def _host_verified(path: Path, digest: str, stamp: tuple[int, int, int]) -> bool:
        try:
            recorded = os.getxattr(path, VERIFIED_XATTR)
        except (OSError, AttributeError):  # none recorded, or no user attributes here
            return False
        return recorded == _verified_record(digest, stamp)

    def _record_verified(self, path: Path, digest: str, stamp: tuple[int, int, int]) -> None:
        """``path`` (unchanged since ``stamp``) holds ``digest``'s bytes: for this process,
        and, where the filesystem keeps user attributes, for every process on this host."""
        self._verified_once[digest] = stamp
        with suppress(OSError, AttributeError):
            os.setxattr(path, VERIFIED_XATTR, _verified_record(digest, stamp))

    def local_path(self, digest: str) -> Path:
        path, stamp = self._stamped(digest)
        if not self._known_good(path, digest, stamp):
            self._verified(path, digest)
            self._record_verified(path, digest, stamp)
        return path

    def read_parsed(self, digest: str, parse: Callable[[memoryview, Path], T]) -> T:
        """The file mapped into memory (not read into a copy of its own), and (not yet
        verified here) hashed on a thread of its own while ``parse`` runs on the same pages
        (or reads the file itself, the same bytes: a stored file is never rewritten in place):
        a 67 MB HNSW index (100,000 x 128) took 132-136 ms hashed, read and parsed one after
        the other, 86-90 ms read once and hashed beside the parse (a 2-core Intel Xeon,
        alone); a 42 MB one (100,000 x 32) 55 ms that way and 31-35 ms mapped (another, with
        AMX). ``parse``'s view is valid only while it runs: it copies what it keeps.
        DigestMismatch, the parsed result dropped, where the bytes are not the digest's. A
        file verified already on this host (written here, or hashed by another process) is
        not hashed again: a promotion's 80 MB index, written by the worker that built it,
        is parsed by the API with no 70-90 ms hash beside it (bench/promotion.py)."""
        path, stamp = self._stamped(digest)
        with _mapped(path) as view:
            if self._known_good(path, digest, stamp):
                return parse(view, path)
            with ThreadPoolExecutor(1, thread_name_prefix="corel-verify") as pool:
                hashed = pool.submit(lambda: hashlib.sha256(view).hexdigest())  # hashlib lets go of the GIL
                try:
                    parsed = parse(view, path)
                except Exception:  # bytes that do not parse: corrupt ones are named as such
                    self._refuse_unless(digest, hashed.result())
                    raise
                self._refuse_unless(digest, hashed.result())
        self._record_verified(path, digest, stamp)
        return parsed

    def exists(self, digest: str) -> bool:
        return self.path(digest).exists()

    def delete(self, digest: str) -> bool:
        self._verified_once.pop(digest, None)
        try:
            self.path(digest).unlink()
            return True
        except FileNotFoundError:
            return False

    def listing(self) -> Iterator[tuple[str, int, float]]:
        if not self.root.exists():
            return
        for sub in sorted(self.root.iterdir()):
            if not sub.is_dir() or len(sub.name) != 2:
                continue
            for f in sorted(sub.iterdir()):
                if DIGEST.match(f.name):
                    st = f.stat()
                    yield f.name, st.st_size, st.st_mtime

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StorageError(f"the artifact folder {self.root} is not writable "
                               f"(COREL_ARTIFACTS_DIR): {exc}") from exc


class S3Store(ArtifactStore):
    """Artifacts as objects ``prefix + digest`` in one bucket of any S3 endpoint (boto3).
    Reads go through a local cache (``cache_dir``), verified once when fetched.

    Requests that fail because the endpoint does not answer are tried again with a
    doubling pause for up to ``wait_seconds`` (an S3 server that restarts is waited out);
    past that :class:`StoreUnavailable`."""

    kind = "s3"

    def __init__(self, *, endpoint: str | None, bucket: str, access_key: str | None,
                 secret_key: str | None, region: str | None, prefix: str, cache_dir: Path,
                 max_bytes: int | None = None, wait_seconds: float = 30.0):
        super().__init__(Path(cache_dir) / "tmp", max_bytes)
        import boto3
        from botocore.config import Config

        self.endpoint, self.bucket, self.prefix = endpoint, bucket, prefix
        self.cache_dir = Path(cache_dir)
        self.wait_seconds = wait_seconds
        self.client = boto3.client(
            "s3", endpoint_url=endpoint or None, aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None, region_name=region or "us-east-1",
            config=Config(retries={"max_attempts": 1, "mode": "standard"},
                          connect_timeout=3, read_timeout=60,
                          s3={"addressing_style": "path"}))

    def describe(self) -> str:
        return f"S3 bucket {self.bucket!r} at {self.endpoint or 'AWS'} (COREL_S3_BUCKET, COREL_S3_ENDPOINT)"

    def key(self, digest: str) -> str:
        return f"{self.prefix}{check_digest(digest)}"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        from botocore.exceptions import (
            ConnectionClosedError,
            EndpointConnectionError,
            ReadTimeoutError,
        )

        deadline = time.monotonic() + self.wait_seconds
        pause = 0.25
        while True:
            try:
                return fn()
            except (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError,
                    ConnectionError) as exc:
                if time.monotonic() + pause > deadline:
                    raise StoreUnavailable(f"the artifact store did not answer ({what}): "
                                           f"{self.describe()}: {exc}") from exc
                log.warning("artifact store unreachable; trying again",
                            extra={"what": what, "pause": pause})
                time.sleep(pause)
                pause = min(pause * 2, 2.0)
            except Exception as exc:
                code = _error_code(exc)
                if code in {"500", "502", "503", "504", "SlowDown", "ServiceUnavailable",
                            "InternalError"} and time.monotonic() + pause <= deadline:
                    time.sleep(pause)
                    pause = min(pause * 2, 2.0)
                    continue
                raise

    def _store(self, path: Path, art: Artifact, move: bool = False) -> None:
        if self.exists(art.sha256):
            return
        from boto3.s3.transfer import TransferConfig

        # Multipart above 16 MB, in 16 MB parts: boto3 streams from the file.
        cfg = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                             max_concurrency=4)
        self._call("write", lambda: self.client.upload_file(
            str(path), self.bucket, self.key(art.sha256), Config=cfg,
            ExtraArgs={"Metadata": {"sha256": art.sha256}}))
        cached = self._cached(art.sha256)
        if move and not cached.exists():  # the writer's copy is this host's cache
            cached.parent.mkdir(parents=True, exist_ok=True)
            with _staged(cached) as tmp:
                os.replace(path, tmp)

    def _cached(self, digest: str) -> Path:
        return self.cache_dir / digest[:2] / digest

    def local_path(self, digest: str) -> Path:
        cached = self._cached(check_digest(digest))
        if cached.exists():
            return cached
        cached.parent.mkdir(parents=True, exist_ok=True)
        with _staged(cached) as tmp:
            def fetch() -> None:
                try:
                    self.client.download_file(self.bucket, self.key(digest), str(tmp))
                except Exception as exc:
                    if _error_code(exc) in {"404", "NoSuchKey", "NotFound"}:
                        raise ArtifactMissing(
                            f"no artifact {digest[:12]}... in the {self.describe()}") from None
                    raise
            self._call("read", fetch)
            self._verified(tmp, digest)
        return cached

    def exists(self, digest: str) -> bool:
        def head() -> bool:
            try:
                self.client.head_object(Bucket=self.bucket, Key=self.key(digest))
                return True
            except Exception as exc:
                if _error_code(exc) in {"404", "NoSuchKey", "NotFound"}:
                    return False
                raise
        return self._call("head", head)

    def delete(self, digest: str) -> bool:
        self._cached(digest).unlink(missing_ok=True)
        there = self.exists(digest)
        if there:
            self._call("delete", lambda: self.client.delete_object(
                Bucket=self.bucket, Key=self.key(digest)))
        return there

    def listing(self) -> Iterator[tuple[str, int, float]]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = self._call("list", lambda: list(paginator.paginate(Bucket=self.bucket,
                                                                   Prefix=self.prefix)))
        for page in pages:
            for obj in page.get("Contents", []):
                name = obj["Key"][len(self.prefix):]
                if DIGEST.match(name):
                    yield name, int(obj["Size"]), obj["LastModified"].timestamp()

    def check(self) -> None:
        try:
            self._call("check", lambda: self.client.head_bucket(Bucket=self.bucket))
        except StoreUnavailable:
            raise
        except Exception as exc:
            code = _error_code(exc)
            if code in {"404", "NoSuchBucket", "NotFound"}:
                raise StorageError(f"the S3 bucket {self.bucket!r} does not exist at "
                                   f"{self.endpoint or 'AWS'}: check COREL_S3_BUCKET") from exc
            if code in {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
                raise StorageError(f"S3 refused the credentials for bucket {self.bucket!r} ({code}): "
                                   "check COREL_S3_ACCESS_KEY and COREL_S3_SECRET_KEY") from exc
            raise StorageError(f"the S3 bucket {self.bucket!r} at {self.endpoint or 'AWS'} "
                               f"cannot be used ({code or type(exc).__name__}): check "
                               "COREL_S3_ENDPOINT and COREL_S3_BUCKET") from exc


def _error_code(exc: BaseException) -> str:
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


class _staged:
    """A temporary name beside ``target`` that becomes ``target`` on success."""

    def __init__(self, target: Path):
        self.target = target
        self.tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            os.replace(self.tmp, self.target)
        else:
            self.tmp.unlink(missing_ok=True)
