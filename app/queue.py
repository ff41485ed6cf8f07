"""Sending training tasks to the broker."""

from __future__ import annotations

import logging

from celery import Celery, group

from app.broker import EMBED_TASK, TRAIN_GROUP_TASK, TRAIN_TASK
from app.errors import ServiceUnavailable

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

    def enqueue_embedding(self, job_id: int) -> None:
        try:
            self.celery.send_task(EMBED_TASK, args=[job_id], retry=False)
        except Exception as exc:
            log.exception("could not queue embedding job %s", job_id)
            raise ServiceUnavailable(
                f"embedding job {job_id} was stored but could not be queued: the broker is "
                f"unreachable ({type(exc).__name__}); it is marked failed"
            ) from exc

    def enqueue_groups(self, groups: list[list[int]]) -> None:
        """One task per group (a stacked, vectorized run) or per lone experiment, sent as
        a Celery group so that they spread over every worker."""
        signatures = [
            self.celery.signature(TRAIN_TASK, args=[ids[0]]) if len(ids) == 1
            else self.celery.signature(TRAIN_GROUP_TASK, args=[ids])
            for ids in groups
        ]
        try:
            group(signatures).apply_async(retry=False)
        except Exception as exc:
            log.exception("could not queue a sweep")
            raise ServiceUnavailable(
                f"the sweep was stored but could not be queued: the broker is unreachable "
                f"({type(exc).__name__}); its experiments are marked failed"
            ) from exc

    def ping(self) -> None:
        with self.celery.connection_for_write() as conn:
            # One quick retry: /ready answers within READY_TIMEOUT.
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2,
                                   interval_max=0.2, timeout=1)
