"""GET /metrics and a worker's metrics port, against PostgreSQL, Redis and a real worker.

Every check compares two scrapes around something the test does (requests, an
experiment, a training run, inference calls) and expects the exact change.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from app.api.metrics import UNMATCHED, ApiMetrics, RouteTemplates
from app.api.middleware import RequestMetrics
from app.core.settings import Settings
from app.core.timing import parse_header
from app.main import create_app
from tests.app.conftest import own_database

DIGITS = {"dataset": "digits", "model": "ffnn", "loss": "cce", "epochs": 2, "lr": 0.003,
          "batch_size": 64}
TOKEN = "metrics-token"

Samples = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Samples:
    return [(s.name, s.labels, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples]


def scrape(client: TestClient, **headers: str) -> Samples:
    """The API's metrics."""
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == CONTENT_TYPE_LATEST
    return parse(r.text)


def scrape_worker(client: httpx.Client) -> Samples:
    """A worker's metrics (prometheus_client's own server picks the content type)."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    return parse(r.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called ``name`` that carry ``labels`` (0 if none: a counter
    that has not counted yet)."""
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def present(samples: Samples, name: str, **labels: str) -> bool:
    return any(n == name and labels.items() <= lab.items() for n, lab, _ in samples)


# --- the API's own metrics -------------------------------------------------------------


def test_metrics_parse_and_report_the_services(client) -> None:
    samples = scrape(client)
    assert value(samples, "corel_database_up") == 1
    assert value(samples, "corel_broker_up") == 1
    for status in ("queued", "running", "succeeded", "failed", "cancelled"):
        assert present(samples, "corel_experiments", status=status)
    assert present(samples, "corel_queue_depth", source="database")
    assert present(samples, "corel_queue_depth", source="broker")
    assert present(samples, "corel_model_cache_hits_total")
    assert present(samples, "corel_model_cache_misses_total")


def test_requests_are_counted_by_route_template(client) -> None:
    route = "/experiments/{experiment_id}"
    before = scrape(client)
    ids = [10**9 + i for i in range(3)]
    for eid in ids:
        assert client.get(f"/experiments/{eid}").status_code == 404
    for _ in range(2):
        assert client.get(f"/no/such/{uuid.uuid4().hex}").status_code == 404
    assert client.put(f"/experiments/{ids[0]}").status_code == 405
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("corel_http_requests_total", route=route, method="GET", status="404") == 3
    assert moved("corel_http_request_duration_seconds_count", route=route, method="GET",
                 status="404") == 3
    assert moved("corel_http_requests_total", route=UNMATCHED, method="GET", status="404") == 2
    assert moved("corel_http_requests_total", route=route, method="PUT", status="405") == 1
    # The previous scrape is counted too, under its own template.
    assert moved("corel_http_requests_total", route="/metrics", method="GET", status="200") == 1
    # Raw paths never become labels.
    assert not any(lab.get("route", "").startswith(("/experiments/1", "/no/"))
                   for _, lab, _ in after)


@pytest.mark.own_auth
def test_the_metrics_route_follows_the_token_rule_of_reads(settings) -> None:
    guarded = settings.model_copy(update={"api_token": SecretStr(TOKEN)})
    with TestClient(create_app(guarded)) as c:
        assert c.get("/metrics").status_code == 401
        assert c.get("/experiments/1").status_code == 401
        samples = scrape(c, authorization=f"Bearer {TOKEN}")
    # Refused by the guard before routing, and still counted under their templates.
    assert value(samples, "corel_http_requests_total", route="/metrics", status="401") == 1
    assert value(samples, "corel_http_requests_total", route="/experiments/{experiment_id}",
                 status="401") == 1


def test_an_event_stream_is_observed_when_it_starts() -> None:
    """A stream that stays open must not keep its request out of the metrics."""
    metrics = ApiMetrics(Settings(broker_url="memory://"))
    release = asyncio.Event()

    async def stream(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await release.wait()
        await send({"type": "http.response.body", "body": b""})

    app = RequestMetrics(stream, metrics, RouteTemplates([], lambda: {"paths": {}}))

    def count() -> float:
        return value(parse(metrics.exposition().decode()), "corel_http_requests_total",
                     status="200")

    async def main() -> tuple[float, float]:
        async def send(_: Any) -> None:
            pass

        async def receive() -> Any:
            await asyncio.sleep(3600)

        scope = {"type": "http", "method": "GET", "path": "/events", "headers": []}
        task = asyncio.create_task(app(scope, receive, send))
        await asyncio.sleep(0.05)
        during = count()
        release.set()
        await task
        return during, count()

    during, after = asyncio.run(main())
    assert (during, after) == (1, 1)


# --- Server-Timing: where a request's time went ----------------------------------------


def timed(app: Any, path: str = "/x") -> list[tuple[bytes, bytes]]:
    """The headers ``app`` answers a GET of ``path`` with."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    asyncio.run(app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send))
    return next(m for m in sent if m["type"] == "http.response.start")["headers"]


def test_an_answer_says_how_long_it_spent_in_the_app_and_in_its_statements(tmp_path) -> None:
    """A route that waits 50 ms and runs 3 statements on a thread of the pool (as Starlette
    runs a sync route, with a copy of the request's context): ``app`` holds the wait,
    ``db`` counts exactly those 3, and a statement outside any request counts nowhere."""
    import anyio.to_thread
    from sqlalchemy import text

    from app.core.db import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'timed.db'}")
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))  # outside a request: nothing open to count it

    def statements() -> None:
        with engine.connect() as conn:
            for i in range(3):
                conn.execute(text("SELECT :i"), {"i": i})

    async def route(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.05)
        await anyio.to_thread.run_sync(statements)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": b"ok"})

    metrics = ApiMetrics(Settings(broker_url="memory://"))
    templates = RouteTemplates([], lambda: {"paths": {}})
    started = time.perf_counter()
    headers = dict(timed(RequestMetrics(route, metrics, templates)))
    elapsed_ms = 1000 * (time.perf_counter() - started)
    found = parse_header(headers[b"server-timing"].decode())
    assert set(found) == {"app", "db"}
    app_ms, db_ms = found["app"][0], found["db"][0]
    assert 50 <= app_ms <= elapsed_ms, (app_ms, elapsed_ms)
    assert 0 < db_ms < app_ms - 50 + 1, found
    assert found["db"][1] == "3 SQL statements"
    # Off (COREL_SERVER_TIMING=false): no header, and nothing counted.
    off = dict(timed(RequestMetrics(route, metrics, templates, server_timing=False)))
    assert b"server-timing" not in off
    engine.dispose()


def test_the_service_s_answers_carry_server_timing(client) -> None:
    """On the session's app and PostgreSQL: a list reads rows, and its answer says so."""
    started = time.perf_counter()
    r = client.get("/experiments", params={"limit": 5})
    elapsed_ms = 1000 * (time.perf_counter() - started)
    assert r.status_code == 200, r.text
    found = parse_header(r.headers["server-timing"])
    app_ms, db_ms = found["app"][0], found["db"][0]
    statements = int(found["db"][1].split()[0])
    assert statements >= 1 and 0 < db_ms < app_ms <= elapsed_ms, (found, elapsed_ms)


@pytest.fixture(scope="module")
def idle_client(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """An app on a database and queue of its own that no worker reads: what it submits stays
    queued, and no other test's row is counted (on the session's database, rows that other
    tests left queued, in the open pass where no worker runs, were sent again to this app's
    queue at its start-up)."""
    with own_database(settings, tmp_path_factory.mktemp("metrics-idle")) as own:
        # Its reconciler must not send its own queued row again while it is counted.
        idle = own.model_copy(update={
            "requeue_after_seconds": 1e6, "requeue_max_seconds": 1e6, "lease_seconds": 1e6})
        with TestClient(create_app(idle)) as c:
            yield c


def test_experiments_by_status_and_queue_depth_follow_the_rows(idle_client) -> None:
    before = scrape(idle_client)
    r = idle_client.post("/experiments", json=DIGITS)
    assert r.status_code == 202, r.text
    queued = scrape(idle_client)
    assert idle_client.post(f"/experiments/{r.json()['id']}/cancel").status_code == 200
    cancelled = scrape(idle_client)

    def moved(a: Samples, b: Samples, name: str, **labels: str) -> float:
        return value(b, name, **labels) - value(a, name, **labels)

    assert moved(before, queued, "corel_experiments", status="queued") == 1
    assert moved(before, queued, "corel_queue_depth", source="database") == 1
    # The queue is this app's own: the one message sent is the whole of it.
    assert value(before, "corel_queue_depth", source="broker") == 0
    assert value(queued, "corel_queue_depth", source="broker") == 1
    assert moved(queued, cancelled, "corel_experiments", status="queued") == -1
    assert moved(queued, cancelled, "corel_experiments", status="cancelled") == 1


def test_a_scrape_answers_when_the_database_and_broker_do_not(settings) -> None:
    # Sockets that accept connections and never answer: a hung database and broker.
    with socket.socket() as db, socket.socket() as broker:
        for sock in (db, broker):
            sock.bind(("127.0.0.1", 0))
            sock.listen(16)
        hung = settings.model_copy(update={
            "database_url": f"postgresql://corel@127.0.0.1:{db.getsockname()[1]}/corel",
            "broker_url": f"redis://127.0.0.1:{broker.getsockname()[1]}/0"})
        with TestClient(create_app(hung)) as c:
            started = time.monotonic()
            samples = scrape(c)
            took = time.monotonic() - started
    assert value(samples, "corel_database_up") == 0
    assert value(samples, "corel_broker_up") == 0
    assert not present(samples, "corel_experiments")
    assert not present(samples, "corel_queue_depth")
    assert took < 3, f"the scrape took {took:.1f} s"


