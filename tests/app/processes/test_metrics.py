"""GET /metrics and a worker's metrics port, against PostgreSQL, Redis and a real worker.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_metrics.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from harness.servers import free_port
from harness.wait import wait_until
from tests.app.api.test_metrics import DIGITS, Samples, present, scrape, scrape_worker, value
from tests.app.conftest import finished, wait_for

# --- a trained experiment: inference, model cache, worker metrics ----------------------


@dataclass
class Trained:
    experiment: dict[str, Any]
    api_before: Samples
    worker_url: str
    worker_before: Samples


@pytest.fixture(scope="module")
def metrics_settings(settings: Settings) -> Settings:
    # A queue of its own, so that this worker trains the run (not the session's worker),
    # and a reconciler that never sends it other tests' leftover rows.
    return settings.model_copy(update={
        "queue": f"corel-metrics-{uuid.uuid4().hex[:8]}", "worker_metrics_port": free_port(),
        "requeue_after_seconds": 1e6, "requeue_max_seconds": 1e6, "lease_seconds": 1e6})


@pytest.fixture(scope="module")
def trained(client, workers, metrics_settings) -> Iterator[Trained]:
    proc = workers.start(metrics_settings)
    url = f"http://127.0.0.1:{metrics_settings.worker_metrics_port}"
    with httpx.Client(base_url=url, timeout=5) as worker_http:

        def scraped() -> Samples | None:
            assert proc.poll() is None, workers.logs()
            try:
                return scrape_worker(worker_http)
            except httpx.TransportError:
                return None

        worker_before = wait_until(scraped, 120, "the worker's metrics endpoint", interval=0.5,
                                   detail=workers.logs)
    api_before = scrape(client)
    with TestClient(create_app(metrics_settings)) as submit:
        r = submit.post("/experiments", json=DIGITS)
        assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, workers=workers)
    assert body["status"] == "succeeded", body
    yield Trained(body, api_before, url, worker_before)
    workers.stop(proc)  # its reconciler would take other tests' runs to its own queue


def test_a_run_moves_the_succeeded_count(client, trained) -> None:
    after = scrape(client)
    moved = (value(after, "corel_experiments", status="succeeded")
             - value(trained.api_before, "corel_experiments", status="succeeded"))
    assert moved == 1


def test_the_worker_reports_its_epochs(trained) -> None:
    before = trained.worker_before
    with httpx.Client(base_url=trained.worker_url, timeout=5) as worker_http:
        # The worker counts a finished run just after the API can see it.
        deadline = time.monotonic() + 30
        while True:
            after = scrape_worker(worker_http)
            done = value(after, "corel_worker_experiments_finished_total", status="succeeded")
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.2)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("corel_worker_experiments_finished_total", status="succeeded") == 1
    assert moved("corel_worker_experiments_finished_total", status="failed") == 0
    assert moved("corel_worker_epochs_total") == DIGITS["epochs"]
    assert moved("corel_worker_epoch_duration_seconds_count") == DIGITS["epochs"]
    assert moved("corel_worker_epoch_duration_seconds_sum") > 0
    assert value(after, "corel_worker_samples_per_second") > 0
    assert present(after, "process_cpu_seconds_total")  # the process's own collector


def test_model_cache_miss_then_hit_and_inference_histograms(client, trained) -> None:
    eid = trained.experiment["id"]
    inputs = np.random.default_rng(0).uniform(0, 16, size=(8, 8, 8)).round(1)
    before = scrape(client)
    first = client.post("/embed", json={"experiment_id": eid, "arrays": inputs[:3].tolist()})
    assert first.status_code == 200, first.text
    missed = scrape(client)
    second = client.post("/embed", json={"experiment_id": eid, "arrays": inputs[3:8].tolist()})
    assert second.status_code == 200, second.text
    hit = scrape(client)

    def moved(a: Samples, b: Samples, name: str, **labels: str) -> float:
        return value(b, name, **labels) - value(a, name, **labels)

    assert moved(before, missed, "corel_model_cache_misses_total") == 1
    assert moved(before, missed, "corel_model_cache_hits_total") == 0
    assert moved(missed, hit, "corel_model_cache_misses_total") == 0
    assert moved(missed, hit, "corel_model_cache_hits_total") == 1

    batch = "corel_inference_batch_size"
    assert moved(before, hit, f"{batch}_count", endpoint="embed") == 2
    assert moved(before, hit, f"{batch}_sum", endpoint="embed") == 3 + 5
    assert moved(before, hit, f"{batch}_bucket", endpoint="embed", le="2.0") == 0
    assert moved(before, hit, f"{batch}_bucket", endpoint="embed", le="4.0") == 1
    assert moved(before, hit, f"{batch}_bucket", endpoint="embed", le="8.0") == 2
    assert moved(before, hit, f"{batch}_count", endpoint="predict") == 0
    assert moved(before, hit, "corel_inference_duration_seconds_count", endpoint="embed") == 2
