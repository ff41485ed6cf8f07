"""The artifact store (:mod:`app.storage.store`), the rows that reference its artifacts
(:mod:`app.storage.refs`), and how a session reaches it.

A process makes one store from its settings (:func:`make_store`) and attaches it to its
sessionmaker (:func:`attach`): every session then reaches it (:func:`store_of`), and the
artifacts a committed transaction stopped referencing are deleted once it has committed
(:func:`release_after_commit`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from app.core.settings import Settings
from app.storage.store import (
    Artifact,
    ArtifactMissing,
    ArtifactStore,
    DigestMismatch,
    LocalStore,
    S3Store,
    StorageError,
    StoreUnavailable,
    TooLarge,
)

T = TypeVar("T")

__all__ = ["Artifact", "ArtifactMissing", "ArtifactStore", "DigestMismatch", "LocalStore",
           "S3Store", "StorageError", "StoreUnavailable", "TooLarge", "attach", "ensure", "make_store",
           "read", "release_after_commit", "store_of"]

log = logging.getLogger("corel.storage")

INFO_KEY = "artifacts"
PENDING_KEY = "artifacts_released"


def make_store(settings: Settings) -> ArtifactStore:
    """The store the settings name: ``COREL_ARTIFACTS=local`` (the default, a folder) or
    ``s3`` (a bucket; this host's cache of it in the local folder)."""
    if settings.artifacts == "s3":
        return S3Store(endpoint=settings.s3_endpoint or None, bucket=settings.s3_bucket,
                       access_key=settings.s3_access_key.get_secret_value() or None,
                       secret_key=settings.s3_secret_key.get_secret_value() or None,
                       region=settings.s3_region, prefix=settings.s3_prefix,
                       cache_dir=settings.artifact_dir / "s3-cache",
                       wait_seconds=settings.s3_wait_seconds)
    return LocalStore(settings.artifact_dir)


def attach(factory: sessionmaker[Session], store: ArtifactStore) -> sessionmaker[Session]:
    """Make ``store`` the store of every session ``factory`` makes, and delete after each
    commit the artifacts it released (:func:`release_after_commit`)."""
    factory.configure(info={INFO_KEY: store})
    event.listen(factory, "after_commit", _after_commit)
    event.listen(factory, "after_soft_rollback", _after_rollback)
    return factory


def ensure(factory: sessionmaker[Session], settings: Settings) -> sessionmaker[Session]:
    """``factory`` with a store: the one attached to it, or the settings' own, attached now
    (a worker's task, or a test's sessionmaker, that made its factory without one)."""
    if INFO_KEY not in factory.kw.get("info", {}):
        attach(factory, make_store(settings))
    return factory


def store_of(session: Session) -> ArtifactStore:
    store = session.info.get(INFO_KEY)
    if store is None:
        raise RuntimeError("this session has no artifact store: its sessionmaker was made "
                           "without app.storage.attach(factory, make_store(settings))")
    return store


def read(session: Session, digest: str) -> bytes:
    """An artifact's bytes, verified against its digest."""
    return store_of(session).read_bytes(digest)


def read_parsed(session: Session, digest: str, parse: Callable[[memoryview, Path], T]) -> T:
    """``parse(view, file)`` of an artifact's bytes and the local file that holds them,
    verified against its digest (ArtifactStore.read_parsed)."""
    return store_of(session).read_parsed(digest, parse)


def release_after_commit(session: Session, digests: Iterable[str | None]) -> None:
    """Once this session's transaction has committed, delete each of ``digests`` that no
    row references any more (a row deleted, or pointed at a new artifact). A rollback
    forgets them."""
    pending: set[str] = session.info.setdefault(PENDING_KEY, set())
    pending.update(d for d in digests if d)


def _after_rollback(session: Session, previous_transaction: object) -> None:
    if not session.in_transaction():
        session.info.pop(PENDING_KEY, None)


def _after_commit(session: Session) -> None:
    pending = session.info.pop(PENDING_KEY, None)
    if not pending:
        return
    from app.storage.refs import free_unreferenced, give_back_pages

    bind = session.get_bind()
    try:
        with Session(bind) as fresh:
            if free_unreferenced(fresh, store_of(session), pending):
                give_back_pages(fresh)
    except Exception as exc:  # gc (corel gc, the periodic sweep) frees them later
        log.warning("artifacts not freed after commit: %s", exc, extra={
            "count": len(pending), "error": f"{type(exc).__name__}: {exc}"[:200]})
