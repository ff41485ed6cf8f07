"""Request dependencies: settings, the session that commits in one place, auth."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import anyio.to_thread
from fastapi import Depends, Request
from fastapi.dependencies.utils import request_params_to_args
from sqlalchemy.orm import Session

import app.services.models as models_service
from app.access import audit, policy
from app.access.tokens import Principal
from app.api.state import state_of
from app.core.db import read_session, session_scope
from app.core.errors import DomainError, Forbidden, Unauthorized
from app.core.settings import Settings
from app.jobs.queue import TaskQueue
from app.services.models import Searched, Served


def get_settings(request: Request) -> Settings:
    return state_of(request).settings


def get_session(request: Request) -> Iterator[Session]:
    """A session that commits when the handler returns, before the answer is sent.

    ``SessionDep`` gives it ``scope="function"``: FastAPI then runs the code after the
    ``yield`` (the commit) before it sends the response, so a 2xx always stands for a
    committed write, and a failed commit becomes an error answer instead of a lost write.
    (With the default request scope it would run only after the response has gone.)

    The session carries the request's principal (its new rows get their owner from it),
    and a write's audit entry is committed with it (app/access/audit.py); a write that
    fails is recorded once the session has been rolled back.
    """
    draft = None
    factory = state_of(request).sessionmaker
    try:
        with session_scope(factory) as session:
            draft = audit.begin(session, request)
            yield session
    except Exception as exc:
        if draft is not None:
            audit.record_failure(factory, draft, exc)
        raise


def get_read_session(request: Request) -> Iterator[Session]:
    """A session for a route that only reads (the hot lists and single reads): its statements
    run without a transaction around them (the connection in autocommit), which saves the
    BEGIN and COMMIT round trips of :func:`get_session` (a read took four, a list five).
    Each statement sees what was committed when it ran. It carries the principal, as
    :func:`get_session`'s does, for the access checks; a write through it is a bug."""
    with read_session(state_of(request).sessionmaker) as session:
        session.info["principal"] = getattr(request.state, "principal", None)
        yield session


def get_queue(request: Request) -> TaskQueue:
    return state_of(request).queue


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
ReadSessionDep = Annotated[Session, Depends(get_read_session)]
QueueDep = Annotated[TaskQueue, Depends(get_queue)]


def get_principal(request: Request) -> Principal:
    """Who the request acts for, as :class:`app.api.middleware.RequestGuard` found it."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None:
        raise Unauthorized("this endpoint needs an 'Authorization: Bearer <token>' header")
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_token(principal: PrincipalDep) -> None:
    """Mutating endpoints need a token that may write.

    :class:`app.api.middleware.RequestGuard` has checked this before the body was read; this
    dependency keeps the routes safe on their own (and documents them in OpenAPI).
    """
    if not principal.can_write:
        raise Forbidden("this token may only read (scope read)")


AuthDep = Depends(require_token)


async def require_access(request: Request, kind: str, row_id: int, need: policy.Need = "read") -> None:
    """:func:`app.access.policy.check` for a row a request names outside its path (the
    experiment of /embed and /predict), in a session of its own; admins pass without a
    query, so the hot inference path of the open mode never waits on the database."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None or principal.admin:
        return

    def check() -> None:
        with read_session(state_of(request).sessionmaker) as session:
            policy.check(session, principal, kind, row_id, need)

    await anyio.to_thread.run_sync(check)


async def resolve_model(request: Request, ref: str) -> Served:
    """The run that answers for model reference ``ref`` (``"news:3"``), if the request's
    principal may read the model (app.services.models.resolve), in a session of its own."""
    principal: Principal | None = getattr(request.state, "principal", None)

    def resolve() -> Served:
        with read_session(state_of(request).sessionmaker) as session:
            session.info["principal"] = principal
            return models_service.resolve(session, ref)

    return await anyio.to_thread.run_sync(resolve)


async def search_collection(request: Request, name: str, alias: str, dataset_id: int) -> Searched:
    """The version ``name@alias`` names and its index of collection ``dataset_id``, if the
    request's principal may read the model (app.services.models.collection_index)."""
    principal: Principal | None = getattr(request.state, "principal", None)

    def find() -> Searched:
        with read_session(state_of(request).sessionmaker) as session:
            session.info["principal"] = principal
            return models_service.collection_index(session, name, alias, dataset_id)

    return await anyio.to_thread.run_sync(find)


async def check_path_access(request: Request) -> None:
    """Every row the path names (an experiment, a sweep, an upload, a job, an index) must
    be one the principal may read, or change when the request changes it
    (:func:`app.access.policy.check_path`): a 404 otherwise, or a 403, audited when the
    request is a write. Installed on the whole app, so that no route can forget it; admins
    pass without a query."""
    principal: Principal | None = getattr(request.state, "principal", None)
    if principal is None or principal.admin:
        return
    params = request.path_params
    if not any(isinstance(params.get(name), int) for name in policy.PATH_PARAMS):
        return

    def check() -> None:
        with read_session(state_of(request).sessionmaker) as session:
            policy.check_path(session, principal, request.method, request.url.path, params)

    try:
        await anyio.to_thread.run_sync(check)
    except DomainError as exc:
        if query_is_invalid(request):
            return  # its 422 comes first, as for an admin: no row is looked up for it
        # A refused write is audited all the same.
        await anyio.to_thread.run_sync(audit.record_refusal, state_of(request).sessionmaker,
                                       request, principal, exc.status_code, exc.detail)
        raise


def query_is_invalid(request: Request) -> bool:
    """Whether the query string fails the route's own query parameters (FastAPI checks
    them only after the app-wide dependencies)."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None:
        return False
    _, errors = request_params_to_args(dependant.query_params, request.query_params)
    return bool(errors)
