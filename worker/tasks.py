"""Thin Celery tasks: take an id, call the runner."""

from __future__ import annotations

import logging
import threading
from functools import cache
from typing import Any

from celery.signals import worker_ready, worker_shutting_down
from sqlalchemy.orm import Session, sessionmaker

from app.db import make_engine, make_sessionmaker
from app.logging import configure_logging
from app.settings import Settings
from worker import runner
from worker.celery_app import TRAIN_GROUP_TASK, TRAIN_TASK, celery

log = logging.getLogger("corel.worker")
_stop = threading.Event()


def _settings() -> Settings:
    settings: Settings = celery.conf.corel_settings
    return settings


@cache
def _factory() -> sessionmaker[Session]:
    # Created lazily in the process that runs tasks (after any fork).
    return make_sessionmaker(make_engine(_settings().db_url))


@celery.task(name=TRAIN_TASK, acks_late=True, reject_on_worker_lost=True)
def train_experiment(experiment_id: int) -> str:
    return runner.train_experiment(int(experiment_id), _factory(), _settings())


@celery.task(name=TRAIN_GROUP_TASK, acks_late=True, reject_on_worker_lost=True)
def train_group(experiment_ids: list[int]) -> dict[int, str]:
    return runner.train_group([int(i) for i in experiment_ids], _factory(), _settings())


def _send(experiment_id: int) -> None:
    celery.send_task(TRAIN_TASK, args=[experiment_id])


def _watch_for_dead_runs() -> None:
    settings = _settings()
    interval = max(settings.lease_seconds / 2, 0.5)
    while not _stop.is_set():
        try:
            runner.requeue_stale(_factory(), settings, _send)
        except Exception:
            log.exception("could not check for dead runs")
        _stop.wait(interval)


@worker_ready.connect
def _on_ready(**_: Any) -> None:
    configure_logging(_settings().log_level)
    threading.Thread(target=_watch_for_dead_runs, name="corel-recovery", daemon=True).start()


@worker_shutting_down.connect
def _on_shutdown(**_: Any) -> None:
    _stop.set()
