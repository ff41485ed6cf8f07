"""Prometheus metrics of the API, served at ``GET /metrics``.

Each app has a registry of its own (not prometheus_client's global one), so that
several apps in one process, as in the tests, count apart.

* Requests: counted and timed by :class:`app.api.middleware.RequestMetrics`, labelled by the route's
  *template* (``/experiments/{experiment_id}``, never the raw path, so that the
  number of series stays bounded; paths that match no route share one label).
* Inference: inputs per answered ``/embed`` and ``/predict`` request, and the time
  to decode, preprocess and run the model for it.
* The text queue (texts waiting for a frozen text encoder): texts and tokens per forward
  pass, each request's seconds queued apart from the pass's seconds computing, the texts
  refused (429) or dropped (client gone), and the queue's length now.
* State read at scrape time (:class:`ServiceCollector`): experiments by status and the
  newest heartbeat of a running one from one grouped query, the broker's queue
  length, and the model cache's hits and misses. A database or broker that is down
  or slow does not fail the scrape: ``corel_database_up 0`` (``corel_broker_up 0``)
  says so, and the series read from it are left out.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

import redis
from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine
from starlette.routing import Match

from app.api.openapi import path_pattern
from app.core.models import STATUSES, Experiment, Status, as_utc, utcnow
from app.core.settings import Settings
from app.serving.model_cache import ModelCache

UNMATCHED = "unmatched"  # the route label of a path that matches no route
METRICS_PATH = "/metrics"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
SCRAPE_TIMEOUT = 1.5  # seconds the database and the broker each get per scrape
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
INFERENCE_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1.0, 2.5, 5.0, 10.0)


class TextQueue(Protocol):
    """What a scrape reads of the text queue (app.serving.inference.InferenceRunner)."""

    @property
    def queued_inputs(self) -> int: ...

    @property
    def queued_requests(self) -> int: ...


class ApiMetrics:
    """The API's metrics and their registry (one per app)."""

    def __init__(self, settings: Settings) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "corel_http_requests", "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"], registry=self.registry)
        self.request_seconds = Histogram(
            "corel_http_request_duration_seconds",
            "Seconds from a request's arrival to the end of its answer (to the start of the "
            "answer for event streams).",
            ["route", "method", "status"], registry=self.registry)
        self.inference_batch = Histogram(
            "corel_inference_batch_size", "Inputs per answered /embed or /predict request.",
            ["endpoint"], buckets=BATCH_BUCKETS, registry=self.registry)
        self.inference_seconds = Histogram(
            "corel_inference_duration_seconds",
            "Seconds to decode, preprocess and run the model for one /embed or /predict "
            "request (waiting for a shared forward pass included, loading the model not).",
            ["endpoint"], buckets=INFERENCE_BUCKETS, registry=self.registry)
        # The queue of texts waiting for a frozen text encoder (app.serving.inference).
        self.text_batch_inputs = Histogram(
            "corel_text_batch_inputs", "Texts per forward pass of the text queue.",
            buckets=BATCH_BUCKETS, registry=self.registry)
        self.text_batch_tokens = Histogram(
            "corel_text_batch_tokens", "Tokens (as the encoder's tokenizer counts them) per "
            "forward pass of the text queue.", buckets=TOKEN_BUCKETS, registry=self.registry)
        self.text_queued_seconds = Histogram(
            "corel_text_queued_seconds", "Seconds a request's texts waited in the queue, from "
            "their arrival to the start of their forward pass.", buckets=INFERENCE_BUCKETS,
            registry=self.registry)
        self.text_compute_seconds = Histogram(
            "corel_text_compute_seconds", "Seconds of one forward pass of the text queue "
            "(tokenizing, the encoder, the head).", buckets=INFERENCE_BUCKETS, registry=self.registry)
        self.text_refused = Counter(
            "corel_text_refused_inputs", "Texts not computed: reason queue_full (answered 429) "
            "or client_gone (dropped from the queue when the client disconnected).",
            ["reason"], registry=self.registry)
        self.text_queue_inputs = Gauge(
            "corel_text_queue_inputs", "Texts waiting in the queue now.", registry=self.registry)
        self.text_queue_requests = Gauge(
            "corel_text_queue_requests", "Requests waiting in the queue now.", registry=self.registry)
        self.service = ServiceCollector(settings)
        self.registry.register(self.service)

    def observe_inference(self, endpoint: str, inputs: int, seconds: float) -> None:
        self.inference_batch.labels(endpoint).observe(inputs)
        self.inference_seconds.labels(endpoint).observe(seconds)

    def observe_text_batch(self, inputs: int, tokens: int, queued: list[float], compute: float) -> None:
        self.text_batch_inputs.observe(inputs)
        self.text_batch_tokens.observe(tokens)
        for seconds in queued:
            self.text_queued_seconds.observe(seconds)
        self.text_compute_seconds.observe(compute)

    def observe_text_refused(self, reason: str, inputs: int) -> None:
        self.text_refused.labels(reason).inc(inputs)

    def watch_text_queue(self, runner: TextQueue) -> None:
        """Read the queue's length from ``runner`` at each scrape."""
        self.text_queue_inputs.set_function(lambda: runner.queued_inputs)
        self.text_queue_requests.set_function(lambda: runner.queued_requests)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class ServiceCollector(Collector):
    """What the database, the broker and the model cache say, read at each scrape."""

    def __init__(self, settings: Settings) -> None:
        self.queue = settings.queue
        self.is_postgres = settings.db_url.startswith("postgresql")
        self.broker: redis.Redis | None = None
        if settings.celery_broker_url.startswith(("redis://", "rediss://")):
            self.broker = redis.Redis.from_url(
                settings.celery_broker_url, socket_timeout=SCRAPE_TIMEOUT,
                socket_connect_timeout=SCRAPE_TIMEOUT)
        self.engine: Engine | None = None
        self.model_cache: ModelCache | None = None
        self.executor: Executor | None = None

    def attach(self, engine: Engine, model_cache: ModelCache, executor: Executor) -> None:
        """The app's resources, once its lifespan has made them; ``executor`` runs the
        queries, so that one that hangs cannot hold the scrape past SCRAPE_TIMEOUT."""
        self.engine, self.model_cache, self.executor = engine, model_cache, executor

    def _experiments(self) -> list[Any]:
        """(status, count, newest heartbeat) per status: one query, on the status index."""
        assert self.engine is not None
        with self.engine.connect() as conn:
            if self.is_postgres:
                conn.execute(text(f"SET LOCAL statement_timeout = {int(SCRAPE_TIMEOUT * 1000)}"))
            return list(conn.execute(
                select(Experiment.status, func.count(), func.max(Experiment.heartbeat_at))
                .group_by(Experiment.status)))

    def _queue_length(self) -> int:
        assert self.broker is not None
        # Kombu's Redis transport keeps a queue's waiting messages in a list of its name.
        return int(self.broker.llen(self.queue))

    def _start(self, job: Callable[[], Any]) -> Future[Any] | None:
        return None if self.executor is None else self.executor.submit(job)

    @staticmethod
    def _result(future: Future[Any] | None, deadline: float) -> tuple[bool, Any]:
        """(True, what the job returned), or (False, None) if it failed or is late."""
        if future is None:
            return False, None
        try:
            return True, future.result(timeout=max(deadline - time.monotonic(), 0.0))
        except FutureTimeout:
            future.cancel()
            return False, None
        except Exception:  # down or refusing
            return False, None

    def collect(self) -> Iterator[Metric]:
        # Both asked at once: a scrape waits at most SCRAPE_TIMEOUT for the two.
        deadline = time.monotonic() + SCRAPE_TIMEOUT
        asked_database = self._start(self._experiments) if self.engine is not None else None
        asked_broker = self._start(self._queue_length) if self.broker is not None else None
        queue = GaugeMetricFamily(
            "corel_queue_depth", "Runs waiting: queued experiments in the database, and "
            "messages in the broker's queue (Redis brokers only).", labels=["source"])
        if self.engine is not None:
            ok, rows = self._result(asked_database, deadline)
            yield GaugeMetricFamily("corel_database_up",
                                    "1 if the database answered this scrape's query in time.",
                                    value=int(ok))
            if ok:
                counts = dict.fromkeys(STATUSES, 0)
                newest = None
                for status, count, heartbeat in rows:
                    counts[status] = int(count)
                    if status == Status.RUNNING and heartbeat is not None:
                        newest = as_utc(heartbeat)
                by_status = GaugeMetricFamily("corel_experiments", "Experiments by status.",
                                              labels=["status"])
                for status, count in counts.items():
                    by_status.add_metric([status], count)
                yield by_status
                queue.add_metric(["database"], counts[Status.QUEUED])
                if newest is not None:
                    yield GaugeMetricFamily(
                        "corel_worker_heartbeat_age_seconds",
                        "Seconds since the newest heartbeat of a running experiment: grows "
                        "past COREL_LEASE_SECONDS when every worker with a run has stopped "
                        "reporting. Absent while nothing runs.",
                        value=max((utcnow() - newest).total_seconds(), 0.0))
        if self.broker is not None:
            ok, length = self._result(asked_broker, deadline)
            yield GaugeMetricFamily("corel_broker_up",
                                    "1 if the Redis broker answered this scrape in time.",
                                    value=int(ok))
            if ok:
                queue.add_metric(["broker"], length)
        yield queue
        if self.model_cache is not None:
            yield CounterMetricFamily(
                "corel_model_cache_hits", "Inference requests whose model was already loaded.",
                value=self.model_cache.hits)
            yield CounterMetricFamily(
                "corel_model_cache_misses",
                "Model loads from the database (a checkpoint read and deserialised).",
                value=self.model_cache.misses)
            yield GaugeMetricFamily("corel_model_cache_models", "Models held in the cache.",
                                    value=len(self.model_cache))


class RouteTemplates:
    """The template of the route a request went to, for a label: the one the router
    picked, else (a request the guard answered before routing, a plain Starlette route)
    the first of the app's routes, then of the OpenAPI document's paths, that matches."""

    def __init__(self, routes: list[Any], document: Callable[[], dict[str, Any]]) -> None:
        self.routes = routes
        self.document = document
        self._paths: list[tuple[re.Pattern[str], str]] | None = None

    def __call__(self, scope: Any) -> str:
        route = scope.get("route")
        template = getattr(route, "path_format", None)
        if isinstance(template, str):
            # Inside a mounted app, the route's template is relative to the mount.
            root = scope.get("root_path", "")
            return root[len(scope.get("app_root_path", root)):] + template
        for candidate in self.routes:
            template = getattr(candidate, "path_format", None)
            if isinstance(template, str) and candidate.matches(scope)[0] != Match.NONE:
                return template
        if self._paths is None:
            paths = list(self.document()["paths"])
            # Literal paths before templates: /experiments/compare, not /experiments/{id}.
            paths.sort(key=lambda p: "{" in p)
            self._paths = [(path_pattern(p), p) for p in paths]
        path = scope["path"]
        return next((template for pattern, template in self._paths if pattern.match(path)),
                    UNMATCHED)


router = APIRouter(tags=["operations"])


@router.get(
    METRICS_PATH, summary="Prometheus metrics of the API (text exposition format)",
    response_class=Response,
    responses={200: {"description": "Metrics in the Prometheus text format",
                     "content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(request: Request) -> Response:
    # A plain def: the scrape's queries block, so it runs in the thread pool.
    api_metrics: ApiMetrics = request.app.state.metrics
    return Response(api_metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
