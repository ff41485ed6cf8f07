"""The Celery application the API owns. Importing it is cheap (no torch).

The API sends tasks *by name* (``TRAIN_TASK``, ``TRAIN_GROUP_TASK``) through an app
made here with ``publisher=True``; the worker makes its own app here, naming the module
that defines the tasks (``worker.tasks``). So the arrows run one way: ``worker``
imports ``app`` (these names, the settings, the ORM), and ``app`` never imports
``worker``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from celery import Celery
from kombu import Queue

from app.core.settings import Settings

TRAIN_TASK = "corel.train_experiment"
TRAIN_GROUP_TASK = "corel.train_group"
EMBED_TASK = "corel.embed_dataset"
INDEX_TASK = "corel.build_index"
PROMOTE_TASK = "corel.promote"
COLLECT_TASK = "corel.build_collection"

log = logging.getLogger("corel.broker")


def make_celery(settings: Settings, publisher: bool = False, include: Sequence[str] = ()) -> Celery:
    """The Celery app; ``publisher=True`` for the API, which only sends tasks and must
    answer within about a second when the broker is away (one quick retry, 1 s socket
    timeouts) instead of holding a request thread for several seconds. ``include``:
    the modules that define tasks (the worker's)."""
    app = Celery("corel", broker=settings.celery_broker_url, include=list(include))
    app.conf.update(
        # Results live in our database; Celery's result backend is not used.
        task_ignore_result=True,
        task_queues=[Queue(settings.queue)],
        task_default_queue=settings.queue,
        task_routes={TRAIN_TASK: {"queue": settings.queue},
                     TRAIN_GROUP_TASK: {"queue": settings.queue},
                     EMBED_TASK: {"queue": settings.queue},
                     INDEX_TASK: {"queue": settings.queue},
                     PROMOTE_TASK: {"queue": settings.queue},
                     COLLECT_TASK: {"queue": settings.queue}},
        # Long tasks: acknowledge only when done, one at a time per worker process,
        # and give the message back if the worker process is lost mid-run.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # Our logging writes JSON lines to stdout; Celery's redirect would log each of
        # them a second time as a WARNING of its own.
        worker_redirect_stdouts=False,
        task_serializer="json",
        accept_content=["json"],
    )
    options: dict[str, float] = {}
    if settings.celery_broker_url.startswith(("redis", "rediss", "sqs")):
        # Longer than any training run, so a slow run is never delivered twice.
        # (The SQLAlchemy transport passes its options to create_engine: none there.)
        options["visibility_timeout"] = settings.visibility_timeout
        if publisher:
            options.update(socket_connect_timeout=1.0, socket_timeout=1.0)
    if publisher:
        app.conf.broker_connection_timeout = 1.0
        # Kombu's retry keys; every transport takes them (the SQLAlchemy one drops them
        # before create_engine).
        options.update(max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.2)
    if options:
        app.conf.broker_transport_options = options
    app.conf.corel_settings = settings
    return app


def memory_key(settings: Settings) -> str:
    return f"corel.broker-memory.{settings.queue}"


def broker_memory_since(settings: Settings) -> datetime | None:
    """Since when the broker has remembered what it was sent, as far as anyone can tell.

    A Redis broker that is flushed (``FLUSHALL``), or restarted without persistence,
    forgets every message it held, and nothing tells the senders. So a marker is kept
    beside the queue: written with the time of the first look that finds it missing, it
    disappears with the messages. Every message sent before the marker's time may be
    gone; the reconciler sends those rows again at once, whatever their back-off. Kept
    by a restart with an append-only file, as the messages are.

    None for the other transports (the embedded SQLite broker keeps its messages in a
    file), and when the broker does not answer (its sends fail then, and are not
    counted as sent).
    """
    url = settings.celery_broker_url
    if not url.startswith(("redis://", "rediss://")):
        return None
    import redis

    from app.core.models import as_utc, utcnow

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            key = memory_key(settings)
            client.set(key, utcnow().isoformat(), nx=True)
            value = client.get(key)
        finally:
            client.close()
    except redis.RedisError as exc:
        log.info("broker memory unknown", extra={"error": type(exc).__name__})
        return None
    if not value:
        return None
    return as_utc(datetime.fromisoformat(value.decode() if isinstance(value, bytes) else str(value)))
