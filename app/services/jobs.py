"""What the API does to any job a worker runs from a message with a lease (a batch
embedding job, an index build): find it, and cancel it."""

from __future__ import annotations

from typing import TypeVar

from sqlalchemy.orm import Session

from app.errors import Conflict, NotFound, check_id
from app.models import FINISHED, LeasedJob, Status, utcnow

J = TypeVar("J", bound=LeasedJob)


def get_job_row(session: Session, model: type[J], row_id: int, what: str) -> J:
    """The row, or a 404 that names it (``what``: "embedding job", "index")."""
    check_id(what, row_id)
    row = session.get(model, row_id)
    if row is None:
        raise NotFound(f"{what} {row_id} does not exist")
    return row


def cancel_job_row(session: Session, row: J, what: str) -> J:
    """Queued: cancelled at once. Running: flagged; the worker stops at its next check.
    Finished: a 409."""
    if row.status in FINISHED:
        raise Conflict(f"{what} is already {row.status}; nothing to cancel")
    row.cancel_requested = True
    if row.status == Status.QUEUED:
        row.status, row.finished_at = Status.CANCELLED, utcnow()
    session.flush()
    return row
