"""Sweeps over HTTP on PostgreSQL + Redis + a real worker.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_sweeps.py."""

from __future__ import annotations

import pytest

from harness.wait import wait_until
from tests.app.api.test_sweeps import wait_sweep
from tests.app.conftest import own_stack


def test_a_pruned_sweep_resumed_after_a_lost_worker_keeps_the_same_survivors(settings, workers, tmp_path):
    """SIGKILL the worker once a rung's decisions are recorded: a new worker resumes the
    survivors alone, and the sweep ends as the library's uninterrupted pruned group ends
    (the same members pruned at the same rungs, the survivors' epochs unchanged)."""
    from corel.spec import ExperimentSpec
    from corel.train import fit_group
    from tests.conftest import FASHION_DIR

    base = {"dataset": "fashion-mnist", "model": "ffnn", "epochs": 20, "lr": 1e-3, "train_subset": 3000,
            "loss": "cosine"}
    prune = {"metric": "val_accuracy", "eta": 3, "min_epochs": 2}
    # A queue of its own: no other worker may take the group.
    with own_stack(settings, tmp_path / "var") as (own, client):
        mine = workers.start(own)
        sid = client.post("/sweeps", json={"base": base, "grid": {"lam": [0.1, 0.3, 0.5, 0.7, 0.85, 0.95]},
                                           "prune": prune}).json()["id"]
        wait_until(lambda: client.get(f"/sweeps/{sid}").json()["counts"]["pruned"] >= 4, 180,
                   f"sweep {sid}'s first rung", interval=0.1)
        workers.kill(mine)
        at_kill = client.get(f"/sweeps/{sid}").json()
        assert at_kill["counts"]["succeeded"] == 0 and at_kill["counts"]["running"] >= 1, at_kill
        second = workers.start(own)
        try:
            body = wait_sweep(client, sid, workers=workers)
        finally:
            workers.kill(second)
        members = [client.get(f"/experiments/{i}").json() for i in body["experiment_ids"]]
        whole = fit_group([ExperimentSpec(**m["spec"]) for m in members], data_dir=FASHION_DIR, prune=prune)
        for m, r in zip(members, whole, strict=True):
            if r.pruned is None:
                assert m["status"] == "succeeded", m
                epochs = client.get(f"/experiments/{m['id']}/metrics").json()["items"]
                assert [e["epoch"] for e in epochs] == list(range(1, 21))  # none lost, none twice
                # float32 over ~1,000 steps, in the worker's threads and this process's: kernels
                # may round apart (another CPU), so a validation row or two, not bit for bit.
                assert [e["val_accuracy"] for e in epochs] == pytest.approx(
                    [h.val_accuracy for h in r.history], abs=0.005)
            else:
                assert m["status"] == "pruned" and m["pruned"]["rung"] == r.pruned["rung"], (m, r.pruned)
