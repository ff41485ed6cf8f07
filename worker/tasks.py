"""Thin Celery tasks: take an id, call the runner."""

from __future__ import annotations

import logging
import threading
from functools import cache
from typing import Any

from celery.signals import (
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_ready,
    worker_shutting_down,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.db import make_engine, make_sessionmaker
from app.core.logging import configure_logging
from app.core.settings import Settings
from app.jobs.broker import COLLECT_TASK, EMBED_TASK, INDEX_TASK, PROMOTE_TASK, broker_memory_since
from app.jobs.lifecycle import next_lease_expiry, reconcile
from app.storage import attach, make_store
from worker import embedding, host_share, indexing, promotion, runner
from worker.celery_app import TRAIN_GROUP_TASK, TRAIN_TASK, celery
from worker.metrics import METRICS

log = logging.getLogger("corel.worker")
_stop = threading.Event()


def _settings() -> Settings:
    settings: Settings = celery.conf.corel_settings
    return settings


@cache
def _factory() -> sessionmaker[Session]:
    # Created lazily in the process that runs tasks (after any fork).
    settings = _settings()
    store = make_store(settings)
    store.check()
    return attach(make_sessionmaker(make_engine(settings.db_url,
                                                peer_timeout=settings.db_peer_timeout_seconds)), store)


@celery.task(name=TRAIN_TASK, acks_late=True, reject_on_worker_lost=True)
def train_experiment(experiment_id: int) -> str:
    eid = int(experiment_id)
    status = runner.with_retries(lambda: runner.train_experiment(eid, _factory(), _settings()),
                                 _settings(), f"experiment {eid}")
    if status == runner.HANDED_BACK:  # this worker stops: the next one takes it at once
        _send(TRAIN_TASK, eid)
    return status


@celery.task(name=TRAIN_GROUP_TASK, acks_late=True, reject_on_worker_lost=True)
def train_group(experiment_ids: list[int]) -> dict[int, str]:
    ids = [int(i) for i in experiment_ids]
    outcome = runner.with_retries(lambda: runner.train_group(ids, _factory(), _settings()),
                                  _settings(), f"experiments {ids}")
    back = [i for i, status in outcome.items() if status == runner.HANDED_BACK]
    if back:  # this worker stops: the next one takes them at once, as one group again
        celery.send_task(TRAIN_GROUP_TASK, args=[back])
    return outcome


@celery.task(name=EMBED_TASK, acks_late=True, reject_on_worker_lost=True)
def embed_dataset(job_id: int) -> str:
    jid = int(job_id)
    return runner.with_retries(lambda: embedding.embed_dataset(jid, _factory(), _settings()),
                               _settings(), f"embedding job {jid}")


@celery.task(name=INDEX_TASK, acks_late=True, reject_on_worker_lost=True)
def build_index(index_id: int) -> str:
    iid = int(index_id)
    return runner.with_retries(lambda: indexing.build_index(iid, _factory(), _settings()),
                               _settings(), f"index {iid}")


@celery.task(name=PROMOTE_TASK, acks_late=True, reject_on_worker_lost=True)
def promote(promotion_id: int) -> str:
    pid = int(promotion_id)
    return runner.with_retries(lambda: promotion.promote(pid, _factory(), _settings()),
                               _settings(), f"promotion {pid}")


@celery.task(name=COLLECT_TASK, acks_late=True, reject_on_worker_lost=True)
def build_collection(build_id: int) -> str:
    bid = int(build_id)
    return runner.with_retries(lambda: promotion.build_collection(bid, _factory(), _settings()),
                               _settings(), f"collection build {bid}")


def _send(task: str, row_id: int) -> None:
    celery.send_task(task, args=[row_id])


def _reconcile_forever() -> None:
    settings = _settings()
    interval = max(min(settings.lease_seconds, settings.requeue_after_seconds) / 2, 0.5)
    while not _stop.is_set():
        wait = interval
        try:
            reconcile(_factory(), settings, _send, broker_memory_since(settings))
            # Awake again when the next lease runs out, if that is sooner (just after it).
            expiry = next_lease_expiry(_factory(), settings)
            if expiry is not None:
                wait = min(interval, expiry + 0.05)
        except Exception as exc:
            # The database or broker is away; the next round tries again.
            log.warning("could not reconcile runs", extra={"error": type(exc).__name__})
        _stop.wait(wait)


@cache
def _broker_tables() -> Engine | None:
    """The embedded broker's own database (kombu's SQLAlchemy transport), else None."""
    url = _settings().celery_broker_url
    return create_engine(url.removeprefix("sqla+")) if url.startswith("sqla+") else None


@task_postrun.connect
def _forget_delivered_messages(**_: Any) -> None:
    """Kombu's SQLAlchemy transport marks a delivered message invisible and never deletes
    it, so the embedded broker's file would grow with every task. A delivered message is
    never delivered again: delete them once a task is done."""
    engine = _broker_tables()
    if engine is None:
        return
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM kombu_message WHERE visible = :no"), {"no": False})
    except Exception as exc:  # housekeeping must never fail a task
        log.warning("could not clear delivered broker messages", extra={"error": type(exc).__name__})


@worker_process_init.connect
def _threads(**_: Any) -> None:
    """The torch threads of each worker process (prefork's children too): its share of
    the host's cores (worker/host_share.py), or COREL_WORKER_TORCH_THREADS."""
    host_share.apply()


@task_prerun.connect
def _threads_for_the_task(**_: Any) -> None:
    host_share.apply()  # in the thread that runs the task


@worker_ready.connect
def _on_ready(**_: Any) -> None:
    configure_logging(_settings().log_level)
    host_share.refresh(_factory(), _settings())
    _threads()
    threading.Thread(target=_reconcile_forever, name="corel-reconcile", daemon=True).start()
    threading.Thread(target=host_share.keep_current, args=(_factory(), _settings(), _stop),
                     name="corel-host-share", daemon=True).start()
    port = _settings().worker_metrics_port
    if port:
        try:
            METRICS.serve(port)
        except OSError as exc:  # the port is taken: train all the same, and say so
            log.error("cannot serve metrics", extra={"port": port, "error": str(exc)})


@worker_shutting_down.connect
def _on_shutdown(**_: Any) -> None:
    _stop.set()
    runner.STOPPING.set()  # a run hands itself back at its next epoch's end
