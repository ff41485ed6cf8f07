"""Experiments over HTTP against PostgreSQL, Redis and real Celery worker processes.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_experiments.py."""

from __future__ import annotations

import pytest

from corel.spec import ExperimentSpec
from corel.train import fit
from tests.app.api.test_experiments import FASHION
from tests.app.conftest import finished, own_stack, wait_for
from tests.conftest import FASHION_DIR


def test_killed_worker_resumes_with_the_same_result(settings, workers, tmp_path):
    """SIGKILL the worker mid-run; a new worker resumes from the last checkpoint and
    ends exactly where an uninterrupted run with the same seed ends."""
    spec = {**FASHION, "train_subset": 8_000, "epochs": 6, "seed": 7, "loss": "center", "lam": 0.1}
    # No other worker must take this one: a queue and database of its own, a private worker.
    # Each epoch commits (COREL_EPOCH_COMMIT_SECONDS=0), so that the kill lands between epochs
    # 2 and 6: held for a second, epochs this short commit two or three at a time and the run
    # may end before the kill. (A run lost with epochs held: tests/worker/test_runner.py.)
    with own_stack(settings.model_copy(update={"epoch_commit_seconds": 0.0}), tmp_path / "var") as (own, client):
        mine = workers.start(own)
        eid = client.post("/experiments", json=spec).json()["id"]
        wait_for(client, eid, lambda b: b["current_epoch"] >= 2, workers=workers)
        workers.kill(mine)
        killed_at = client.get(f"/experiments/{eid}").json()
        assert killed_at["status"] == "running" and killed_at["current_epoch"] < 6
        second = workers.start(own)
        try:
            body = wait_for(client, eid, finished, workers=workers)
        finally:
            workers.kill(second)
        assert body["status"] == "succeeded", body
        assert body["attempts"] == 2

        metrics = client.get(f"/experiments/{eid}/metrics").json()["items"]
    assert [m["epoch"] for m in metrics] == [1, 2, 3, 4, 5, 6]  # none lost, none twice

    whole = fit(ExperimentSpec(**spec), data_dir=FASHION_DIR)
    assert [m["val_accuracy"] for m in metrics] == pytest.approx(
        [m.val_accuracy for m in whole.history], abs=0)
    assert [m["train_loss"] for m in metrics] == pytest.approx(
        [m.train_loss for m in whole.history], rel=1e-9)
    assert body["best_epoch"] == whole.best_epoch
    assert body["test_accuracy"] == pytest.approx(whole.test_accuracy, abs=0)
