"""Batch embedding jobs: every row of an uploaded dataset through a trained encoder, on a
worker (not in the API), stored, and downloaded in the latent space's formats."""

from __future__ import annotations

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import Conflict, InvalidInput
from app.core.lookup import get_or_404, succeeded_experiment
from app.core.models import DatasetUpload, EmbeddingJob, EmbeddingResult, Status, utcnow
from app.jobs.lifecycle import cancel
from app.services.datasets import referenced_upload
from app.storage.artifacts import read_array
from corel.spec import MODALITY

# Upload kinds whose rows a job can read, and the modality each feeds.
EMBEDDABLE = {"npz": ("vector", "image"), "images": ("image",), "text": ("text",)}


def create_job(session: Session, experiment_id: int, dataset_id: int) -> EmbeddingJob:
    exp = succeeded_experiment(session, experiment_id, "a batch embedding job")
    upload = referenced_upload(session, dataset_id)
    modality = MODALITY[exp.dataset]
    allowed = EMBEDDABLE.get(upload.kind, ())
    if modality not in allowed:
        raise InvalidInput(
            f"dataset {dataset_id} is a {upload.kind!r} upload, which cannot feed experiment "
            f"{experiment_id}'s {modality} inputs; embed an upload of a kind that matches "
            f"({', '.join(k for k, m in EMBEDDABLE.items() if modality in m)})")
    now = utcnow()
    # The route sends its task right after the commit.
    job = EmbeddingJob(experiment_id=experiment_id, dataset_id=dataset_id, status=Status.QUEUED,
                       n_total=int(upload.summary.get("n", 0)), n_done=0, cancel_requested=False,
                       created_at=now, attempts=0, enqueued_at=now, enqueues=1)
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, job_id: int) -> EmbeddingJob:
    return get_or_404(session, EmbeddingJob, job_id, "embedding job")


def cancel_job(session: Session, job_id: int) -> EmbeddingJob:
    """Queued: cancelled at once. Running: flagged; the worker stops between batches."""
    return cancel(session, get_job(session, job_id), f"embedding job {job_id}")


def load_result(session: Session, job_id: int) -> tuple[np.ndarray, np.ndarray, list[str] | None]:
    """(representations, labels, the uploaded dataset's class names if it has them)."""
    job = get_job(session, job_id)
    if job.status != Status.SUCCEEDED:
        raise Conflict(f"embedding job {job_id} is {job.status}; its result needs a succeeded job",
                       status=job.status)
    row = session.scalars(select(EmbeddingResult).where(EmbeddingResult.job_id == job_id)).one()
    reps = read_array(session, row.representations_sha256, np.float32).reshape(job.n_total, -1)
    upload = session.get(DatasetUpload, job.dataset_id)
    names = upload.summary.get("class_names") if upload is not None else None
    labels = read_array(session, row.labels_sha256, np.int64)
    return reps, labels, [str(n) for n in names] if names else None
