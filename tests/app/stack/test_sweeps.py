"""Sweeps over HTTP on PostgreSQL + Redis + a real worker.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_sweeps.py."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from harness.wait import wait_until
from tests.app.api.test_sweeps import BASE, wait_sweep
from tests.app.conftest import finished, wait_for


@pytest.fixture(scope="module")
def sweep(client, worker, workers):
    r = client.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cosine", "gaussian"],
                                                            "lam": [0.6, 0.8], "seed": [0, 1]}})
    assert r.status_code == 202, r.text
    queued = r.json()
    assert queued["size"] == 8
    # Same loss, different lambdas and seeds: 2 stacked groups of 4.
    assert queued["groups"] == 2
    body = wait_sweep(client, queued["id"], workers=workers)
    assert body["counts"]["succeeded"] == 8, (body, workers.logs())
    # The worker really trained the groups stacked (corel.train.stacked), not one by one.
    assert workers.logs(tail=None).count("training a stacked group") >= 2
    return body


def test_progress_counts(sweep):
    assert sweep["size"] == 8 and sweep["done"] == 8 and len(sweep["experiment_ids"]) == 8
    assert sum(sweep["counts"].values()) == 8


def test_members_have_full_metrics(client, sweep):
    for eid in sweep["experiment_ids"]:
        exp = client.get(f"/experiments/{eid}").json()
        assert exp["status"] == "succeeded" and exp["current_epoch"] == 2
        epochs = [m["epoch"] for m in client.get(f"/experiments/{eid}/metrics").json()["items"]]
        assert epochs == [1, 2]


def test_report_tables_are_consistent_with_the_members(client, sweep):
    rep = client.get(f"/sweeps/{sweep['id']}/report").json()
    members = [client.get(f"/experiments/{eid}").json() for eid in sweep["experiment_ids"]]
    assert set(rep["lambda_tuning"]) == {"cosine", "gaussian"}
    for loss, tuning in rep["lambda_tuning"].items():
        assert [r["lam"] for r in tuning["by_lambda"]] == [0.6, 0.8]
        for row in tuning["by_lambda"]:
            vals = [m["best_val_accuracy"] for m in members
                    if m["spec"]["loss"] == loss and m["spec"]["lam"] == row["lam"]]
            assert row["n"] == 2 and row["mean_val"] == pytest.approx(np.mean(vals))
            assert row["std_val"] == pytest.approx(np.std(vals, ddof=1))
        best = max(tuning["by_lambda"], key=lambda r: r["mean_val"])
        assert tuning["tuned_lambda"] == best["lam"]

    table = rep["test_accuracy"]
    by_loss = {}
    for row in table["rows"]:
        tests = {m["spec"]["seed"]: m["test_accuracy"] for m in members
                 if m["spec"]["loss"] == row["loss"] and m["spec"]["lam"] == row["lam"]}
        by_loss[row["loss"]] = tests
        assert row["mean"] == pytest.approx(np.mean(list(tests.values())))
        assert row["std"] == pytest.approx(np.std(list(tests.values()), ddof=1))
    c = table["comparison"]
    a = [by_loss[c["best"]][s] for s in c["paired_seeds"]]
    b = [by_loss[c["runner_up"]][s] for s in c["paired_seeds"]]
    if c["p"] is not None:
        assert c["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert c["significance"] in ("p < 0.001", "p < 0.05", "n.s.", "n/a")

    algorithms = {(r["loss"], r["algorithm"]) for r in rep["clustering"]}
    assert algorithms == {(loss, algo) for loss in ("cosine", "gaussian") for algo in ("kmeans", "gmm")}
    for r in rep["clustering"]:
        assert 0 <= r["accuracy"] <= 1 and -1 <= r["ari"] <= 1 and r["n"] == 2

    # MAP@R as Table 1 has accuracy: each member's own /retrieval, mean +- std over seeds.
    for row in rep["retrieval"]["rows"]:
        maps = {m["spec"]["seed"]: client.get(f"/experiments/{m['id']}/retrieval").json()[
            "mean_average_precision_at_r"] for m in members
            if m["spec"]["loss"] == row["loss"] and m["spec"]["lam"] == row["lam"]}
        assert row["n"] == 2 and row["mean"] == pytest.approx(np.mean(list(maps.values())))
        assert row["std"] == pytest.approx(np.std(list(maps.values()), ddof=1))
    assert {r["loss"] for r in rep["retrieval"]["rows"]} == {"cosine", "gaussian"}
    assert rep["retrieval"]["comparison"]["significance"] in ("p < 0.001", "p < 0.05", "n.s.", "n/a")


def test_report_formats_and_picture(client, sweep):
    text = client.get(f"/sweeps/{sweep['id']}/report", params={"format": "csv"}).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["table"] for r in rows} >= {"lambda_tuning", "test_accuracy", "t_test", "clustering",
                                          "map_at_r", "map_at_r_t_test"}
    md = client.get(f"/sweeps/{sweep['id']}/report", params={"format": "markdown"})
    assert md.headers["content-type"].startswith("text/markdown")
    assert "Lambda tuning" in md.text and "| Gaussian-COREL |" in md.text
    assert "### Retrieval: MAP@R" in md.text
    png = client.get(f"/sweeps/{sweep['id']}/lambda.png")
    assert png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).size == (800, 500)
    assert client.get(f"/sweeps/{sweep['id']}/report", params={"format": "xml"}).status_code == 422


def test_cancel_stops_a_running_stacked_group(client, worker, workers):
    base = {"dataset": "fashion-mnist", "model": "ffnn", "epochs": 100, "lr": 1e-3}
    r = client.post("/sweeps", json={"base": base, "grid": {"lam": [0.3, 0.9]}})
    assert r.status_code == 202 and r.json()["groups"] == 1
    sid = r.json()["id"]
    wait_until(lambda: all(client.get(f"/experiments/{i}").json()["current_epoch"] >= 1
                           for i in client.get(f"/sweeps/{sid}").json()["experiment_ids"]),
               120, f"every member of sweep {sid} to train an epoch", interval=0.3)
    body = client.post(f"/sweeps/{sid}/cancel").json()
    assert body["counts"]["running"] + body["counts"]["cancelled"] == 2
    body = wait_sweep(client, sid, timeout=60, workers=workers)
    assert body["counts"]["cancelled"] == 2 and body["counts"]["succeeded"] == 0
    for eid in body["experiment_ids"]:
        exp = client.get(f"/experiments/{eid}").json()
        assert exp["current_epoch"] < 100
        n = len(client.get(f"/experiments/{eid}/metrics").json()["items"])
        assert n == exp["current_epoch"]


def test_a_member_cancelled_alone_leaves_at_an_epoch_end_and_serves_its_best(client, worker, workers):
    """One member of a running stacked group cancelled: it leaves at the next epoch's end
    (the others go on) and serves the best checkpoint it had; it kept none before."""
    base = {"dataset": "fashion-mnist", "model": "ffnn", "epochs": 100, "lr": 1e-3, "train_subset": 3000}
    # Both lambdas learn: at 0.3 Gaussian-COREL diverges, and the guard may fail that member
    # before the cancel, once a second's epochs commit together.
    sid = client.post("/sweeps", json={"base": base, "grid": {"lam": [0.6, 0.9]}}).json()["id"]
    first, second = client.get(f"/sweeps/{sid}").json()["experiment_ids"]
    wait_until(lambda: client.get(f"/experiments/{first}").json()["current_epoch"] >= 1, 120,
               f"sweep {sid} to train an epoch", interval=0.3)
    assert client.post(f"/experiments/{first}/cancel").status_code == 200
    body = wait_for(client, first, finished, timeout=60, workers=workers)
    assert body["status"] == "cancelled" and body["best_epoch"] >= 1, body
    assert client.get(f"/experiments/{second}").json()["status"] == "running"
    image = np.zeros((1, 28, 28), dtype=np.uint8).tolist()
    r = client.post("/predict", json={"experiment_id": first, "arrays": image})
    assert r.status_code == 200, r.text
    assert r.json()["checkpoint"]["epoch"] == body["best_epoch"]
    client.post(f"/sweeps/{sid}/cancel")
    wait_sweep(client, sid, timeout=60, workers=workers)


def test_a_grid_over_a_peer_loss_option_reports_one_row_per_value(client, worker, workers):
    """ArcFace over two scales and two seeds: one stacked group (each member its own scale, as
    lambda; issue 70), and the report's tables name each scale, as they name each lambda."""
    r = client.post("/sweeps", json={"base": {**BASE, "loss": "arcface"},
                                     "grid": {"scale": [8.0, 32.0], "seed": [0, 1]}})
    assert r.status_code == 202 and r.json()["size"] == 4 and r.json()["groups"] == 1, r.text
    sid = r.json()["id"]
    wait_sweep(client, sid, workers=workers)
    rep = client.get(f"/sweeps/{sid}/report", params={"clustering": "false"}).json()
    assert set(rep["lambda_tuning"]) == {"arcface (scale=8)", "arcface (scale=32)"}
    rows = {row["loss"]: row for row in rep["test_accuracy"]["rows"]}
    assert set(rows) == set(rep["lambda_tuning"]) and all(row["n"] == 2 for row in rows.values())
    md = client.get(f"/sweeps/{sid}/report", params={"format": "markdown", "clustering": "false"}).text
    assert "| arcface (scale=8) |" in md


def test_a_pruned_sweep_drops_its_losers_inside_the_stack(client, worker, workers):
    """prune: at each rung the stacked group keeps the best third; the others end 'pruned'
    with their rung, reason and history up to it, and serve their best checkpoint."""
    base = {**BASE, "loss": "cosine", "epochs": 4}
    lams = [0.1, 0.3, 0.5, 0.7, 0.85, 0.95]
    r = client.post("/sweeps", json={"base": base, "grid": {"lam": lams},
                                     "prune": {"metric": "val_accuracy", "eta": 3, "min_epochs": 1}})
    assert r.status_code == 202 and r.json()["groups"] == 1, r.text
    sid = r.json()["id"]
    body = wait_sweep(client, sid, workers=workers)
    assert body["prune"] == {"metric": ["val_accuracy"], "eta": 3, "min_epochs": 1}
    # Rungs at epochs 1 and 3: 6 -> 2 -> 1.
    assert body["counts"]["pruned"] == 5 and body["counts"]["succeeded"] == 1, body["counts"]
    members = [client.get(f"/experiments/{i}").json() for i in body["experiment_ids"]]
    rungs = sorted(m["pruned"]["rung"] for m in members if m["status"] == "pruned")
    assert rungs == [1, 1, 1, 1, 3], rungs
    for m in members:
        epochs = client.get(f"/experiments/{m['id']}/metrics").json()["items"]
        if m["status"] == "pruned":
            assert len(epochs) == m["pruned"]["rung"] and "1/3" in m["pruned"]["reason"], m
            r = client.post("/predict", json={"experiment_id": m["id"], "arrays": [[[0.0] * 8] * 8]})
            assert r.status_code == 200 and r.json()["checkpoint"]["epoch"] == m["best_epoch"], r.text
            # /neighbors says why it cannot serve it (it said "trained before ... train it again").
            r = client.post(f"/experiments/{m['id']}/neighbors", json={"arrays": [[[0.0] * 8] * 8]})
            assert r.status_code == 409, r.text
            assert (f"experiment {m['id']} was pruned by its sweep" in r.json()["detail"]
                    and "/embed and /predict serve its best checkpoint" in r.json()["detail"]), r.text
        else:
            assert len(epochs) == 4 and m["status"] == "succeeded"
    # The survivor was the best at the first rung among the six.
    first = {m["id"]: client.get(f"/experiments/{m['id']}/metrics").json()["items"][0]["val_accuracy"]
             for m in members}
    survivor = next(m["id"] for m in members if m["status"] == "succeeded")
    assert first[survivor] == max(first.values())
    # The report lists the rungs and each pruned member with its rung and why.
    rep = client.get(f"/sweeps/{sid}/report", params={"clustering": "false"}).json()
    assert rep["pruning"]["rungs"] == [{"epoch": 1, "members": 6, "kept": 2},
                                       {"epoch": 3, "members": 2, "kept": 1}], rep["pruning"]
    assert sorted(p["experiment_id"] for p in rep["pruning"]["pruned"]) == sorted(
        m["id"] for m in members if m["status"] == "pruned")
    md = client.get(f"/sweeps/{sid}/report", params={"format": "markdown", "clustering": "false"}).text
    assert "### Pruned (successive halving on val_accuracy, eta 3, first rung epoch 1)" in md
    assert "| 1 | 6 | 2 |" in md and "| 3 | 2 | 1 |" in md
