"""Sending tasks to the broker."""

from __future__ import annotations

import logging

from celery import Celery, group

from app.jobs.broker import (
    COLLECT_TASK,
    EMBED_TASK,
    INDEX_TASK,
    PROMOTE_TASK,
    TRAIN_GROUP_TASK,
    TRAIN_TASK,
)


class BrokerUnavailable(Exception):
    """The broker did not take a message (unreachable, or refused it)."""


log = logging.getLogger(__name__)


class TaskQueue:
    def __init__(self, celery: Celery) -> None:
        self.celery = celery

    def send(self, task: str, row_id: int) -> None:
        """One task for one row (what the reconciler sends again)."""
        try:
            self.celery.send_task(task, args=[row_id], retry=False)
        except Exception as exc:  # kombu raises several kinds of connection errors
            log.warning("could not send a task", extra={"task": task, "id": row_id,
                                                         "error": type(exc).__name__})
            raise BrokerUnavailable(type(exc).__name__) from exc

    def enqueue_training(self, experiment_id: int) -> None:
        self.send(TRAIN_TASK, experiment_id)

    def enqueue_embedding(self, job_id: int) -> None:
        self.send(EMBED_TASK, job_id)

    def enqueue_index(self, index_id: int) -> None:
        self.send(INDEX_TASK, index_id)

    def enqueue_promotion(self, promotion_id: int) -> None:
        self.send(PROMOTE_TASK, promotion_id)

    def enqueue_collection(self, build_id: int) -> None:
        self.send(COLLECT_TASK, build_id)

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
            log.warning("could not send a sweep", extra={"error": type(exc).__name__})
            raise BrokerUnavailable(type(exc).__name__) from exc

    def ping(self) -> None:
        with self.celery.connection_for_write() as conn:
            # One quick retry: /ready answers within READY_TIMEOUT.
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2,
                                   interval_max=0.2, timeout=1)
