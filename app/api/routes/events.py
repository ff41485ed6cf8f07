"""Live progress as Server-Sent Events: /experiments/{id}/events, /sweeps/{id}/events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import Response, StreamingResponse

import app.services.experiments as experiments_service
import app.services.sweeps as sweeps_service
from app.api.deps import SessionDep
from app.api.state import state_of
from app.jobs.progress_stream import experiment_position, stream, sweep_position

router = APIRouter()

LAST_EVENT_ID = ("Resume after this event: the `id` of the last event received. Only "
                 "later epochs, and a status that changed since, are sent. Not an id "
                 "this stream sent: 422.")
# One event of the stream (OpenAPI 3.1 has no itemSchema: for text/event-stream the
# schema describes each event, as OpenAPI 3.2's itemSchema does; its data is JSON).
EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {"type": "string", "description": "Send it back as Last-Event-ID to resume."},
        "event": {"type": "string", "enum": ["status", "epoch"]},
        "data": {
            "type": "string", "contentMediaType": "application/json",
            "description": "status: {experiment_id, status, current_epoch, epochs_total, "
                           "best_epoch, best_val_accuracy, test_accuracy, error}; epoch: "
                           "{experiment_id, epoch, epochs_total, train_loss, train_accuracy, "
                           "val_accuracy, test_accuracy, is_best, seconds}.",
        },
    },
    "additionalProperties": False,
}
EVENT_STREAM: dict[int | str, dict[str, Any]] = {200: {
    "description": "A text/event-stream of `status` and `epoch` events, each with an `id` "
                   "and JSON `data`, and a `: keepalive` comment after 15 s of silence; it "
                   "ends after the last terminal status.",
    "content": {"text/event-stream": {"schema": EVENT_SCHEMA}},
}}


def _sse(events: AsyncIterator[bytes]) -> StreamingResponse:
    # No caching, and no buffering by proxies (nginx honours X-Accel-Buffering).
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get(
    "/experiments/{experiment_id:int}/events", tags=["experiments"],
    response_class=Response, responses=EVENT_STREAM,
    summary="Live progress: a status event, every epoch, then each new epoch and status",
)
def experiment_events(
    experiment_id: int, request: Request, session: SessionDep,
    last_event_id: Annotated[str | None, Header(description=LAST_EVENT_ID)] = None,
) -> StreamingResponse:
    experiments_service.get_experiment(session, experiment_id)  # 404 before any stream
    sent = experiment_position(last_event_id)
    state = state_of(request)
    return _sse(stream(state.events, state.sessionmaker, [experiment_id], [sent], sweep=False))


@router.get(
    "/sweeps/{sweep_id:int}/events", tags=["sweeps"],
    response_class=Response, responses=EVENT_STREAM,
    summary="Live progress of every member of a sweep; ends when all have finished",
)
def sweep_events(
    sweep_id: int, request: Request, session: SessionDep,
    last_event_id: Annotated[str | None, Header(description=LAST_EVENT_ID)] = None,
) -> StreamingResponse:
    sweeps_service.get_sweep(session, sweep_id)
    members = sweeps_service.member_ids(session, sweep_id)
    sent = sweep_position(last_event_id, len(members))
    state = state_of(request)
    return _sse(stream(state.events, state.sessionmaker, members, sent, sweep=True))
