"""The reconciler: the database says what must run; the broker only wakes workers up.

Kept free of torch so that the API (at start-up) and every worker (in a loop) can run
it. ``send(task, id)`` is whatever queues one task for one row.

Every kind of job that a worker runs from a message is covered: training runs
(``experiments``; a stacked group's members are sent again one by one), batch
embedding jobs (``embedding_jobs``) and index builds (``neighbor_indexes``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.broker import EMBED_TASK, INDEX_TASK, TRAIN_TASK
from app.db import session_scope
from app.models import EmbeddingJob, Experiment, NeighborIndex, Status, as_utc, utcnow
from app.settings import Settings

log = logging.getLogger("corel.reconcile")

Send = Callable[[str, int], None]
Job = type[Experiment] | type[EmbeddingJob] | type[NeighborIndex]  # the tables of jobs with a lease


@dataclass(frozen=True)
class JobKind:
    """A table of jobs that a worker claims with a lease, and the task that runs one."""

    name: str
    model: Job
    task: str


JOB_KINDS = (JobKind("experiment", Experiment, TRAIN_TASK),
             JobKind("embedding job", EmbeddingJob, EMBED_TASK),
             JobKind("index build", NeighborIndex, INDEX_TASK))


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
