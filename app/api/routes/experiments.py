"""/experiments: submit, list, inspect, cancel and delete training runs."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, status
from pydantic import AfterValidator

import app.services.experiments as experiments_service
from app.api.deps import AuthDep, QueueDep, ReadSessionDep, SessionDep, SettingsDep
from app.api.state import state_of
from app.core.errors import MAX_ID, MAX_OFFSET, PAGE_LIMIT
from app.core.models import Experiment
from app.core.schemas.common import Page, Status
from app.core.schemas.experiments import (
    EpochMetricRead,
    ExperimentCreate,
    ExperimentQueued,
    ExperimentRead,
    MetricsRead,
)
from app.jobs.lifecycle import commit_and_send
from app.services.builtin import require_available, require_rows
from corel.loss_catalog import DECLARATIONS, declaration
from corel.spec import DatasetName

router = APIRouter(prefix="/experiments", tags=["experiments"])


@router.post(
    "", status_code=status.HTTP_202_ACCEPTED, response_model=ExperimentQueued,
    dependencies=[AuthDep],
    summary="Submit an experiment; it is queued for a worker",
)
def create(body: ExperimentCreate, session: SessionDep, queue: QueueDep, settings: SettingsDep):
    if body.dataset_id is None:
        require_available(settings, {body.dataset})
        require_rows(settings, {(body.dataset, body.train_subset)})
    exp = experiments_service.create_experiment(session, body)
    # The task carries only the id, sent once the row is committed; this is the one
    # route that commits before returning, because whether sending works decides the
    # answer (app/jobs/lifecycle.py).
    experiment_id = exp.id
    commit_and_send(session, Experiment, [experiment_id],
                    lambda: queue.enqueue_training(experiment_id), "the experiment")
    return ExperimentQueued(id=experiment_id, status="queued", warnings=body.warnings)


def _known_loss_or_any(value: str | None) -> str | None:
    if value:
        declaration(value)  # ValueError naming the allowed losses: a 422
    return value


def _loss_filter_enum(schema: dict) -> None:
    schema["enum"] = [*DECLARATIONS, ""]


@router.get("", response_model=Page[ExperimentRead], summary="List experiments, newest first")
def list_(
    session: ReadSessionDep,
    settings: SettingsDep,
    # Empty means any (as a form's "all" option sends it).
    status_: Annotated[Status | Literal[""] | None, Query(alias="status")] = None,
    dataset: DatasetName | Literal[""] | None = None,
    loss: Annotated[str | None, AfterValidator(_known_loss_or_any),
                    Query(max_length=64, description="only this loss (GET /losses); empty: any",
                          json_schema_extra=_loss_filter_enum)] = None,
    sweep_id: Annotated[int | None, Query(ge=1, le=MAX_ID, description="only this sweep's members")] = None,
    limit: Annotated[int, Query(ge=1, description=PAGE_LIMIT)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
):
    limit = min(limit, settings.page_size_limit)
    rows, total = experiments_service.list_experiments(
        session, status=status_ or None, dataset=dataset or None, loss=loss or None, limit=limit,
        offset=offset,
        sweep_id=sweep_id,
    )
    return Page[ExperimentRead](
        items=[ExperimentRead.model_validate(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{experiment_id:int}", response_model=ExperimentRead, summary="One experiment")
def get(experiment_id: int, session: ReadSessionDep):
    return experiments_service.get_experiment(session, experiment_id)


@router.get("/{experiment_id:int}/metrics", response_model=MetricsRead, summary="Every epoch's figures")
def metrics(experiment_id: int, session: ReadSessionDep):
    rows = experiments_service.get_metrics(session, experiment_id)
    return MetricsRead(
        experiment_id=experiment_id, items=[EpochMetricRead.model_validate(r) for r in rows]
    )


@router.post(
    "/{experiment_id:int}/cancel", response_model=ExperimentRead, dependencies=[AuthDep],
    summary="Cancel: at once if queued, between batches if running",
)
def cancel(experiment_id: int, session: SessionDep):
    return experiments_service.cancel_experiment(session, experiment_id)


@router.delete(
    "/{experiment_id:int}", status_code=status.HTTP_204_NO_CONTENT, dependencies=[AuthDep],
    summary="Delete a finished experiment with its metrics, checkpoints and latent spaces",
)
def delete(experiment_id: int, session: SessionDep, request: Request) -> None:
    experiments_service.delete_experiment(session, experiment_id)
    state_of(request).model_cache.invalidate(experiment_id)
