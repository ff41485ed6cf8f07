"""Submitting jobs: commit the rows, then send their tasks; a refused send withdraws them.

The rows are committed before their tasks are sent, so that a fast worker never looks for
a row that is not there yet. When the broker then refuses the message, the answer must not
leave a row behind that the client was told to submit again: the rows are withdrawn
(deleted while still queued and never claimed) and the answer is a 503 that says nothing
was kept. If they cannot be withdrawn (the database went away too, or the reconciler has
already sent one and a worker claimed it), they stay, queued and durable: the reconciler
sends them once the broker is back, and the request is answered as accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from sqlalchemy import CursorResult, delete
from sqlalchemy.orm import Session

from app.db import DATABASE_UNAVAILABLE
from app.errors import ServiceUnavailable
from app.models import Status, Sweep
from app.queue import BrokerUnavailable
from app.services.reconcile import Job

log = logging.getLogger("corel.submission")

RETRY = "nothing was stored; submit it again in a few seconds"


def _withdraw(session: Session, model: Job, ids: list[int],
              sweep_id: int | None) -> bool:
    """Delete the rows if every one of them is still queued and was never claimed."""
    result = session.execute(delete(model).where(
        model.id.in_(ids), model.status == Status.QUEUED, model.attempts == 0))
    if cast(CursorResult[Any], result).rowcount != len(ids):
        session.rollback()
        return False
    if sweep_id is not None:
        session.execute(delete(Sweep).where(Sweep.id == sweep_id))
    session.commit()
    return True


def commit_and_send(
    session: Session, model: Job, ids: list[int],
    send: Callable[[], None], what: str, sweep_id: int | None = None,
) -> None:
    """Commit the session's new rows ``ids`` of ``model``, then ``send()`` their tasks.

    Raises :class:`ServiceUnavailable` (503) when the broker refused and the rows were
    withdrawn; returns normally when the rows stay (sent, or kept for the reconciler).
    """
    session.commit()
    try:
        send()
        return
    except BrokerUnavailable as exc:
        reason = str(exc)
    try:
        withdrawn = _withdraw(session, model, ids, sweep_id)
    except DATABASE_UNAVAILABLE as exc:
        session.rollback()
        log.warning("kept unsent rows for the reconciler", extra={
            "what": what, "ids": ids, "error": type(exc).__name__})
        return
    if not withdrawn:
        log.warning("kept rows already claimed", extra={"what": what, "ids": ids})
        return
    raise ServiceUnavailable(f"{what} could not be queued: the broker is unreachable "
                             f"({reason}); {RETRY}")
