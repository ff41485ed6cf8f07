"""The FastAPI application factory."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from app.access.tokens import FailureBudget, UsersExist
from app.api import openapi
from app.api.deps import check_path_access
from app.api.metrics import ApiMetrics, RouteTemplates
from app.api.metrics import router as metrics_router
from app.api.middleware import AccessLog, AllowHeader, RequestGuard, RequestMetrics
from app.api.routes import (
    analysis,
    datasets,
    embedding_jobs,
    encoders,
    events,
    experiments,
    health,
    indexes,
    inference,
    losses,
    models,
    shares,
    sweeps,
    users,
)
from app.api.state import AppState
from app.core.db import make_engine, make_sessionmaker
from app.core.errors import install_error_handlers
from app.core.logging import configure_logging
from app.core.settings import Settings
from app.jobs.broker import broker_memory_since, make_celery
from app.jobs.events import EventHub
from app.jobs.lifecycle import reconcile_in_background
from app.jobs.queue import TaskQueue
from app.services import builtin
from app.serving.inference import InferenceRunner
from app.serving.model_cache import LoadOnceCache, ModelCache
from app.serving.neighbors import Reference, warm
from app.storage import attach, make_store
from app.storage.refs import collect_in_background
from app.web import router as web_router

log = logging.getLogger("corel.api")



def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            from app.core.migrate import upgrade

            upgrade(settings)
        engine = make_engine(settings.db_url, connect_timeout=settings.db_timeout_seconds,
                             pool_timeout=settings.db_timeout_seconds,
                             answer_timeout=settings.db_answer_seconds,
                             statement_timeout=settings.db_statement_seconds,
                             peer_timeout=settings.db_peer_timeout_seconds,
                             pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow)
        state.engine = engine
        # The artifact store, checked now: a wrong bucket, credentials or folder stops
        # the start with a message that names the setting.
        store = make_store(settings)
        store.check()
        state.sessionmaker = attach(make_sessionmaker(engine), store)
        # Orphans (artifacts written by a process that died before its row committed).
        gc_stop = collect_in_background(state.sessionmaker, store,
                                        settings.artifact_gc_interval_seconds,
                                        settings.artifact_gc_grace_seconds,
                                        settings.features_keep_days * 86400.0)
        state.queue = TaskQueue(make_celery(settings, publisher=True))
        # Runs the broker lost while nothing was watching (every worker also does this).
        reconcile_in_background(state.sessionmaker, settings, state.queue.send,
                                lambda: broker_memory_since(settings))
        # Whether the built-in datasets that are not here can be downloaded, asked now so
        # that the first submission need not wait for the answer.
        builtin.probe_sources(settings)
        state.model_cache = ModelCache(settings.model_cache_size)
        # What /neighbors searches: built indexes, and training splits searched exactly.
        state.references = LoadOnceCache[Reference](settings.index_cache_size)
        state.inference = InferenceRunner(
            settings.api_batch_threads, settings.max_image_pixels,
            max_text_bytes=settings.max_text_bytes, batch_tokens=settings.text_batch_tokens,
            queue_max_inputs=settings.text_queue_max_inputs, observer=metrics,
            text_threads=settings.text_threads)
        metrics.watch_text_queue(state.inference)
        state.probes = ThreadPoolExecutor(4, thread_name_prefix="corel-ready")
        # A promotion's candidate is loaded here before its flip (publish_warm, PostgreSQL).
        state.events = EventHub(state.sessionmaker, settings.db_url,
                                on_warm=functools.partial(warm, state))
        await state.events.start()
        metrics.service.attach(engine, state.model_cache, state.probes)
        log.info("api started", extra={"database": engine.url.render_as_string(hide_password=True)})
        # What exists at start-up (torch, SQLAlchemy, Celery: hundreds of thousands of
        # objects) lives as long as the process; keep it out of the collector's full
        # passes, which otherwise stall requests for 100+ ms now and then.
        gc.freeze()
        try:
            yield
        finally:
            gc_stop.set()
            await state.events.stop()
            state.inference.close()
            state.probes.shutdown(wait=False, cancel_futures=True)
            engine.dispose()

    app = FastAPI(
        title="corel",
        version="0.1.0",
        description="Clustering-oriented representation learning (COREL): train, embed, cluster.",
        lifespan=lifespan,
        # Served by app/web from local files, not from a CDN (a blank page offline).
        docs_url=None, redoc_url=None,
        # Whatever a path names (an experiment, a sweep, ...), the caller must be allowed to
        # see it: checked for every route, so that none can forget (app/access/policy.py).
        dependencies=[Depends(check_path_access)],
    )
    app.state = state = AppState()  # typed: app/api/state.py
    state.settings = settings
    # Read by app.api.middleware.RequestGuard: whether the open mode has ended, and failed
    # authentications per client address.
    state.users_exist = UsersExist(lambda: state.sessionmaker)
    state.auth_failures = FailureBudget()
    state.metrics = metrics = ApiMetrics(settings)

    install_error_handlers(app)

    # Routes are matched in order: the probes, the hot inference routes, and
    # /experiments/compare before /experiments/{id}.
    app.include_router(health.router)
    app.include_router(inference.router)
    app.include_router(analysis.router)
    app.include_router(experiments.router)
    app.include_router(datasets.router)
    app.include_router(sweeps.router)
    app.include_router(events.router)
    app.include_router(embedding_jobs.router)
    app.include_router(indexes.router)
    app.include_router(losses.router)
    app.include_router(encoders.router)
    app.include_router(shares.router)
    app.include_router(models.router)
    app.include_router(users.router)
    app.include_router(web_router)  # the dashboard: / and /ui/...
    app.include_router(metrics_router)
    openapi.install(app, token_routes=settings.api_token is not None)
    app.add_middleware(AllowHeader, document=app.openapi)
    app.add_middleware(RequestGuard, settings=settings)
    app.add_middleware(AccessLog)
    app.add_middleware(RequestMetrics, metrics=metrics,
                       templates=RouteTemplates(app.router.routes, app.openapi),
                       server_timing=settings.server_timing)
    return app
