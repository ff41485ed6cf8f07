"""Request dependencies: settings, the session that commits in one place, auth."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from app.auth import token_problem
from app.db import session_scope
from app.errors import Unauthorized
from app.queue import TaskQueue
from app.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """A session that commits when the handler returns, before the answer is sent.

    ``SessionDep`` gives it ``scope="function"``: FastAPI then runs the code after the
    ``yield`` (the commit) before it sends the response, so a 2xx always stands for a
    committed write, and a failed commit becomes an error answer instead of a lost write.
    (With the default request scope it would run only after the response has gone.)
    """
    with session_scope(request.app.state.sessionmaker) as session:
        yield session


def get_queue(request: Request) -> TaskQueue:
    queue: TaskQueue = request.app.state.queue
    return queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
QueueDep = Annotated[TaskQueue, Depends(get_queue)]


def require_token(request: Request, settings: SettingsDep) -> None:
    """When COREL_API_TOKEN is set, mutating endpoints need 'Authorization: Bearer <token>'.

    :class:`app.middleware.RequestGuard` has checked this before the body was read; this
    dependency keeps the routes safe on their own (and documents them in OpenAPI).
    """
    if settings.api_token is None:
        return
    problem = token_problem(settings, request.headers.get("authorization", ""))
    if problem is not None:
        raise Unauthorized(problem)


AuthDep = Depends(require_token)
