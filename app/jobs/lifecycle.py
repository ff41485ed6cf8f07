"""One life for every job a worker runs from a message: a training run (and the members
of a stacked group, each its own row), a batch embedding job, an index build.

Every kind lives the same life, written here once; the routes and the worker call these
functions and do not re-implement them.

* **submit** (:func:`commit_and_send`): the rows are committed, then their tasks are
  sent; a send the broker refuses withdraws the rows (a 503 that says nothing was kept),
  or, if they cannot be withdrawn, leaves them queued for the reconciler.
* **claim** (:func:`claim`): one conditional UPDATE takes a ``queued`` row, or a
  ``running`` one whose lease ran out, for this worker process (:data:`WORKER_ID`); of
  two deliveries of one message only one runs it.
* **heartbeat** and **progress** (:func:`heartbeat`, :func:`heartbeat_many`,
  :func:`progress`): only while the row is still this worker's (:func:`owned`); a
  worker that finds it is not raises :class:`LostLease` and stops, writing nothing more.
* **finish, fail, cancel** (:func:`end`, :func:`finish`; :func:`cancel` on the API's
  side): the end, again only while the row is ours, with its event.
* **reconcile** (:func:`reconcile`): the database says what must run; the broker only
  wakes workers up. Rows whose message was lost, or whose worker stopped reporting, are
  sent again.

Statuses are :class:`app.core.models.Status`. Training runs publish their changes to the
API's live streams (``events``); the other kinds are polled.

Kept free of torch so that the API (at start-up) and every worker (in a loop) can run it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    and_,
    delete,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import DATABASE_UNAVAILABLE, session_scope
from app.core.errors import Conflict, ServiceUnavailable
from app.core.models import (
    FINISHED,
    CollectionBuild,
    EmbeddingJob,
    Experiment,
    NeighborIndex,
    Promotion,
    Status,
    Sweep,
    as_utc,
    utcnow,
)
from app.core.settings import Settings
from app.jobs.broker import COLLECT_TASK, EMBED_TASK, INDEX_TASK, PROMOTE_TASK, TRAIN_TASK
from app.jobs.events import publish
from app.jobs.queue import BrokerUnavailable

log = logging.getLogger("corel.lifecycle")

Send = Callable[[str, int], None]
# the tables of jobs with a lease
Job = type[Experiment] | type[EmbeddingJob] | type[NeighborIndex] | type[Promotion] | type[CollectionBuild]
J = TypeVar("J", Experiment, EmbeddingJob, NeighborIndex, Promotion, CollectionBuild)

# This worker process, as it signs the rows it claims.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class JobKind:
    """A table of jobs that a worker claims with a lease, and the task that runs one."""

    name: str
    model: Job
    task: str
    events: bool  # its changes are published to the API's live streams


JOB_KINDS = (JobKind("experiment", Experiment, TRAIN_TASK, True),
             JobKind("embedding job", EmbeddingJob, EMBED_TASK, False),
             JobKind("index build", NeighborIndex, INDEX_TASK, False),
             JobKind("promotion", Promotion, PROMOTE_TASK, False),
             JobKind("collection build", CollectionBuild, COLLECT_TASK, False))


def announce(session: Session, model: Job, ids: Iterable[int]) -> None:
    """Publish the change (sent when the session commits) if this kind has live streams."""
    if any(kind.model is model and kind.events for kind in JOB_KINDS):
        publish(session, ids)


class LostLease(Exception):
    """Another worker took this job over (ours was presumed dead)."""


def updated(session: Session, stmt: Any) -> int:
    """Execute an UPDATE and return how many rows it changed."""
    result = session.execute(stmt.execution_options(synchronize_session=False))
    return int(cast(CursorResult[Any], result).rowcount)


# --- submit -------------------------------------------------------------------------

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


# --- the API's side: cancel ---------------------------------------------------------

def cancel(session: Session, row: J, what: str) -> J:
    """Queued: cancelled at once. Running: flagged; the worker stops at its next check.
    Finished: a 409."""
    if row.status in FINISHED:
        raise Conflict(f"{what} is already {row.status}; nothing to cancel")
    row.cancel_requested = True
    if row.status == Status.QUEUED:
        row.status, row.finished_at = Status.CANCELLED, utcnow()
        announce(session, type(row), [row.id])
    session.flush()
    return row


# --- the worker's side: claim, heartbeat, progress, end --------------------------------

def claim(session: Session, row_id: int, settings: Settings, model: Job = Experiment) -> bool:
    """Take the row for this worker: one conditional UPDATE, so of two deliveries of the
    same message only one runs it."""
    now = utcnow()
    claimed = bool(updated(session,
        update(model)
        .where(
            model.id == row_id,
            or_(
                model.status == Status.QUEUED,
                and_(
                    model.status == Status.RUNNING,
                    or_(
                        lease_expired(settings, now, model),
                        # ours: this process is trying again after a transient error
                        model.worker == WORKER_ID,
                    ),
                ),
            ),
        )
        .values(
            status=Status.RUNNING,
            worker=WORKER_ID,
            heartbeat_at=now,
            attempts=model.attempts + 1,
            started_at=func.coalesce(model.started_at, now),
        )
    ))
    if claimed:
        announce(session, model, [row_id])  # sent to the API's streams when this commits
    return claimed


def owned(row_id: int, model: Job = Experiment) -> ColumnElement[bool]:
    """The row is still this worker's: running, and claimed by this process."""
    return and_(model.id == row_id, model.worker == WORKER_ID, model.status == Status.RUNNING)


def heartbeat(session: Session, row_id: int, model: Job = Experiment, **values: Any) -> bool:
    """Renew the lease (and set ``values``) if the row is still ours; False if not."""
    return bool(updated(session, update(model).where(owned(row_id, model))
                        .values(heartbeat_at=utcnow(), **values)))


def heartbeat_many(session: Session, ids: Iterable[int], model: Job = Experiment,
                   **values: Any) -> int:
    """:func:`heartbeat` for several rows at once (a stacked group); how many were ours."""
    return updated(session, update(model)
                   .where(model.id.in_(list(ids)), model.worker == WORKER_ID,
                          model.status == Status.RUNNING)
                   .values(heartbeat_at=utcnow(), **values))


def progress(session: Session, row_id: int, model: Job = Experiment, **values: Any) -> None:
    """Record progress with the heartbeat, and publish it; :class:`LostLease` when the row
    is no longer ours (nothing is written then: the caller's transaction rolls back)."""
    if not heartbeat(session, row_id, model, **values):
        raise LostLease(f"{model.__tablename__} row {row_id} is no longer ours")
    announce(session, model, [row_id])


def cancel_requested(session: Session, row_id: int, model: Job = Experiment) -> bool:
    return bool(session.scalar(select(model.cancel_requested).where(model.id == row_id)))


def end(session: Session, row_id: int, status: Status, model: Job = Experiment,
        **values: Any) -> bool:
    """End the row in ``status`` in the session's transaction (with what else it writes)
    if it is still ours; False (nothing changed) when another worker took it over."""
    done = updated(session, update(model).where(owned(row_id, model))
                   .values(status=status, finished_at=utcnow(), **values))
    announce(session, model, [row_id])
    return bool(done)


def finish(factory: sessionmaker[Session], row_id: int, status: Status,
           model: Job = Experiment, **values: Any) -> bool:
    """:func:`end` in a transaction of its own."""
    with session_scope(factory) as session:
        return end(session, row_id, status, model, **values)


# --- reconcile ----------------------------------------------------------------------

def lease_expired(settings: Settings, now: datetime, model: Job = Experiment) -> ColumnElement[bool]:
    """A running row whose worker has not reported for ``lease_seconds``: presumed dead."""
    stale = now - timedelta(seconds=settings.lease_seconds)
    return or_(model.heartbeat_at.is_(None), model.heartbeat_at < stale)


def requeue_delay(settings: Settings, sends: int) -> float:
    """Seconds after its last send before a still-unclaimed row is sent again: doubling
    with every send, from ``requeue_after_seconds`` (default: the lease) up to
    ``requeue_max_seconds`` (default: two leases)."""
    return float(min(settings.requeue_after_seconds * 2 ** max(sends - 1, 0),
                     settings.requeue_max_seconds))


def due(
    session: Session, kind: JobKind, settings: Settings, now: datetime,
    broker_since: datetime | None = None,
) -> list[int]:
    """The rows of ``kind`` to send again now.

    * ``running`` rows whose worker stopped reporting for ``lease_seconds`` (it died):
      at once, then again after :func:`requeue_delay` while no worker has claimed them;
    * ``queued`` rows whose last send is older than :func:`requeue_delay` (the send was
      lost, or the message waits behind other work);
    * either, at once, when their last send is older than ``broker_since``: the moment
      from which the broker is known to remember what it is sent (a Redis flushed, or
      restarted without persistence, forgot every message sent before). The sends that
      went into the broker before it forgot do not count towards the delay.
    """
    model = kind.model
    # One statement per kind of job: every round of every worker runs it.
    rows = session.execute(
        select(model.id, model.status, model.enqueued_at, model.enqueues, model.heartbeat_at,
               model.created_at)
        .where(or_(model.status == Status.QUEUED,
                   and_(model.status == Status.RUNNING, lease_expired(settings, now, model))))).all()
    dead = [(r.id, r.enqueued_at, r.enqueues, r.heartbeat_at) for r in rows if r.status == Status.RUNNING]
    queued = [(r.id, r.enqueued_at, r.enqueues, r.created_at) for r in rows if r.status == Status.QUEUED]

    def forgotten(last: datetime | None) -> bool:
        return broker_since is not None and (last is None or as_utc(last) < broker_since)

    def waited(last: datetime | None, sends: int) -> bool:
        return (last is None or forgotten(last)
                or (now - as_utc(last)).total_seconds() >= requeue_delay(settings, sends))

    out: list[int] = []
    for row_id, enqueued_at, sends, heartbeat_at in dead:
        # At once when not sent since its worker last reported; then with the same delay
        # as a queued row, not every round (the copies would queue up behind other work).
        fresh = enqueued_at is None or heartbeat_at is None or as_utc(enqueued_at) < as_utc(heartbeat_at)
        if fresh or waited(enqueued_at, sends):
            out.append(row_id)
    for row_id, enqueued_at, sends, created_at in queued:
        if waited(enqueued_at or created_at, sends):
            out.append(row_id)
    return out


def reconcile(
    factory: sessionmaker[Session], settings: Settings, send: Send,
    broker_since: datetime | None = None,
) -> list[tuple[str, int]]:
    """Send again what the broker may have lost (see :func:`due`); returns what was sent
    as ``(task, id)`` pairs.

    Idempotent: a duplicate delivery finds the row claimed or finished and does nothing.
    A send that fails is not recorded, so the next round tries it again at once. Runs in
    every worker (every ``lease / 2`` seconds at most) and at the API's start.
    """
    now = utcnow()
    with session_scope(factory) as session:
        plan = [(kind, row_id) for kind in JOB_KINDS
                for row_id in due(session, kind, settings, now, broker_since)]
    sent: list[tuple[JobKind, int]] = []
    try:
        for kind, row_id in plan:
            log.warning("sending a job again", extra={"job": kind.name, "id": row_id})
            send(kind.task, row_id)
            sent.append((kind, row_id))
    finally:
        if sent:
            with session_scope(factory) as session:
                for kind in JOB_KINDS:
                    ids = [row_id for k, row_id in sent if k is kind]
                    if ids:
                        session.execute(update(kind.model).where(kind.model.id.in_(ids)).values(
                            enqueued_at=utcnow(), enqueues=kind.model.enqueues + 1))
    return [(kind.task, row_id) for kind, row_id in sent]


def next_lease_expiry(factory: sessionmaker[Session], settings: Settings) -> float | None:
    """Seconds until the earliest lease of a running job expires (of those not expired
    yet), or None when no such job runs. A worker's reconcile loop wakes up then, not up to
    an interval later: a run whose worker died is sent again as soon as it may be."""
    now = utcnow()
    stale = now - timedelta(seconds=settings.lease_seconds)
    with session_scope(factory) as session:
        beats = [session.scalar(select(func.min(kind.model.heartbeat_at)).where(
            kind.model.status == Status.RUNNING, kind.model.heartbeat_at >= stale)) for kind in JOB_KINDS]
    earliest = min((as_utc(b) for b in beats if b is not None), default=None)
    if earliest is None:
        return None
    return max(0.0, (earliest - stale).total_seconds())


def reconcile_in_background(
    factory: sessionmaker[Session], settings: Settings, send: Send,
    broker_since: Callable[[], datetime | None] = lambda: None,
) -> threading.Thread:
    """One :func:`reconcile` pass in a daemon thread (the API's start must not wait on it)."""

    def run() -> None:
        try:
            sent = reconcile(factory, settings, send, broker_since())
            if sent:
                log.info("sent jobs again at start-up", extra={"jobs": sent})
        except Exception as exc:
            log.warning("could not reconcile jobs at start-up", extra={"error": type(exc).__name__})

    thread = threading.Thread(target=run, name="corel-reconcile", daemon=True)
    thread.start()
    return thread
