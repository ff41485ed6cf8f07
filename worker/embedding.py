"""Batch embedding jobs on a worker: every row of an uploaded dataset through the
experiment's best checkpoint, in batches, with progress and cancellation between them."""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import session_scope
from app.core.models import Checkpoint, DatasetUpload, EmbeddingJob, EmbeddingResult, Status
from app.core.settings import Settings
from app.jobs import lifecycle
from app.jobs.lifecycle import LostLease
from app.storage import ensure as ensure_store
from app.storage import read as read_artifact
from app.storage.artifacts import put_array
from app.storage.local_copies import files_for_model, materialise_upload
from corel.serving import BATCH, ServedModel
from corel.train import checkpoint_from_bytes

log = logging.getLogger("corel.worker")
# BATCH (corel.serving): rows per forward pass, and between two progress commits.


def upload_rows(path: Any, kind: str) -> tuple[Any, np.ndarray]:
    """The upload's inputs (array or texts) and labels, every row, in file order."""
    with np.load(path, allow_pickle=False) as loaded:
        y = np.asarray(loaded["y"]).reshape(-1)
        if kind == "text":
            return [str(t) for t in loaded["texts"]], y
        return np.asarray(loaded["x"]), y


def _labels(y: np.ndarray) -> np.ndarray:
    """Labels as stored: integers as they are; strings (or anything else) by sorted value."""
    if y.dtype.kind in "iub":
        return y.astype(np.int64)
    return np.unique(y, return_inverse=True)[1].reshape(-1).astype(np.int64)


def embed_dataset(job_id: int, factory: sessionmaker[Session], settings: Settings) -> str:
    """Claim the job (as a training run is claimed: one conditional UPDATE, with a lease
    kept fresh between batches), embed every row, store the result; returns the status."""
    factory = ensure_store(factory, settings)
    with session_scope(factory) as session:
        job = session.get(EmbeddingJob, job_id)
        if job is None:
            return "gone"
        if not lifecycle.claim(session, job_id, settings, EmbeddingJob):
            log.info("not claimed (finished, or running elsewhere)", extra={"job": job_id})
            return "skipped"
        session.refresh(job)
        if job.cancel_requested:
            lifecycle.end(session, job_id, Status.CANCELLED, EmbeddingJob)
            return Status.CANCELLED
        digest = session.scalar(select(Checkpoint.sha256).where(
            Checkpoint.experiment_id == job.experiment_id, Checkpoint.kind == "best"))
        blob = read_artifact(session, digest) if digest is not None else None
        kind = session.scalar(select(DatasetUpload.kind).where(DatasetUpload.id == job.dataset_id))
        path = materialise_upload(session, job.dataset_id, settings)
        checkpoint = checkpoint_from_bytes(blob) if blob is not None else None
        encoder_files = None
        if checkpoint is not None:  # a model on the user's own encoder: its files here first
            encoder_files = files_for_model(session, settings, json.loads(checkpoint["preprocessing"]))
    try:
        if checkpoint is None or kind is None:
            raise ValueError("the experiment's checkpoint or the dataset no longer exists")
        served = ServedModel.from_checkpoint(checkpoint, settings.device, encoder_files)  # the API's own pipeline
        inputs, y = upload_rows(path, kind)
        n = len(inputs)
        parts = []
        for start in range(0, n, BATCH):
            parts.append(served.embed(served.prepare(inputs[start:start + BATCH])).numpy())
            with session_scope(factory) as session:
                # Progress and the heartbeat in one statement, only while the job is ours.
                lifecycle.progress(session, job_id, EmbeddingJob, n_total=n,
                                   n_done=min(n, start + BATCH))
                cancel = lifecycle.cancel_requested(session, job_id, EmbeddingJob)
            if cancel:
                lifecycle.finish(factory, job_id, Status.CANCELLED, EmbeddingJob)
                return Status.CANCELLED
        reps = np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros((0, served.dim), np.float32))
    except LostLease:
        log.warning("lost the lease; another worker continues", extra={"job": job_id})
        return "lost"
    except (ValueError, KeyError) as exc:
        log.warning("embedding job failed", extra={"job": job_id, "error": str(exc)})
        lifecycle.finish(factory, job_id, Status.FAILED, EmbeddingJob, error=str(exc))
        return Status.FAILED
    # The arrays into the artifact store first, then the row that names them.
    with factory() as session:
        stored = put_array(session, reps.astype(np.float32, copy=False))
        labels = put_array(session, _labels(y))
    with session_scope(factory) as session:
        if not lifecycle.end(session, job_id, Status.SUCCEEDED, EmbeddingJob,
                             n_total=n, n_done=n, dim=int(reps.shape[1])):
            log.warning("lost the lease before storing; another worker continues", extra={"job": job_id})
            return "lost"
        session.merge(EmbeddingResult(job_id=job_id, representations_sha256=stored.sha256,
                                      labels_sha256=labels.sha256))
    log.info("embedding job done", extra={"job": job_id, "rows": n})
    return Status.SUCCEEDED
