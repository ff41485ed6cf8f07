"""Batch embedding jobs: POST /experiments/{id}/embeddings, then /embeddings/{job_id}."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

import app.services.embedding_jobs as jobs_service
from app.api.deps import AuthDep, QueueDep, SessionDep
from app.api.routes.analysis import LATENT_FORMATS, LatentFormat
from app.core.models import EmbeddingJob
from app.core.schemas.jobs import EmbeddingJobCreate, EmbeddingJobRead
from app.jobs.lifecycle import commit_and_send
from app.services.figures import latent_file

router = APIRouter(tags=["embedding jobs"])


@router.post(
    "/experiments/{experiment_id:int}/embeddings", status_code=status.HTTP_202_ACCEPTED,
    response_model=EmbeddingJobRead, dependencies=[AuthDep],
    summary="Embed every row of an uploaded dataset on a worker; poll, cancel, then download",
)
def create(experiment_id: int, body: EmbeddingJobCreate, session: SessionDep, queue: QueueDep):
    job = jobs_service.create_job(session, experiment_id, body.dataset_id)
    # Committed before sending, as for an experiment: the worker must find the row. The
    # answer is read before, so that it needs no database once the row is committed.
    answer = EmbeddingJobRead.model_validate(job)
    commit_and_send(session, EmbeddingJob, [answer.id], lambda: queue.enqueue_embedding(answer.id),
                    "the embedding job")
    return answer


@router.get("/embeddings/{job_id:int}", response_model=EmbeddingJobRead,
            summary="A batch embedding job's progress (n_done of n_total rows)")
def get(job_id: int, session: SessionDep):
    return jobs_service.get_job(session, job_id)


@router.post("/embeddings/{job_id:int}/cancel", response_model=EmbeddingJobRead,
             dependencies=[AuthDep], summary="Cancel: at once if queued, between batches if running")
def cancel(job_id: int, session: SessionDep):
    return jobs_service.cancel_job(session, job_id)


@router.get(
    "/embeddings/{job_id:int}/result", response_class=Response,
    responses={200: {"content": {v.split(";")[0]: {} for v in LATENT_FORMATS.values()},
                     "description": "Every row's representation with its label"}},
    summary="Download a finished job's representations: npy (a structured array), csv or parquet",
)
def result(
    job_id: int, session: SessionDep,
    format_: Annotated[LatentFormat, Query(alias="format")] = "npy",
) -> Response:
    reps, labels, names = jobs_service.load_result(session, job_id)
    name = f"embedding-job-{job_id}.{format_}"
    return Response(latent_file(reps, labels, format_, names), media_type=LATENT_FORMATS[format_],
                    headers={"content-disposition": f'attachment; filename="{name}"'})
