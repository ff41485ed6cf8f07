"""Sending training tasks to the broker."""

from __future__ import annotations

import logging

from celery import Celery

from app.errors import ServiceUnavailable
from worker.celery_app import TRAIN_TASK

log = logging.getLogger(__name__)


class TaskQueue:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def enqueue_training(self, experiment_id: int) -> None:
        try:
            self.celery.send_task(TRAIN_TASK, args=[experiment_id], retry=False)
        except Exception as exc:  # kombu raises several kinds of connection errors
            log.exception("could not queue experiment %s", experiment_id)
            raise ServiceUnavailable(
                f"experiment {experiment_id} was stored but could not be queued: the broker "
                f"is unreachable ({type(exc).__name__}); it is marked failed"
            ) from exc

    def ping(self) -> None:
        with self.celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
