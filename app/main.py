"""The FastAPI application factory."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.db import make_engine, make_sessionmaker
from app.errors import DomainError, describe_error
from app.logging import configure_logging
from app.queue import TaskQueue
from app.routes import analysis, datasets, experiments, inference, sweeps
from app.services.inference import InferenceRunner
from app.services.model_cache import ModelCache
from app.services.reconcile import reconcile_in_background
from app.settings import Settings
from worker.celery_app import make_celery

log = logging.getLogger("corel.api")


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


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    configure_logging(settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            from app.migrate import upgrade

            upgrade(settings)
        engine = make_engine(settings.db_url)
        app.state.engine = engine
        app.state.sessionmaker = make_sessionmaker(engine)
        app.state.queue = TaskQueue(make_celery(settings))
        # Runs the broker lost while nothing was watching (every worker also does this).
        reconcile_in_background(app.state.sessionmaker, settings, app.state.queue.enqueue_training)
        app.state.model_cache = ModelCache(settings.model_cache_size)
        app.state.inference = InferenceRunner(settings.api_batch_threads)
        log.info("api started", extra={"database": engine.url.render_as_string(hide_password=True)})
        # What exists at start-up (torch, SQLAlchemy, Celery: hundreds of thousands of
        # objects) lives as long as the process; keep it out of the collector's full
        # passes, which otherwise stall requests for 100+ ms now and then.
        gc.freeze()
        try:
            yield
        finally:
            app.state.inference.close()
            engine.dispose()

    app = FastAPI(
        title="corel",
        version="0.1.0",
        description="Clustering-oriented representation learning (COREL): train, embed, cluster.",
        lifespan=lifespan,
    )
    app.state.settings = settings

    @app.exception_handler(DomainError)
    async def _domain_error(_: Request, exc: DomainError) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code, content={"error": exc.error, "detail": exc.detail, **exc.extra}
        )

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

    @app.get("/health", tags=["operations"], summary="The process is up")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", tags=["operations"], summary="Database and broker reachable (else 503)")
    def ready(request: Request) -> JSONResponse:
        checks: dict[str, str] = {}
        try:
            with request.app.state.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as exc:
            checks["database"] = f"unreachable: {type(exc).__name__}"
        try:
            request.app.state.queue.ping()
            checks["broker"] = "ok"
        except Exception as exc:
            checks["broker"] = f"unreachable: {type(exc).__name__}"
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse(status_code=200 if ok else 503,
                            content={"status": "ready" if ok else "not ready", **checks})

    # Routes are matched in order: the hot inference routes first, and
    # /experiments/compare before /experiments/{id}.
    app.include_router(inference.router)
    app.include_router(analysis.router)
    app.include_router(experiments.router)
    app.include_router(datasets.router)
    app.include_router(sweeps.router)
    app.add_middleware(AccessLog)
    return app
