"""The audit log: every write through the API, who made it, on which row, how it ended.

:func:`begin` is called by :func:`app.api.deps.get_session` for each request. For a write it
adds the entry to the request's own session just before that session commits, so the
entry and the write are committed together or not at all (a route that commits early,
such as ``POST /experiments`` before it sends the task, commits the entry with it). A
write that fails is recorded by :func:`record_failure` in a transaction of its own, once
the request's has been rolled back ("refused" where the token or the access check of a row
it names said no, "failed" otherwise). A write refused before its handler runs (a token whose
scope does not allow it, in :class:`app.api.middleware.RequestGuard`; a row its path names that
the user may not see or change, in :func:`app.api.deps.check_path_access`) is recorded by
:func:`record_refusal`, with the outcome "refused", also in a transaction of its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy import ColumnElement, event, select, update
from sqlalchemy.orm import Session, sessionmaker
from starlette.exceptions import HTTPException

from app.access import policy
from app.access.tokens import Principal, is_admin_path, is_write
from app.core.db import session_scope
from app.core.errors import MAX_ID, DomainError, Forbidden, Unauthorized
from app.core.lookup import page_of
from app.core.models import ApiToken, AuditEntry, Share, User

log = logging.getLogger("corel.api")

# What a created row is called in the log.
CREATED: dict[type[Any], str] = {**{model: kind for kind, (model, _) in policy.KINDS.items()},
           User: "user", ApiToken: "token", Share: "share"}
# Where a service that finds the row a write acts on by another key than an id in the path
# (a model by name) leaves (kind, id) for the entry: ``session.info[AUDIT_RESOURCE]``.
AUDIT_RESOURCE = "audit_resource"
PATH_KINDS = {**policy.PATH_PARAMS, "user_id": "user", "token_id": "token"}


@dataclass
class Draft:
    principal: Principal | None
    client: str | None
    action: str
    status: int | None
    resource: str | None = None
    resource_id: int | None = None
    entry: AuditEntry | None = None
    committed: bool = False

    def row(self, outcome: str, status: int | None, detail: str | None = None) -> AuditEntry:
        p = self.principal
        return AuditEntry(user_id=p.user_id if p else None, token_id=p.token_id if p else None,
                          client=self.client, action=self.action[:160], resource=self.resource,
                          resource_id=self.resource_id, outcome=outcome, status=status,
                          detail=detail[:500] if detail else None)


def draft_of(request: Request, principal: Principal | None) -> Draft:
    """The entry a request would leave: its route's template once it is routed (its path
    before), and the first row its path names."""
    route = request.scope.get("route")
    template = getattr(route, "path", request.url.path).replace(":int", "")
    client = request.client.host if request.client else None
    draft = Draft(principal, client, f"{request.method} {template}",
                  getattr(route, "status_code", None) or 200)
    for name, kind in PATH_KINDS.items():
        value = request.path_params.get(name)
        if isinstance(value, int):
            # An id no row can have (past PostgreSQL's integer) is left out, not written:
            # the entry would fail to insert and the refusal go unrecorded.
            draft.resource, draft.resource_id = kind, value if 1 <= value <= MAX_ID else None
            break
    return draft


def begin(session: Session, request: Request) -> Draft | None:
    """Bind the request's principal to ``session`` (owners, access checks) and, for a
    write, arrange for its audit entry; returns the draft of that entry (None: a read)."""
    principal: Principal | None = getattr(request.state, "principal", None)
    session.info["principal"] = principal
    event.listen(session, "before_flush", lambda s, *_: policy.own_new_rows(s))
    if not is_write(request.method, request.url.path):
        return None
    draft = draft_of(request, principal)

    def created(s: Session, _: Any) -> None:
        if draft.resource is not None:
            return
        for row in s.new:
            kind = CREATED.get(type(row))
            if kind is not None:
                draft.resource, draft.resource_id = kind, row.id
                return

    def before_commit(s: Session) -> None:
        if draft.resource is None and AUDIT_RESOURCE in s.info:  # a row named otherwise than by id
            draft.resource, draft.resource_id = s.info[AUDIT_RESOURCE]
        if draft.entry is None:
            draft.entry = draft.row("ok", draft.status)
            s.add(draft.entry)

    def after_commit(_: Session) -> None:
        if draft.entry is not None:
            draft.committed = True

    def after_rollback(_: Session) -> None:
        if not draft.committed:
            draft.entry = None  # rolled back with the write: add it again at the next commit

    event.listen(session, "after_flush", created)
    event.listen(session, "before_commit", before_commit)
    event.listen(session, "after_commit", after_commit)
    event.listen(session, "after_soft_rollback", lambda s, _: after_rollback(s))
    return draft


def status_of(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, DomainError):
        return exc.status_code, exc.detail
    if isinstance(exc, RequestValidationError):
        return 422, "invalid request"
    if isinstance(exc, HTTPException):
        return exc.status_code, str(exc.detail)
    return 500, type(exc).__name__


def record_failure(factory: sessionmaker[Session], draft: Draft, exc: BaseException) -> None:
    """Record that the write ``draft`` describes failed with ``exc``, in a transaction of
    its own (the request's has been rolled back). Never raises: a database that is away
    loses this entry, not the answer."""
    status, detail = status_of(exc)
    # Refused rather than failed: a token that may not do this, a row it may not see.
    outcome = "refused" if isinstance(exc, (Unauthorized, Forbidden, policy.Hidden)) else "failed"
    try:
        with session_scope(factory) as session:
            if draft.committed and draft.entry is not None:
                # The write was committed early and then undone (a task that could not
                # be sent): its entry says so.
                session.execute(update(AuditEntry).where(AuditEntry.id == draft.entry.id)
                                .values(outcome="failed", status=status, detail=detail[:500]))
            else:
                session.add(draft.row(outcome, status, detail))
    except Exception as error:
        _not_written(draft, error)


def record_refusal(factory: sessionmaker[Session], request: Request, principal: Principal,
                   status: int, detail: str, always: bool = False) -> None:
    """Record a write refused before its handler ran, in a transaction of its own: only
    where a user is known (not the open mode or the bootstrap admin, who are never
    refused; not a token that names no user) and the request is a write or asks an
    admin's route (another user's tokens, the log itself), or ``always`` (a revoked or
    expired token, whatever it asked). Never raises."""
    if principal.user_id is None or not (always or is_write(request.method, request.url.path)
                                         or is_admin_path(request.url.path)):
        return
    draft = draft_of(request, principal)
    try:
        with session_scope(factory) as session:
            session.add(draft.row("refused", status, detail))
    except Exception as error:
        _not_written(draft, error)


def cli_actor() -> str:
    """Who an administrative command acts as: the CLI, with the OS user and the host."""
    import getpass
    import socket

    try:
        who = getpass.getuser()
    except Exception:  # no name for this uid (a container's)
        who = str(os.getuid())
    return f"cli {who}@{socket.gethostname()}"[:64]


def record_cli(session: Session, action: str, resource: str | None, resource_id: int | None,
               outcome: str = "ok", detail: str | None = None) -> None:
    """An entry for an administrative command (``corel users``, ``corel tokens``), as the
    same action over HTTP leaves one: in ``session``, committed with the change it
    records; ``client`` names the CLI, the OS user and the host."""
    session.add(AuditEntry(user_id=None, token_id=None, client=cli_actor(), action=action[:160],
                           resource=resource, resource_id=resource_id, outcome=outcome,
                           status=None, detail=detail[:500] if detail else None))


def _not_written(draft: Draft, error: BaseException) -> None:
    log.warning("audit entry not written", extra={"action": draft.action,
                                                  "error": type(error).__name__})


def page(session: Session, *, user_id: int | None, action: str | None, resource: str | None,
         resource_id: int | None, limit: int, offset: int) -> tuple[list[AuditEntry], int]:
    """A page of the log, newest first, and how many entries match."""
    where: list[ColumnElement[bool]] = []
    if user_id is not None:
        where.append(AuditEntry.user_id == user_id)
    if action:
        where.append(AuditEntry.action.contains(action))
    if resource:
        where.append(AuditEntry.resource == resource)
    if resource_id is not None:
        where.append(AuditEntry.resource_id == resource_id)
    return page_of(session, select(AuditEntry).where(*where).order_by(AuditEntry.id.desc()), limit, offset)
