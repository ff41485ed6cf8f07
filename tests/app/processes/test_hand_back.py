"""A worker told to stop (SIGTERM: a warm shutdown, as compose, systemd or Kubernetes stop
one) hands its run back at the next epoch's end, queued again from its checkpoint, and a
worker started after it takes the run at once: it trained on for about 30 s, and the run
then sat `running` until its lease ran out (37 s) before another worker took it over."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from harness.wait import wait_until
from tests.app.conftest import Workers, finished, own_database, wait_for

# A stack of its own (its own database and queue, its own workers): no other worker may
# take the run meanwhile.
pytestmark = pytest.mark.no_user

SPEC = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "cosine", "lam": 0.8, "lr": 1e-3,
        "train_subset": 6000, "epochs": 10, "batch_size": 64}


def test_a_stopping_worker_hands_its_run_back_and_the_next_one_takes_it_at_once(settings, fashion_dir, tmp_path):
    (tmp_path / "var").mkdir()
    with own_database(settings, tmp_path / "var") as base:
        # A lease far longer than the test: only a hand-back lets the next worker in quickly.
        # Each epoch commits (COREL_EPOCH_COMMIT_SECONDS=0): the stop lands between epochs 2 and
        # 10, where epochs held a second each may all be trained before it (a hand-back with
        # epochs held: tests/worker/test_runner.py).
        own = base.model_copy(update={"lease_seconds": 120.0, "requeue_after_seconds": 120.0,
                                      "requeue_max_seconds": 240.0, "heartbeat_seconds": 1.0,
                                      "epoch_commit_seconds": 0.0})
        pool = Workers(own, tmp_path)
        try:
            first = pool.start(own)
            with TestClient(create_app(own)) as client:
                eid = client.post("/experiments", json=SPEC).json()["id"]
                wait_for(client, eid, lambda b: b["current_epoch"] >= 2 or finished(b), workers=pool)
                asked = time.monotonic()
                pool.stop(first)  # SIGTERM, then the worker's own warm shutdown
                stopped = time.monotonic() - asked
                back = client.get(f"/experiments/{eid}").json()
                assert back["status"] == "queued", back  # it was left `running`, its lease held
                assert 2 <= back["current_epoch"] < SPEC["epochs"], back
                assert stopped < 20, f"the worker took {stopped:.1f} s to stop"
                assert "handed back: this worker is stopping" in pool.logs()
                pool.start(own)
                ready = time.monotonic()
                wait_until(lambda: client.get(f"/experiments/{eid}").json()["status"] != "queued", 30,
                           "the next worker to take the run", detail=pool.logs)
                taken = time.monotonic() - ready
                assert taken < 15, f"taken {taken:.1f} s after the next worker was ready"  # not the 120 s lease
                body = wait_for(client, eid, finished, timeout=300, workers=pool)
                assert body["status"] == "succeeded" and body["attempts"] == 2, body
                epochs = [m["epoch"] for m in client.get(f"/experiments/{eid}/metrics").json()["items"]]
                assert epochs == list(range(1, SPEC["epochs"] + 1)), epochs  # none lost, none twice
        finally:
            pool.stop_all()
