"""The worker process's Celery app: ``celery -A worker.celery_app:celery worker``."""

from __future__ import annotations

from app.broker import TRAIN_GROUP_TASK, TRAIN_TASK, make_celery
from app.settings import get_settings

__all__ = ["TRAIN_GROUP_TASK", "TRAIN_TASK", "celery"]

celery = make_celery(get_settings(), include=["worker.tasks"])
