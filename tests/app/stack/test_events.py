"""Live progress as Server-Sent Events, over real HTTP: PostgreSQL with a real worker
(NOTIFY on commit, one LISTEN connection per API process), and the embedded SQLite
default (one poller per process). Streams are read with httpx and parsed here, not with
the service's own client code."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy import text, update
from sqlalchemy.orm import Session, sessionmaker

import app.jobs.events as events_module
from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.migrate import upgrade
from app.core.models import EpochMetric, Experiment, utcnow
from app.core.settings import Settings
from app.jobs.events import publish
from app.main import create_app
from harness.wait import wait_until
from tests.app.conftest import PG_ADMIN_URL, corel_cli, serving

EPOCHS = 8
FAST = {"dataset": "digits", "model": "ffnn", "loss": "gaussian", "lam": 0.85, "epochs": EPOCHS,
        "lr": 0.003, "batch_size": 64}
FINISHED = ("succeeded", "failed", "cancelled")


def read_events(url: str, path: str, headers: dict[str, str] | None = None,
                stop: Callable[[dict[str, Any]], bool] | None = None,
                limit: float = 240) -> tuple[list[dict[str, Any]], bool]:
    """The events of a stream, and whether the server ended it (False: ``stop`` said to
    hang up after an event). Each event: ``{"id", "event", "data", "at"}``; comment lines
    are kept as ``{"comment": ...}``."""
    events: list[dict[str, Any]] = []
    deadline = time.monotonic() + limit
    with httpx.stream("GET", url + path, headers=headers or {},
                      timeout=httpx.Timeout(10, read=60)) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        block: dict[str, Any] = {}
        for line in r.iter_lines():
            assert time.monotonic() < deadline, f"stream still open after {limit} s: {events}"
            if line.startswith(":"):
                events.append({"comment": line, "at": time.monotonic()})
                if stop and stop(events[-1]):
                    return events, False
            elif line:
                name, _, value = line.partition(": ")
                block[name] = json.loads(value) if name == "data" else value
            elif block:
                block["at"] = time.monotonic()
                events.append(block)
                block = {}
                if stop and stop(events[-1]):
                    return events, False
    return events, True


def of(events: list[dict[str, Any]], kind: str, experiment_id: int | None = None) -> list[dict]:
    return [e["data"] for e in events if e.get("event") == kind
            and (experiment_id is None or e["data"]["experiment_id"] == experiment_id)]


def epochs_of(events: list[dict[str, Any]], experiment_id: int | None = None) -> list[int]:
    return [d["epoch"] for d in of(events, "epoch", experiment_id)]


def submit(url: str, **overrides: Any) -> int:
    r = httpx.post(f"{url}/experiments", json={**FAST, **overrides}, timeout=30)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def wait_finished(url: str, experiment_id: int, limit: float = 240) -> dict[str, Any]:
    def body() -> dict[str, Any]:
        return dict(httpx.get(f"{url}/experiments/{experiment_id}", timeout=30).json())

    def finished() -> dict[str, Any] | None:
        got = body()
        return got if got["status"] in FINISHED else None

    return wait_until(finished, limit, f"experiment {experiment_id} to finish", interval=0.2,
                      detail=body)


# -- a writer of our own, standing in for a worker, for exact timing ------------------------

def add_running(factory: sessionmaker[Session], epochs_total: int = 5) -> int:
    """A running experiment that no worker will touch: its lease is fresh for a day, so no
    reconciler sends it again."""
    with session_scope(factory) as session:
        exp = Experiment(status="running", spec=dict(FAST, epochs=epochs_total), dataset="digits",
                         loss="gaussian", epochs_total=epochs_total, current_epoch=0,
                         train_seconds=0.0, cancel_requested=False, attempts=1,
                         worker="test-writer", heartbeat_at=utcnow() + timedelta(days=1),
                         started_at=utcnow(), enqueues=1)
        session.add(exp)
        session.flush()
        return exp.id


def write_epoch(factory: sessionmaker[Session], experiment_id: int, epoch: int) -> None:
    """What the worker commits after an epoch: the metrics and the row, with its NOTIFY."""
    with session_scope(factory) as session:
        session.add(EpochMetric(experiment_id=experiment_id, epoch=epoch, train_loss=1.0 / epoch,
                                train_accuracy=0.5, val_accuracy=0.1 * epoch, test_accuracy=None,
                                is_best=True, seconds=0.01))
        session.execute(update(Experiment).where(Experiment.id == experiment_id)
                        .values(current_epoch=epoch, best_epoch=epoch, best_val_accuracy=0.1 * epoch))
        publish(session, [experiment_id])


def write_status(factory: sessionmaker[Session], experiment_id: int, status: str) -> None:
    with session_scope(factory) as session:
        session.execute(update(Experiment).where(Experiment.id == experiment_id)
                        .values(status=status, finished_at=utcnow()))
        publish(session, [experiment_id])


class Reader:
    """A stream read in a thread, so that the test can write while it listens."""

    def __init__(self, url: str, path: str, **kwargs: Any) -> None:
        self.result: tuple[list[dict[str, Any]], bool] | None = None
        self.error: BaseException | None = None
        self.events: list[dict[str, Any]] = []
        user_stop = kwargs.pop("stop", None)

        def stop(event: dict[str, Any]) -> bool:
            self.events.append(event)
            return bool(user_stop and user_stop(event))

        def run() -> None:
            try:
                self.result = read_events(url, path, stop=stop, **kwargs)
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def wait_for(self, check: Callable[[list[dict[str, Any]]], bool], limit: float = 10) -> float:
        """Seconds until ``check(events so far)`` holds."""
        started = time.monotonic()
        while time.monotonic() - started < limit:
            if self.error is not None:
                raise self.error
            if check(list(self.events)):
                return time.monotonic() - started
            time.sleep(0.02)
        raise AssertionError(f"not within {limit} s; events: {self.events}")

    def join(self, limit: float = 30) -> tuple[list[dict[str, Any]], bool]:
        self.thread.join(limit)
        if self.error is not None:
            raise self.error
        assert self.result is not None, f"stream still open after {limit} s: {self.events}"
        return self.result


# -- PostgreSQL, a real worker ----------------------------------------------------------------

@pytest.fixture(scope="module")
def live(settings: Settings, worker: subprocess.Popen[bytes]) -> Iterator[tuple[str, Any]]:
    """The service over HTTP, its safety-net sweep turned off: only NOTIFY wakes streams."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(events_module, "SAFETY_SECONDS", 3600.0)
        app = create_app(settings)
        with serving(app) as url:
            assert app.state.events.listening.wait(10), "the LISTEN connection did not come up"
            yield url, app


@pytest.fixture(scope="module")
def pg_factory(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture(scope="module")
def finished_run(live: tuple[str, Any]) -> int:
    url, _ = live
    experiment_id = submit(url)
    assert wait_finished(url, experiment_id)["status"] == "succeeded"
    return experiment_id


def test_two_clients_get_every_epoch_once_in_order_then_the_terminal_status(live, pg_factory) -> None:
    url, _ = live
    # Both clients connect before the run ends: its first commit of epochs (the worker holds
    # a second's epochs, and these runs train in less) waits on this lock until they have
    # their first event. A client that connects later is sent the terminal status first.
    with pg_factory() as session:
        session.execute(text("LOCK TABLE epoch_metrics IN EXCLUSIVE MODE"))
        experiment_id = submit(url)
        path = f"/experiments/{experiment_id}/events"
        readers = [Reader(url, path), Reader(url, path)]
        for reader in readers:
            reader.wait_for(lambda events: bool(of(events, "status")), limit=60)
        session.rollback()
    results = [r.join(240) for r in readers]
    metrics = httpx.get(f"{url}/experiments/{experiment_id}/metrics").json()["items"]
    assert [m["epoch"] for m in metrics] == list(range(1, EPOCHS + 1))
    for events, ended in results:
        assert ended, "the stream did not end"
        assert epochs_of(events) == list(range(1, EPOCHS + 1))
        # The figures are the recorded ones.
        assert [d["val_accuracy"] for d in of(events, "epoch")] == [m["val_accuracy"] for m in metrics]
        assert all(d["epochs_total"] == EPOCHS for d in of(events, "epoch"))
        statuses = [d["status"] for d in of(events, "status")]
        assert events[-1]["event"] == "status" and statuses[-1] == "succeeded"
        assert len(statuses) == len(set(statuses)), statuses
        # Connected before the run ended, so at least the end came live (safety net off).
        assert statuses[0] in ("queued", "running"), statuses
        final = of(events, "status")[-1]
        assert final["current_epoch"] == EPOCHS and final["test_accuracy"] is not None
        ids = [e["id"] for e in events if "id" in e]
        assert len(ids) == len(set(ids)) == len([e for e in events if "event" in e])


def test_a_client_that_reconnects_with_last_event_id_gets_only_what_it_missed(live) -> None:
    url, _ = live
    experiment_id = submit(url)
    path = f"/experiments/{experiment_id}/events"
    k = 3
    first, ended = read_events(url, path, stop=lambda e: e.get("event") == "epoch"
                               and e["data"]["epoch"] == k)
    assert not ended and epochs_of(first) == list(range(1, k + 1))
    last_status = of(first, "status")[-1]["status"]
    rest, ended = read_events(url, path, headers={"Last-Event-ID": first[-1]["id"]})
    assert ended
    assert epochs_of(rest) == list(range(k + 1, EPOCHS + 1))
    statuses = [d["status"] for d in of(rest, "status")]
    assert statuses == ([] if last_status == "succeeded" else ["succeeded"])
    # Together: every epoch exactly once.
    assert epochs_of(first) + epochs_of(rest) == list(range(1, EPOCHS + 1))


def test_notify_wakes_streams_at_once_and_a_resume_replays_exactly(live, pg_factory) -> None:
    url, _ = live
    experiment_id = add_running(pg_factory, epochs_total=5)
    path = f"/experiments/{experiment_id}/events"
    write_epoch(pg_factory, experiment_id, 1)
    reader = Reader(url, path, stop=lambda e: e.get("event") == "epoch" and e["data"]["epoch"] == 2)
    reader.wait_for(lambda ev: epochs_of(ev) == [1])
    write_epoch(pg_factory, experiment_id, 2)
    # With the safety net at an hour, only the NOTIFY can have woken the stream this fast.
    assert reader.wait_for(lambda ev: epochs_of(ev) == [1, 2], limit=5) < 3
    first, ended = reader.join()
    assert not ended
    # Missed while away, then live.
    write_epoch(pg_factory, experiment_id, 3)
    write_epoch(pg_factory, experiment_id, 4)
    again = Reader(url, path, headers={"Last-Event-ID": first[-1]["id"]})
    again.wait_for(lambda ev: epochs_of(ev) == [3, 4])
    write_epoch(pg_factory, experiment_id, 5)
    again.wait_for(lambda ev: epochs_of(ev) == [3, 4, 5], limit=5)
    write_status(pg_factory, experiment_id, "succeeded")
    rest, ended = again.join()
    assert ended and epochs_of(rest) == [3, 4, 5]
    assert [d["status"] for d in of(rest, "status")] == ["succeeded"]
    assert rest[-1]["event"] == "status"


def test_the_listener_reconnects_after_losing_its_connection(live, pg_factory, settings) -> None:
    url, app = live
    hub = app.state.events
    database = settings.database_url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND query LIKE 'LISTEN corel_events%%'", (database,)).fetchall()
    assert killed, "no LISTEN connection found"
    deadline = time.monotonic() + 5
    while hub.listening.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub.listening.wait(15), "the listener did not reconnect"
    experiment_id = add_running(pg_factory, epochs_total=1)
    reader = Reader(url, f"/experiments/{experiment_id}/events")
    reader.wait_for(lambda ev: len(of(ev, "status")) == 1)
    write_epoch(pg_factory, experiment_id, 1)
    assert reader.wait_for(lambda ev: epochs_of(ev) == [1], limit=5) < 3
    write_status(pg_factory, experiment_id, "failed")
    events, ended = reader.join()
    assert ended and [d["status"] for d in of(events, "status")] == ["running", "failed"]


def test_a_sweep_stream_delivers_every_members_epochs_and_closes_when_all_are_done(live) -> None:
    url, _ = live
    epochs = 4
    r = httpx.post(f"{url}/sweeps", json={"base": dict(FAST, epochs=epochs),
                                          "grid": {"loss": ["gaussian", "cce"], "seed": [0, 1]}})
    assert r.status_code == 202, r.text
    sweep_id = r.json()["id"]
    members = httpx.get(f"{url}/sweeps/{sweep_id}").json()["experiment_ids"]
    assert len(members) == 4
    path = f"/sweeps/{sweep_id}/events"
    # Hang up part way, then resume from the last id.
    first, ended = read_events(url, path, stop=lambda e: len(of([e], "epoch")) == 1
                               and e["data"]["epoch"] == 2)
    assert not ended
    rest, ended = read_events(url, path, headers={"Last-Event-ID": first[-1]["id"]})
    assert ended
    events = first + rest
    assert {d["experiment_id"] for d in of(events, "status")} == set(members)
    for experiment_id in members:
        assert epochs_of(events, experiment_id) == list(range(1, epochs + 1)), experiment_id
        statuses = [d["status"] for d in of(events, "status", experiment_id)]
        assert len(statuses) == len(set(statuses)) and statuses[-1] in FINISHED, statuses
        mine = [e for e in events if e.get("data", {}).get("experiment_id") == experiment_id]
        # Its terminal status is its last word, unless it was already over when we came.
        assert mine[-1]["event"] == "status" or statuses[0] in FINISHED
    progress = httpx.get(f"{url}/sweeps/{sweep_id}").json()
    assert progress["finished"]
    last = {d["experiment_id"]: d["status"] for d in of(events, "status")}
    assert last == {i: httpx.get(f"{url}/experiments/{i}").json()["status"] for i in members}


def test_unknown_ids_are_404_and_a_malformed_last_event_id_is_422(live, finished_run) -> None:
    url, _ = live
    for path in ("/experiments/99999999/events", "/sweeps/99999999/events", "/experiments/0/events"):
        r = httpx.get(url + path)
        assert r.status_code == 404, path
        assert r.json()["error"] == "not_found" and "does not exist" in r.json()["detail"]
    for bad in ("junk", "3x", "-1r", "2:1*3r"):
        r = httpx.get(f"{url}/experiments/{finished_run}/events", headers={"Last-Event-ID": bad})
        assert r.status_code == 422, bad
        assert r.json()["error"] == "invalid_input" and "Last-Event-ID" in r.json()["detail"]


def test_a_finished_experiment_replays_and_closes(live, finished_run) -> None:
    url, _ = live
    events, ended = read_events(url, f"/experiments/{finished_run}/events")
    assert ended and events[0]["event"] == "status" and events[0]["data"]["status"] == "succeeded"
    assert epochs_of(events) == list(range(1, EPOCHS + 1))
    # Resuming after the end sends nothing more and closes.
    rest, ended = read_events(url, f"/experiments/{finished_run}/events",
                              headers={"Last-Event-ID": events[-1]["id"]})
    assert ended and rest == []


def _corel(*args: str, settings: Settings) -> subprocess.CompletedProcess[str]:
    return corel_cli(settings, *args)


def test_corel_watch_exits_0_for_a_success_and_1_otherwise(live, finished_run, pg_factory,
                                                           settings) -> None:
    url, _ = live
    run = _corel("watch", str(finished_run), "--url", url, settings=settings)
    assert run.returncode == 0, run.stderr
    assert f"experiment {finished_run} succeeded" in run.stdout
    failed = add_running(pg_factory, epochs_total=2)
    write_epoch(pg_factory, failed, 1)
    with session_scope(pg_factory) as session:
        session.execute(update(Experiment).where(Experiment.id == failed)
                        .values(status="failed", error="ValueError: broken on purpose"))
    run = _corel("watch", str(failed), "--url", url, settings=settings)
    assert run.returncode == 1, run.stderr
    assert f"experiment {failed} failed" in run.stdout and "broken on purpose" in run.stdout
    run = _corel("watch", "99999999", "--url", url, settings=settings)
    assert run.returncode != 0 and "404" in run.stderr


def test_the_events_routes_are_in_the_openapi_document_with_their_404(live) -> None:
    url, _ = live
    doc = httpx.get(f"{url}/openapi.json").json()
    for path in ("/experiments/{experiment_id}/events", "/sweeps/{sweep_id}/events"):
        responses = doc["paths"][path]["get"]["responses"]
        assert "text/event-stream" in responses["200"]["content"]
        assert "404" in responses and "422" in responses
        assert any(p["name"] == "last-event-id" and p["in"] == "header"
                   for p in doc["paths"][path]["get"]["parameters"])


# -- the embedded default: SQLite, one poller -------------------------------------------------

@pytest.fixture()
def sqlite_settings(tmp_path: Path) -> Settings:
    s = Settings(database_url=f"sqlite:///{tmp_path / 'corel.sqlite3'}", var_dir=tmp_path,
                 broker_url="memory://", log_level="WARNING")
    upgrade(s)
    return s


@pytest.fixture()
def sqlite_factory(sqlite_settings: Settings) -> Iterator[sessionmaker[Session]]:
    # Another engine than the app's: the writer is another process in real life.
    engine = make_engine(sqlite_settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def test_a_warm_notification_loads_the_run_into_every_api_process_s_cache(live, pg_factory, finished_run,
                                                                         caplog) -> None:
    """publish_warm (a promotion's candidate, before its flip) makes the API process load the
    run's model before any request asks for it; a run that cannot be loaded is logged, and the
    warming goes on. A rolled-back transaction sends nothing."""
    _, app = live
    cache = app.state.model_cache
    cache.invalidate(finished_run)
    with session_scope(pg_factory) as session:
        events_module.publish_warm(session, finished_run)
        session.rollback()
    time.sleep(1.0)
    assert cache.peek(finished_run) is None, "a rolled-back warm-up was delivered"
    with caplog.at_level("WARNING", logger="corel.events"):
        with session_scope(pg_factory) as session:
            events_module.publish_warm(session, 2_000_000_000)  # no such run
        with session_scope(pg_factory) as session:
            events_module.publish_warm(session, finished_run)
        wait_until(lambda: cache.peek(finished_run) is not None, 30, "the run's model in the API's cache")
    assert any("could not warm" in r.getMessage() and getattr(r, "experiment", None) == 2_000_000_000
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_warm_payloads_are_told_from_experiment_ids() -> None:
    assert events_module._parse_warm("warm:12") == (12, None)
    assert events_module._parse_warm("warm:12:7") == (12, 7)
    for payload in ("12,13", "warm:", "warm:x", "warm:1:2:3", "warm:1:"):
        assert events_module._parse_warm(payload) is None, payload
    # An experiment stream never mistakes one for its ids.
    assert events_module._parse_payload("warm:12:7") == set()
