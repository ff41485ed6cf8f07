"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import openapi
from app.broker import broker_memory_since, make_celery
from app.db import DATABASE_UNAVAILABLE, make_engine, make_sessionmaker
from app.errors import DomainError, describe_error
from app.guard import RequestGuard
from app.lifecycle import reconcile_in_background
from app.logging import configure_logging
from app.metrics import ApiMetrics, RequestMetrics, RouteTemplates
from app.metrics import router as metrics_router
from app.queue import TaskQueue
from app.routes import (
    analysis,
    datasets,
    embedding_jobs,
    events,
    experiments,
    indexes,
    inference,
    losses,
    sweeps,
)
from app.services.events import EventHub
from app.services.inference import InferenceRunner
from app.services.model_cache import LoadOnceCache, ModelCache
from app.settings import Settings
from app.web import router as web_router
from corel.index import VectorIndex

log = logging.getLogger("corel.api")

RETRY_AFTER = 5  # seconds, in every 503's Retry-After
READY_TIMEOUT = 1.5  # seconds each readiness probe may take


class AccessLog:
    """One structured log line per request (pure ASGI: no per-request task or copy)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_record(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            log.info("request", extra={"method": scope["method"], "path": scope["path"],
                                       "status": status,
                                       "ms": round((time.perf_counter() - started) * 1000, 2)})


class AllowHeader:
    """A 405 lists every method of the path, not only those of the first route that
    matched it (``/experiments/{id}`` has GET and DELETE in two routes). The methods
    come from the OpenAPI document, so the two always agree."""

    def __init__(self, app: Any, document: Any) -> None:
        self.app = app
        self.document = document
        self._paths: list[tuple[re.Pattern[str], str]] | None = None

    def allowed(self, path: str) -> str:
        if self._paths is None:
            self._paths = [
                (re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(template)) + "$"),
                 ", ".join(sorted(m.upper() for m in operations)))
                for template, operations in self.document()["paths"].items()
            ]
        methods: set[str] = set()
        for pattern, listed in self._paths:
            if pattern.match(path):
                if "[^/]+" not in pattern.pattern:  # a literal path wins over a template
                    return listed
                methods.update(listed.split(", "))
        return ", ".join(sorted(methods))

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_allow(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                allow = self.allowed(scope["path"]).encode()
                message = {**message, "headers": [*headers, (b"allow", allow)]}
            await send(message)

        await self.app(scope, receive, send_with_allow)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            from app.migrate import upgrade

            upgrade(settings)
        engine = make_engine(settings.db_url, connect_timeout=settings.db_timeout_seconds,
                             pool_timeout=settings.db_timeout_seconds,
                             answer_timeout=settings.db_answer_seconds,
                             statement_timeout=settings.db_statement_seconds,
                             peer_timeout=settings.db_peer_timeout_seconds)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        app.state.queue = TaskQueue(make_celery(settings, publisher=True))
        # Runs the broker lost while nothing was watching (every worker also does this).
        reconcile_in_background(app.state.sessionmaker, settings, app.state.queue.send,
                                lambda: broker_memory_since(settings))
        app.state.model_cache = ModelCache(settings.model_cache_size)
        # What /neighbors searches: built indexes, and training splits searched exactly.
        app.state.references = LoadOnceCache[VectorIndex](settings.index_cache_size)
        app.state.inference = InferenceRunner(settings.api_batch_threads)
        app.state.probes = ThreadPoolExecutor(4, thread_name_prefix="corel-ready")
        app.state.events = EventHub(app.state.sessionmaker, settings.db_url)
        await app.state.events.start()
        metrics.service.attach(engine, app.state.model_cache, app.state.probes)
        log.info("api started", extra={"database": engine.url.render_as_string(hide_password=True)})
        # What exists at start-up (torch, SQLAlchemy, Celery: hundreds of thousands of
        # objects) lives as long as the process; keep it out of the collector's full
        # passes, which otherwise stall requests for 100+ ms now and then.
        gc.freeze()
        try:
            yield
        finally:
            await app.state.events.stop()
            app.state.inference.close()
            app.state.probes.shutdown(wait=False, cancel_futures=True)
            engine.dispose()

    app = FastAPI(
        title="corel",
        version="0.1.0",
        description="Clustering-oriented representation learning (COREL): train, embed, cluster.",
        lifespan=lifespan,
        # Served by app/web from local files, not from a CDN (a blank page offline).
        docs_url=None, redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics = ApiMetrics(settings)

    @app.exception_handler(DomainError)
    async def _domain_error(_: Request, exc: DomainError) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER)} if exc.status_code == 503 else None
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.error, "detail": exc.detail, **exc.extra},
            headers=headers,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (400 unparsable body, 404 no such path, 405, 413) in
        # the shape of every other error.
        try:
            error = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "_")
        except ValueError:
            error = "error"
        return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                            content={"error": error, "detail": str(exc.detail)})

    async def _database_unavailable(_: Request, exc: Exception) -> JSONResponse:
        # The request did nothing durable (its transaction rolled back): safe to retry.
        log.warning("database unavailable", extra={"error": type(exc).__name__})
        return JSONResponse(
            status_code=503, headers={"Retry-After": str(RETRY_AFTER)},
            content={"error": "service_unavailable",
                     "detail": "the database is unreachable or not answering; nothing was "
                               f"changed, retry in {RETRY_AFTER} s"})

    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, _database_unavailable)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": ".".join(str(p) for p in e.get("loc", ())), "message": describe_error(e)}
            for e in exc.errors()
        ]
        return JSONResponse(
            status_code=422,
            content={"error": "invalid_request", "detail": "; ".join(e["message"] for e in errors),
                     "errors": errors},
        )

    # On the event loop, never in the thread pool: it answers even when every pool
    # thread waits on a database that does not answer.
    @app.get("/health", tags=["operations"], summary="The process is up")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"],
             summary="Database and broker reachable (else 503), answered within 2 s")
    async def ready(request: Request) -> JSONResponse:
        def database() -> None:
            with request.app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1"))

        async def check(name: str, probe: Any) -> tuple[str, str]:
            # Own threads, so that a hung database cannot also hold up this answer.
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.run_in_executor(request.app.state.probes, probe),
                                       READY_TIMEOUT)
                return name, "ok"
            except TimeoutError:
                return name, f"not answering within {READY_TIMEOUT} s"
            except Exception as exc:
                return name, f"unreachable: {type(exc).__name__}"

        checks = dict(await asyncio.gather(check("database", database),
                                           check("broker", request.app.state.queue.ping)))
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse(status_code=200 if ok else 503,
                            headers=None if ok else {"Retry-After": str(RETRY_AFTER)},
                            content={"status": "ready" if ok else "not ready", **checks})

    # Routes are matched in order: the hot inference routes first, and
    # /experiments/compare before /experiments/{id}.
    app.include_router(inference.router)
    app.include_router(analysis.router)
    app.include_router(experiments.router)
    app.include_router(datasets.router)
    app.include_router(sweeps.router)
    app.include_router(events.router)
    app.include_router(embedding_jobs.router)
    app.include_router(indexes.router)
    app.include_router(losses.router)
    app.include_router(web_router)  # the dashboard: / and /ui/...
    app.include_router(metrics_router)
    openapi.install(app, token_routes=settings.api_token is not None)
    app.add_middleware(AllowHeader, document=app.openapi)
    app.add_middleware(RequestGuard, settings=settings)
    app.add_middleware(AccessLog)
    app.add_middleware(RequestMetrics, metrics=metrics,
                       templates=RouteTemplates(app.router.routes, app.openapi))
    return app
