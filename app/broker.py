"""The Celery application the API owns. Importing it is cheap (no torch).

The API sends tasks *by name* (``TRAIN_TASK``, ``TRAIN_GROUP_TASK``) through an app
made here with ``publisher=True``; the worker makes its own app here, naming the module
that defines the tasks (``worker.tasks``). So the arrows run one way: ``worker``
imports ``app`` (these names, the settings, the ORM), and ``app`` never imports
``worker``.
"""

from __future__ import annotations

from collections.abc import Sequence

from celery import Celery
from kombu import Queue

from app.settings import Settings

TRAIN_TASK = "corel.train_experiment"
TRAIN_GROUP_TASK = "corel.train_group"
EMBED_TASK = "corel.embed_dataset"


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
                     EMBED_TASK: {"queue": settings.queue}},
        # Long tasks: acknowledge only when done, one at a time per worker process,
        # and give the message back if the worker process is lost mid-run.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
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

