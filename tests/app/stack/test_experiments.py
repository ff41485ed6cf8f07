"""Experiments over HTTP against PostgreSQL, Redis and real Celery worker processes.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_experiments.py."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import select

from app.core.models import LatentSpace
from corel.data import load_dataset
from corel.train import checkpoint_from_bytes, model_from_checkpoint, represent
from tests.app.api import test_experiments as shared
from tests.app.api.test_experiments import FASHION
from tests.app.conftest import finished, stored_checkpoint, stored_latent, wait_for
from tests.conftest import FASHION_DIR, assert_rows_close

# Fixtures shared with the tests in tests/app/api/test_experiments.py (pytest finds a fixture by its name here).
db = shared.db


def test_fashion_gaussian_experiment_runs_to_the_end(client, worker, workers, db, settings):
    r = client.post("/experiments", json={**FASHION, "epochs": 2})
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued"
    eid = r.json()["id"]
    body = wait_for(client, eid, finished, workers=workers)
    assert body["status"] == "succeeded", body
    assert body["current_epoch"] == body["epochs_total"] == 2
    assert body["test_accuracy"] > 0.5 and body["best_epoch"] in (1, 2)
    assert body["started_at"] and body["finished_at"] and body["train_seconds"] > 0

    metrics = client.get(f"/experiments/{eid}/metrics").json()["items"]
    assert [m["epoch"] for m in metrics] == [1, 2]
    assert all(0 <= m["val_accuracy"] <= 1 and m["train_loss"] > 0 for m in metrics)
    best = max(metrics, key=lambda m: m["val_accuracy"])
    assert body["test_accuracy"] == pytest.approx(best["test_accuracy"])

    # The stored serving checkpoint rebuilds the model, and the stored latent space is
    # exactly that model's representation of the test set.
    blob = stored_checkpoint(settings, db, eid)
    spec, model = model_from_checkpoint(checkpoint_from_bytes(blob))
    latent = db.scalar(select(LatentSpace).where(LatentSpace.experiment_id == eid,
                                                 LatentSpace.split == "test"))
    data = load_dataset(spec, FASHION_DIR)
    assert (latent.n, latent.dim) == (10_000, 128)
    stored, labels = stored_latent(settings, eid, "test")
    assert np.array_equal(labels, data.y_test.numpy())
    assert_rows_close(stored, represent(model, data.x_test).numpy())
    preds = model.predict(data.x_test).classes
    assert float((preds == data.y_test).float().mean()) == pytest.approx(body["test_accuracy"])


def test_cancel_a_running_experiment(client, worker, workers):
    eid = client.post("/experiments", json={**FASHION, "train_subset": None, "epochs": 100}).json()["id"]
    wait_for(client, eid, lambda b: b["status"] == "running" and b["current_epoch"] >= 1,
             workers=workers)
    r = client.post(f"/experiments/{eid}/cancel")
    assert r.status_code == 200 and r.json()["cancel_requested"]
    body = wait_for(client, eid, finished, timeout=60, workers=workers)
    assert body["status"] == "cancelled"
    assert body["current_epoch"] < 100
    n = len(client.get(f"/experiments/{eid}/metrics").json()["items"])
    assert n == body["current_epoch"]
    assert client.post(f"/experiments/{eid}/cancel").status_code == 409
    # It serves the best checkpoint it had (a 409 before: "only a succeeded experiment").
    image = np.zeros((1, 28, 28), dtype=np.uint8).tolist()
    r = client.post("/embed", json={"experiment_id": eid, "arrays": image})
    assert r.status_code == 200, r.text
    assert r.json()["checkpoint"]["epoch"] == body["best_epoch"] >= 1
    assert client.post("/predict", json={"experiment_id": eid, "arrays": image}).status_code == 200
    # /neighbors serves it too, as docs/service.md says: its training split was stored at the
    # cancel, from the same best checkpoint (a 409 before, "trained before ... train it again").
    near = client.post(f"/experiments/{eid}/neighbors", json={"arrays": image, "k": 3})
    assert near.status_code == 200, near.text
    assert len(near.json()["results"][0]["neighbors"]) == 3
    predicted = client.post("/predict", json={"experiment_id": eid, "arrays": image}).json()
    assert near.json()["results"][0]["prediction"]["class_index"] == predicted["predictions"][0]["class_index"]


def test_a_run_records_the_device_and_precision_it_trained_in(client, worker):
    spec = {"dataset": "digits", "loss": "cosine", "lam": 0.8, "epochs": 2, "batch_size": 64,
            "lr": 3e-3}
    ids = {p: client.post("/experiments", json={**spec, "precision": p}).json()["id"]
           for p in ("bf16", "fp32")}
    for precision, eid in ids.items():
        body = wait_for(client, eid, finished)
        assert body["status"] == "succeeded", body
        assert (body["device"], body["precision"]) == ("cpu", precision)
        assert body["spec"]["precision"] == precision
    r = client.post("/experiments", json={**spec, "precision": "fp16"})
    assert r.status_code == 422 and "bf16" in r.text, r.text
