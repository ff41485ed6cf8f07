"""The reconciler: the database says what must run; the broker only wakes workers up.

Kept free of torch and Celery so that the API (at start-up) and every worker (in a
loop) can run it. ``send`` is whatever queues one experiment id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from app.db import session_scope
from app.models import Experiment, as_utc, utcnow
from app.settings import Settings

log = logging.getLogger("corel.reconcile")


def lease_expired(settings: Settings, now: datetime) -> ColumnElement[bool]:
    """A running row whose worker has not reported for ``lease_seconds``: presumed dead."""
    stale = now - timedelta(seconds=settings.lease_seconds)
    return or_(Experiment.heartbeat_at.is_(None), Experiment.heartbeat_at < stale)


def requeue_delay(settings: Settings, sends: int) -> float:
    """Seconds after its last send before a still-queued row is sent again: doubling with
    every send, from ``requeue_after_seconds`` up to ``requeue_max_seconds``."""
    return float(min(settings.requeue_after_seconds * 2 ** max(sends - 1, 0),
                     settings.requeue_max_seconds))


def reconcile(
    factory: sessionmaker[Session], settings: Settings, send: Callable[[int], None]
) -> list[int]:
    """The database says what must run; send again what the broker may have lost.

    * ``running`` rows whose worker stopped reporting for ``lease_seconds`` (it died):
      at once, then again after :func:`requeue_delay` while no worker has claimed them;
    * ``queued`` rows whose last send is older than :func:`requeue_delay` (the broker
      restarted without its queue, or the send was lost).

    Idempotent: a duplicate delivery finds the row claimed or finished and does nothing,
    and the doubling delay keeps the duplicates of a row that is only waiting its turn
    to a handful (a dead worker's row used to be sent every round: 16 copies in 20
    minutes). Runs in every worker and at the API's start.
    """
    now = utcnow()
    with session_scope(factory) as session:
        dead = session.execute(select(
            Experiment.id, Experiment.enqueued_at, Experiment.enqueues, Experiment.heartbeat_at,
        ).where(Experiment.status == "running", lease_expired(settings, now))).all()
        queued = session.execute(select(
            Experiment.id, Experiment.enqueued_at, Experiment.enqueues, Experiment.created_at,
        ).where(Experiment.status == "queued")).all()

    def waited(last: datetime | None, sends: int) -> bool:
        return last is None or (now - as_utc(last)).total_seconds() >= requeue_delay(settings, sends)

    due: list[int] = []
    for experiment_id, enqueued_at, sends, heartbeat_at in dead:
        # At once when not sent since its worker last reported; then with the same
        # doubling delay as a queued row, not every round (the copies queue up behind
        # the other work, and each one would wait there).
        fresh = enqueued_at is None or heartbeat_at is None or as_utc(enqueued_at) < as_utc(heartbeat_at)
        if fresh or waited(enqueued_at, sends):
            due.append(experiment_id)
    for experiment_id, enqueued_at, sends, created_at in queued:
        if waited(enqueued_at or created_at, sends):
            due.append(experiment_id)
    sent: list[int] = []
    try:
        for experiment_id in due:
            log.warning("sending a run again", extra={"experiment": experiment_id})
            send(experiment_id)
            sent.append(experiment_id)
    finally:
        if sent:
            with session_scope(factory) as session:
                session.execute(update(Experiment).where(Experiment.id.in_(sent)).values(
                    enqueued_at=utcnow(), enqueues=Experiment.enqueues + 1))
    return sent


def reconcile_in_background(
    factory: sessionmaker[Session], settings: Settings, send: Callable[[int], None]
) -> threading.Thread:
    """One :func:`reconcile` pass in a daemon thread (the API's start must not wait on it)."""

    def run() -> None:
        try:
            sent = reconcile(factory, settings, send)
            if sent:
                log.info("sent runs again at start-up", extra={"experiments": sent})
        except Exception as exc:
            log.warning("could not reconcile runs at start-up", extra={"error": type(exc).__name__})

    thread = threading.Thread(target=run, name="corel-reconcile", daemon=True)
    thread.start()
    return thread
