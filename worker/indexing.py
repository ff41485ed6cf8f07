"""Index builds on a worker: an experiment's training split, or a batch embedding job's
rows, into a ``corel.index.VectorIndex``, stored in the database in pieces.

Claimed as a training run is (one conditional UPDATE, a lease kept fresh by a heartbeat
while the build runs), progress recorded between chunks of rows, cancellable there, and
stored in one transaction with the status ``succeeded``: a build that is lost, cancelled
or failed leaves no bytes behind.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import session_scope
from app.core.errors import DomainError
from app.core.models import NeighborIndex, Status
from app.core.settings import Settings
from app.jobs import events, lifecycle
from app.jobs.lifecycle import LostLease
from app.storage import ensure as ensure_store
from app.storage import store_of
from corel.geometry import Geometry
from worker.leases import lease_kept

log = logging.getLogger("corel.worker")


def build_index(index_id: int, factory: sessionmaker[Session], settings: Settings, warm: bool = False) -> str:
    """Claim, build (its lease kept fresh meanwhile), store; returns the status. ``warm``: the
    transaction that marks the index built also tells every API process to load it (and its
    run's model) now (app.jobs.events.publish_warm: a promotion's candidate, before its flip),
    so that the load starts as the index is built, not a transaction later."""
    factory = ensure_store(factory, settings)
    with session_scope(factory) as session:
        row = session.get(NeighborIndex, index_id)
        if row is None:
            return "gone"
        if not lifecycle.claim(session, index_id, settings, NeighborIndex):
            log.info("not claimed (finished, or running elsewhere)", extra={"index": index_id})
            return "skipped"
        session.refresh(row)
        if row.cancel_requested:
            lifecycle.end(session, index_id, Status.CANCELLED, NeighborIndex)
            return Status.CANCELLED
        source, job_id, geometry = row.source, row.embedding_job_id, row.geometry
        requested, experiment_id = row.requested_kind, row.experiment_id
    with lease_kept(factory, index_id, settings, NeighborIndex):
        return _build(index_id, factory, settings, source, job_id, geometry, requested, experiment_id, warm)


def _build(index_id: int, factory: sessionmaker[Session], settings: Settings, source: str, job_id: int | None,
           geometry: Geometry, requested: str, experiment_id: int, warm: bool = False) -> str:
    # Imported here: a worker that starts (after a crash, while runs wait) does not pay
    # for scikit-learn and the index's modules before it can train.
    from app.services.embedding_jobs import load_result
    from app.storage.artifacts import class_names, load_latent
    from corel.index import BuildCancelled, HnswParams, VectorIndex

    try:
        started = time.perf_counter()
        with session_scope(factory) as session:
            if source == "train":
                reps, labels = load_latent(session, experiment_id, "train")
                names: list[str] | None = class_names(session, experiment_id)
            else:
                assert job_id is not None
                reps, labels, names = load_result(session, job_id)
        n = len(labels)
        kind = requested if requested != "auto" else (
            "exact" if n < settings.index_exact_below_rows else "hnsw")
        last = 0.0

        def progress(done: int, total: int) -> bool:
            nonlocal last
            if time.monotonic() - last < 0.5 and done != total:
                return True
            last = time.monotonic()
            with session_scope(factory) as session:
                lifecycle.progress(session, index_id, NeighborIndex, n_total=total, n_done=done)
                return not lifecycle.cancel_requested(session, index_id, NeighborIndex)

        params = HnswParams(settings.hnsw_m, settings.hnsw_ef_construction)
        index = VectorIndex.build(reps, labels, geometry, kind, params=params,
                                  target_recall=settings.index_target_recall, progress=progress,
                                  class_names=names)
        del reps
        seconds = time.perf_counter() - started
        blob = index.to_bytes()
        with factory() as session:  # the file into the artifact store, then the row
            art = store_of(session).put_bytes(blob)
        with session_scope(factory) as session:
            if not lifecycle.end(
                    session, index_id, Status.SUCCEEDED, NeighborIndex, kind=kind, n_total=n, n_done=n, dim=index.dim, size_bytes=len(blob),
                    build_seconds=seconds, ef_search=index.ef_search, recall=index.recall,
                    params=None if kind == "exact" else {"m": params.m, "ef_construction": params.ef_construction},
                    sha256=art.sha256):
                raise LostLease(f"index {index_id} is no longer ours")
            if warm:  # sent with the commit that makes the index built
                events.publish_warm(session, experiment_id, index_id)
    except LostLease:
        log.warning("lost the lease; another worker continues", extra={"index": index_id})
        return "lost"
    except BuildCancelled:
        lifecycle.finish(factory, index_id, Status.CANCELLED, NeighborIndex)
        return Status.CANCELLED
    except (ValueError, DomainError) as exc:  # bad vectors; the source is gone
        log.warning("index build failed", extra={"index": index_id, "error": str(exc)})
        lifecycle.finish(factory, index_id, Status.FAILED, NeighborIndex, error=str(exc))
        return Status.FAILED
    log.info("index built", extra={"index": index_id, "kind": kind, "rows": n, "seconds": round(seconds, 2)})
    return Status.SUCCEEDED
