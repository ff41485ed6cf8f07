"""POST /embed and /predict against a trained experiment in PostgreSQL.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_inference.py."""

from __future__ import annotations

import threading

from fastapi.testclient import TestClient

from app.main import create_app
from app.serving.model_cache import ModelCache


def test_cache_is_a_bounded_lru_and_loads_once_under_concurrency():
    cache, loads = ModelCache(2), []

    def loader(key):
        def load():
            loads.append(key)
            return object()
        return load

    threads = [threading.Thread(target=cache.get, args=(1, loader(1))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == [1]
    cache.get(2, loader(2))
    cache.get(1, loader(1))  # 1 is now the most recent
    cache.get(3, loader(3))  # evicts 2
    assert cache.peek(2) is None and cache.peek(1) is not None and len(cache) == 2


def test_unknown_and_unfinished_experiments(client, settings):
    r = client.post("/predict", json={"experiment_id": 987654, "arrays": [[0]]})
    assert r.status_code == 404 and "987654" in r.json()["detail"]
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        eid = c.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"]
        r = c.post("/embed", json={"experiment_id": eid, "arrays": [[0]]})
        assert r.status_code == 409 and "is queued" in r.json()["detail"]
        c.post(f"/experiments/{eid}/cancel")
