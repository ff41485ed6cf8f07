"""Nearest-neighbour indexes: POST /experiments/{id}/index, then /indexes/{index_id}."""

from __future__ import annotations

from fastapi import APIRouter, status

import app.services.indexes as indexes_service
from app.api.deps import AuthDep, QueueDep, SessionDep, SettingsDep
from app.core.models import NeighborIndex
from app.core.schemas.indexes import IndexCreate, IndexRead
from app.jobs.lifecycle import commit_and_send

router = APIRouter(tags=["indexes"])


@router.post(
    "/experiments/{experiment_id:int}/index", status_code=status.HTTP_202_ACCEPTED,
    response_model=IndexRead, dependencies=[AuthDep],
    summary="Build a nearest-neighbour index of the training split or a batch embedding job's rows",
)
def create(experiment_id: int, body: IndexCreate, session: SessionDep, queue: QueueDep,
           settings: SettingsDep):
    row = indexes_service.create_index(session, experiment_id, body, settings)
    # Committed before sending, as for an experiment: the worker must find the row.
    answer = IndexRead.model_validate(row)
    commit_and_send(session, NeighborIndex, [answer.id], lambda: queue.enqueue_index(answer.id),
                    "the index")
    return answer


@router.get("/experiments/{experiment_id:int}/indexes", response_model=list[IndexRead],
            summary="An experiment's indexes, newest first")
def list_for_experiment(experiment_id: int, session: SessionDep):
    return indexes_service.list_indexes(session, experiment_id)


@router.get("/indexes/{index_id:int}", response_model=IndexRead,
            summary="An index's status, kind, size and build seconds")
def get(index_id: int, session: SessionDep):
    return indexes_service.get_index(session, index_id)


@router.post("/indexes/{index_id:int}/cancel", response_model=IndexRead, dependencies=[AuthDep],
             summary="Cancel a build: at once if queued, between chunks of rows if running")
def cancel(index_id: int, session: SessionDep):
    return indexes_service.cancel_index(session, index_id)
