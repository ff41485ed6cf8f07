"""/sweeps: grids of experiments and the paper's tables from their results."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, status

import app.services.sweeps as sweeps_service
from app.api.deps import AuthDep, QueueDep, ReadSessionDep, SessionDep, SettingsDep
from app.core.errors import MAX_OFFSET, PAGE_LIMIT
from app.core.models import Experiment
from app.core.schemas.common import Page
from app.core.schemas.sweeps import SweepCreate, SweepQueued, SweepRead, SweepSummary
from app.jobs.lifecycle import commit_and_send
from app.services import sweep_render
from app.services.builtin import require_available, require_rows
from corel.report import PAPER_TABLE1

router = APIRouter(prefix="/sweeps", tags=["sweeps"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=SweepQueued,
             dependencies=[AuthDep], summary="Create and queue every experiment of a grid")
def create(body: SweepCreate, session: SessionDep, queue: QueueDep, settings: SettingsDep):
    sweep, groups = sweeps_service.create_sweep(session, body, settings.max_sweep_size,
                                                settings.max_group_size, settings)
    require_available(settings, sweeps_service.builtin_datasets(session, sweep.id))
    require_rows(settings, sweeps_service.builtin_subsets(session, sweep.id))
    # Committed before sending, as for a single experiment: workers must find the rows.
    answer = SweepQueued(id=sweep.id, size=sweep.size, groups=len(groups), member_groups=groups)
    commit_and_send(session, Experiment, [i for ids in groups for i in ids],
                    lambda: queue.enqueue_groups(groups), "the sweep", sweep_id=answer.id)
    return answer


@router.get("", response_model=Page[SweepSummary], summary="List sweeps, newest first")
def list_(
    session: ReadSessionDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, description=PAGE_LIMIT)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
):
    limit = min(limit, settings.page_size_limit)
    items, total = sweeps_service.list_sweeps(session, limit, offset)
    return Page[SweepSummary](items=[SweepSummary.model_validate(i) for i in items], total=total,
                              limit=limit, offset=offset)


@router.get("/{sweep_id:int}", response_model=SweepRead, summary="Progress of a sweep")
def get(sweep_id: int, session: ReadSessionDep):
    return sweeps_service.progress(session, sweeps_service.get_sweep(session, sweep_id))


@router.post("/{sweep_id:int}/cancel", response_model=SweepRead, dependencies=[AuthDep],
             summary="Cancel every member that has not finished")
def cancel(sweep_id: int, session: SessionDep):
    sweep = sweeps_service.cancel_sweep(session, sweep_id)
    return sweeps_service.progress(session, sweep)


@router.get("/{sweep_id:int}/report", summary="The paper's Tables 1-4 from the sweep's results",
            responses={200: {"content": {"text/csv": {"schema": {"type": "string"}},
                                         "text/markdown": {"schema": {"type": "string"}}},
                             "description": "JSON; or ?format=csv, ?format=markdown"}})
def report(
    sweep_id: int,
    session: SessionDep,
    format: Annotated[Literal["json", "csv", "markdown"], Query()] = "json",
    clustering: bool = True,
):
    rep = sweeps_service.build_report(session, sweep_id, clustering=clustering)
    if format == "csv":
        return Response(sweep_render.to_csv(rep), media_type="text/csv")
    if format == "markdown":
        paper = PAPER_TABLE1.get((rep["dataset"], rep["model"]))
        return Response(sweep_render.to_markdown(rep, paper), media_type="text/markdown")
    return rep


@router.get("/{sweep_id:int}/lambda.png", summary="Validation accuracy against lambda per loss",
            response_class=Response, responses={200: {"content": {"image/png": {}}}})
def lambda_png(sweep_id: int, session: SessionDep) -> Response:
    rep = sweeps_service.build_report(session, sweep_id, clustering=False)
    return Response(sweep_render.lambda_png(rep), media_type="image/png")
