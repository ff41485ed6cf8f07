"""The worker process's Celery app: ``celery -A worker.celery_app:celery worker``."""

from __future__ import annotations

from typing import Any

from celery.signals import setup_logging

from app.core.logging import configure_logging
from app.core.settings import get_settings
from app.jobs.broker import TRAIN_GROUP_TASK, TRAIN_TASK, make_celery

__all__ = ["TRAIN_GROUP_TASK", "TRAIN_TASK", "celery"]

celery = make_celery(get_settings(), include=["worker.tasks"])


@setup_logging.connect
def _our_logging(**_: Any) -> None:
    """The service's JSON lines, once: a receiver of this signal keeps Celery from adding
    its own handler to the root logger (each line was printed twice, in two formats)."""
    configure_logging(get_settings().log_level)
