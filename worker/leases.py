"""A job's lease kept fresh while one long call runs (a chunk of an index's graph, its
storing, the inline jobs of a collection build or a promotion)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.orm import Session, sessionmaker

from app.core.db import session_scope
from app.core.settings import Settings
from app.jobs import lifecycle

log = logging.getLogger("corel.worker")


@contextmanager
def lease_kept(factory: sessionmaker[Session], row_id: int, settings: Settings,
               model: lifecycle.Job) -> Iterator[None]:
    """Heartbeats for row ``row_id`` of ``model`` every ``heartbeat_seconds`` until the
    block ends; a beat that fails is left to the next one, or to the lease's expiry."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(settings.heartbeat_seconds):
            try:
                with session_scope(factory) as session:
                    lifecycle.heartbeat(session, row_id, model)
            except Exception as exc:
                log.warning("heartbeat failed", extra={"job": f"{model.__tablename__} {row_id}",
                                                        "error": str(exc)[:200]})

    thread = threading.Thread(target=beat, name=f"{model.__tablename__}-{row_id}-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
