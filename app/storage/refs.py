"""Which rows reference which artifacts, and freeing those nothing references.

An artifact is referenced by the digest columns listed in :data:`REFERENCES`; its count is
the number of rows naming it there, computed when asked (never a counter kept beside the
rows, which a crash could leave wrong). An artifact is deleted once nothing references it:

- right after the commit that released it (a deleted experiment, a resume checkpoint
  replaced by the next epoch's: :func:`app.storage.release_after_commit`);
- by :func:`collect` (``corel gc``, and the API's periodic sweep) when it was never
  referenced, or its release was missed: an artifact written by a process that died before
  it committed its row. Only artifacts older than the grace period go, so that one being
  written, whose row is not yet committed, is spared.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select, union_all
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker

from app.core.models import (
    Checkpoint,
    DatasetUpload,
    EmbeddingJob,
    EmbeddingResult,
    EncoderUpload,
    FeatureSet,
    Figure,
    LatentSpace,
    NeighborIndex,
)
from app.storage.store import ArtifactStore

log = logging.getLogger("corel.storage")

# Every column that holds an artifact's digest. A new kind of artifact adds its column here.
REFERENCES: tuple[InstrumentedAttribute[Any], ...] = (
    Checkpoint.sha256, DatasetUpload.blob_sha256, EncoderUpload.sha256,
    LatentSpace.representations_sha256, LatentSpace.labels_sha256, LatentSpace.rows_sha256, Figure.sha256,
    EmbeddingResult.representations_sha256, EmbeddingResult.labels_sha256, NeighborIndex.sha256,
    FeatureSet.sha256)


def of_experiment(session: Session, experiment_id: int) -> set[str]:
    """The digests of every artifact under an experiment (its checkpoints, latent spaces,
    figures, batch embedding results and indexes): what deleting it may free."""
    found: set[str] = set()
    for column, owner in ((Checkpoint.sha256, Checkpoint.experiment_id),
                          (LatentSpace.representations_sha256, LatentSpace.experiment_id),
                          (LatentSpace.labels_sha256, LatentSpace.experiment_id),
                          (LatentSpace.rows_sha256, LatentSpace.experiment_id),
                          (Figure.sha256, Figure.experiment_id),
                          (NeighborIndex.sha256, NeighborIndex.experiment_id)):
        found.update(d for d in session.scalars(select(column).where(owner == experiment_id)) if d)
    for column in (EmbeddingResult.representations_sha256, EmbeddingResult.labels_sha256):
        found.update(session.scalars(select(column).join(
            EmbeddingJob, EmbeddingJob.id == EmbeddingResult.job_id).where(
            EmbeddingJob.experiment_id == experiment_id)))
    return found


def referenced(session: Session, digests: Iterable[str] | None = None) -> set[str]:
    """The digests among ``digests`` (default: all) that some row references."""
    wanted = None if digests is None else sorted(set(digests))
    found: set[str] = set()
    if wanted is None:
        for column in REFERENCES:
            found.update(d for d in session.scalars(select(column).distinct()) if d)
        return found
    # One query over every column (a UNION ALL), not one a column: a run releases its last
    # epoch's resume checkpoint after each epoch's commit, and the eleven round trips were a
    # third of a short epoch's bookkeeping (a few-shot member's 100 one-step epochs: 0.89 s of
    # 2.6). Each query's digests appear once a column: at most 999 parameters in all, the
    # limit of SQLite's builds before 3.32.
    size = 999 // len(REFERENCES)
    for at in range(0, len(wanted), size):
        part = wanted[at:at + size]
        found.update(d for d in session.scalars(union_all(
            *(select(column.label("digest")).where(column.in_(part)) for column in REFERENCES))) if d)
    return found


def free_unreferenced(session: Session, store: ArtifactStore, digests: Iterable[str]) -> int:
    """Delete each of ``digests`` that no row references; how many were deleted."""
    digests = set(digests)
    return sum(store.delete(d) for d in sorted(digests - referenced(session, digests)))


@dataclass
class Collected:
    """What a gc pass found: artifacts removed (and their bytes), and those kept."""

    removed: int
    freed_bytes: int
    kept: int
    spared_young: int
    features_dropped: int = 0
    """Kept features (:class:`app.core.models.FeatureSet`) dropped, unused for the days."""


def collect(session: Session, store: ArtifactStore, grace_seconds: float,
            now: float | None = None, features_keep_seconds: float | None = None) -> Collected:
    """Remove every stored artifact that no row references and that is older than
    ``grace_seconds``; first, the kept features unused for ``features_keep_seconds`` (None:
    kept), whose artifacts then go with the other orphans."""
    now = time.time() if now is None else now
    dropped = 0
    if features_keep_seconds is not None:
        stale = datetime.fromtimestamp(now - features_keep_seconds, UTC)
        result = session.execute(delete(FeatureSet).where(FeatureSet.used_at < stale))
        dropped = int(getattr(result, "rowcount", 0) or 0)
        session.commit()
        if dropped:
            log.info("kept features dropped, unused", extra={"feature_sets": dropped})
    listing = list(store.listing())
    keep = referenced(session)
    removed = freed = kept = young = 0
    for digest, size, written in listing:
        if digest in keep:
            kept += 1
        elif now - written < grace_seconds:
            young += 1
        elif store.delete(digest):
            removed += 1
            freed += size
    if removed:
        log.info("artifacts collected", extra={"removed": removed, "freed_bytes": freed})
    return Collected(removed, freed, kept, young, dropped)


def give_back_pages(session: Session) -> None:
    """SQLite: return the free pages of deleted rows to the file system (the database is
    in incremental auto-vacuum mode, app.core.migrate); nothing elsewhere."""
    if session.get_bind().dialect.name != "sqlite":
        return
    session.commit()
    raw = session.connection().connection.dbapi_connection
    assert raw is not None
    # One freed page a step: executescript steps it to the end (execute steps once).
    raw.executescript("PRAGMA incremental_vacuum;")
    # The write-ahead log holds what was written until a checkpoint: back into the file,
    # which shrinks, and the log truncated (skipped, not waited for, while others read).
    raw.executescript("PRAGMA wal_checkpoint(TRUNCATE);")


def collect_in_background(factory: sessionmaker[Session], store: ArtifactStore,
                          every: float, grace: float, features_keep: float | None = None) -> threading.Event:
    """:func:`collect` every ``every`` seconds in a daemon thread, until the returned event
    is set (the API's lifespan); 0: never."""
    stop = threading.Event()
    if every <= 0:
        return stop

    def run() -> None:
        while not stop.wait(every):
            try:
                with factory() as session:
                    collect(session, store, grace, features_keep_seconds=features_keep)
                    give_back_pages(session)
            except Exception as exc:  # the next pass tries again
                log.warning("artifact gc failed", extra={"error": f"{type(exc).__name__}: {exc}"[:200]})

    threading.Thread(target=run, name="corel-artifact-gc", daemon=True).start()
    return stop
