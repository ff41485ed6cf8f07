"""Live progress as Server-Sent Events, over real HTTP: PostgreSQL with a real worker (NOTIFY on
commit, one LISTEN connection per API process), and the embedded SQLite default (one poller per
process). Streams are read with httpx and parsed here, not with the service's own client code.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_events.py."""

from __future__ import annotations

import httpx
import pytest
from pydantic import SecretStr

import app.jobs.progress_stream as stream_module
from app.jobs.progress_stream import Sent, encode_sweep, sweep_position
from app.main import create_app
from tests.app.conftest import serving
from tests.app.stack import test_events as shared
from tests.app.stack.test_events import (
    Reader,
    add_running,
    epochs_of,
    of,
    read_events,
    write_epoch,
    write_status,
)

# Fixtures shared with the tests in tests/app/stack/test_events.py (pytest finds a fixture by its name here).
sqlite_factory, sqlite_settings = shared.sqlite_factory, shared.sqlite_settings


def test_the_sqlite_default_delivers_live_epochs_by_polling(sqlite_settings, sqlite_factory) -> None:
    app = create_app(sqlite_settings)
    with serving(app) as url:
        assert not app.state.events.uses_listen
        experiment_id = add_running(sqlite_factory, epochs_total=3)
        other = add_running(sqlite_factory, epochs_total=3)  # watched by no one
        reader = Reader(url, f"/experiments/{experiment_id}/events")
        reader.wait_for(lambda ev: len(of(ev, "status")) == 1)
        for epoch in (1, 2, 3):
            write_epoch(sqlite_factory, experiment_id, epoch)
            write_epoch(sqlite_factory, other, epoch)
            assert reader.wait_for(lambda ev, n=epoch: epochs_of(ev) == list(range(1, n + 1)),
                                   limit=5) < 3
        write_status(sqlite_factory, experiment_id, "succeeded")
        events, ended = reader.join()
    assert ended
    assert [d["status"] for d in of(events, "status")] == ["running", "succeeded"]
    assert {d["experiment_id"] for d in of(events, "epoch")} == {experiment_id}
    assert [d["val_accuracy"] for d in of(events, "epoch")] == pytest.approx([0.1, 0.2, 0.3])


def test_silence_gets_a_keepalive_comment(sqlite_settings, sqlite_factory, monkeypatch) -> None:
    monkeypatch.setattr(stream_module, "KEEPALIVE_SECONDS", 0.3)
    app = create_app(sqlite_settings)
    with serving(app) as url:
        experiment_id = add_running(sqlite_factory)
        reader = Reader(url, f"/experiments/{experiment_id}/events")
        reader.wait_for(lambda ev: any(e.get("comment") == ": keepalive" for e in ev))
        write_status(sqlite_factory, experiment_id, "cancelled")
        _, ended = reader.join()
    assert ended


@pytest.mark.own_auth
def test_the_stream_needs_the_token_like_every_read(sqlite_settings, sqlite_factory) -> None:
    guarded = sqlite_settings.model_copy(update={"api_token": SecretStr("s3cret")})
    app = create_app(guarded)
    with serving(app) as url:
        experiment_id = add_running(sqlite_factory)
        write_status(sqlite_factory, experiment_id, "succeeded")
        r = httpx.get(f"{url}/experiments/{experiment_id}/events")
        assert r.status_code == 401 and r.json()["error"] == "unauthorized"
        events, ended = read_events(url, f"/experiments/{experiment_id}/events",
                                    headers={"Authorization": "Bearer s3cret"})
        assert ended and [d["status"] for d in of(events, "status")] == ["succeeded"]


def test_sweep_ids_decode_to_what_they_encode() -> None:
    tokens = ["6s", "6s", "6s", "3r", "0-", "0-", "12f", "0q"]
    encoded = encode_sweep(tokens)
    assert encoded == "8:3*6s.3r.2*0-.12f.0q"
    assert [s.token() for s in sweep_position(encoded, 8)] == tokens
    assert sweep_position(None, 2) == [Sent(), Sent()]
    # Runs that are not merged decode too (the server writes them so while it streams).
    assert [s.token() for s in sweep_position("3:1*0q.0q.0q", 3)] == ["0q"] * 3
    with pytest.raises(Exception, match="one was deleted"):
        sweep_position(encoded, 7)
    for bad in ("8", "x:1q", "2:1q", "2:2*1z", "2:1q..1q", ""):
        if bad:
            with pytest.raises(Exception, match="Last-Event-ID"):
                sweep_position(bad, 2)
