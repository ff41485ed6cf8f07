"""What the dashboard reads besides the experiment rows: the latent scatter as data, the
downloads (test latent space, best checkpoint), the sweep list and a sweep's members.
Against PostgreSQL, Redis and a real worker; each answer is checked against the rows the
worker stored."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from corel.train import checkpoint_from_bytes, model_from_checkpoint
from tests.app.conftest import finished, stored_checkpoint, stored_latent, wait_for

SPEC = {"dataset": "digits", "model": "ffnn", "lr": 0.003, "batch_size": 64, "epochs": 3}


@pytest.fixture(scope="module")
def runs(client, worker) -> dict[str, dict]:
    ids = {loss: client.post("/experiments", json={**SPEC, "loss": loss, "lam": 0.8}).json()["id"]
           for loss in ("cosine", "gaussian")}
    out = {loss: wait_for(client, i, finished) for loss, i in ids.items()}
    assert all(r["status"] == "succeeded" for r in out.values()), out
    return out


@pytest.fixture(scope="module")
def stored(settings, runs) -> dict[str, tuple[np.ndarray, np.ndarray, bytes]]:
    engine = create_engine(settings.db_url)
    out = {}
    with Session(engine) as s:
        for loss, run in runs.items():
            blob = stored_checkpoint(settings, s, run["id"])
            out[loss] = (*stored_latent(settings, run["id"], "test"), blob)
    engine.dispose()
    return out


@pytest.mark.parametrize("loss", ["cosine", "gaussian"])
def test_the_scatter_transform_takes_a_stored_row_to_its_point(client, runs, stored, loss):
    reps, labels, _ = stored[loss]
    body = client.get(f"/experiments/{runs[loss]['id']}/latent/scatter",
                      params={"max_points": len(reps)}).json()
    assert body["n_total"] == len(reps) and len(body["points"]) == len(reps)
    assert body["labels"] == labels.tolist()
    t = body["transform"]
    x = reps.astype(np.float64)
    if t["normalize"]:
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    projected = (x - np.asarray(t["mean"])) @ np.asarray(t["components"]).T
    np.testing.assert_allclose(projected, body["points"], atol=1e-4)
    assert len(body["class_vectors"]) == len(body["class_names"]) == 10
    # Fewer points asked for: a subset of the same points.
    few = client.get(f"/experiments/{runs[loss]['id']}/latent/scatter", params={"max_points": 50}).json()
    assert len(few["points"]) == 50
    assert {tuple(p) for p in few["points"]} <= {tuple(p) for p in body["points"]}


@pytest.mark.parametrize("fmt", ["npy", "csv", "parquet"])
def test_the_latent_download_holds_the_stored_rows(client, runs, stored, fmt):
    reps, labels, _ = stored["gaussian"]
    r = client.get(f"/experiments/{runs['gaussian']['id']}/latent", params={"format": fmt})
    assert r.status_code == 200, r.text
    assert f".{fmt}" in r.headers["content-disposition"]
    if fmt == "npy":
        table = np.load(io.BytesIO(r.content), allow_pickle=False)
        got_h, got_y = table["h"], table["label"]
    elif fmt == "csv":
        rows = np.loadtxt(io.StringIO(r.text), delimiter=",", skiprows=1)
        got_y, got_h = rows[:, 0].astype(np.int64), rows[:, 2:]
        assert r.text.splitlines()[0].startswith("label,class_name,h0,h1,")
        np.testing.assert_array_equal(rows[:, 1], labels)  # digits' class names are "0".."9"
    else:
        table = pq.read_table(io.BytesIO(r.content))
        got_y = table.column("label").to_numpy()
        assert table.column("class_name").to_pylist() == [str(k) for k in labels]
        got_h = np.column_stack([table.column(f"h{i}").to_numpy() for i in range(reps.shape[1])])
    np.testing.assert_array_equal(got_y, labels)
    # npy and parquet keep float32 exactly; csv writes 9 significant digits, enough for float32.
    np.testing.assert_array_equal(np.asarray(got_h, np.float32), reps)


def test_the_checkpoint_download_rebuilds_the_served_model(client, runs, stored):
    run = runs["gaussian"]
    r = client.get(f"/experiments/{run['id']}/checkpoint")
    assert r.status_code == 200
    assert r.content == stored["gaussian"][2]
    assert r.headers["x-checkpoint-sha256"] == hashlib.sha256(r.content).hexdigest()
    spec, model = model_from_checkpoint(checkpoint_from_bytes(r.content))
    assert spec.loss == "gaussian" and spec.epochs == SPEC["epochs"]
    assert model.head.W.shape[0] == 10 and not model.training


def test_downloads_of_an_unfinished_or_unknown_run_are_refused(client, worker):
    queued = client.post("/experiments", json={**SPEC, "epochs": 200}).json()["id"]
    try:
        for path in (f"/experiments/{queued}/latent", f"/experiments/{queued}/checkpoint",
                     f"/experiments/{queued}/latent/scatter"):
            r = client.get(path)
            assert r.status_code == 409 and "needs a succeeded experiment" in r.json()["detail"], r.text
    finally:
        client.post(f"/experiments/{queued}/cancel")
    assert client.get("/experiments/2000000000/latent").status_code == 404
    r = client.get(f"/experiments/{queued}/latent", params={"format": "xlsx"})
    assert r.status_code == 422, r.text
    assert "format: Input should be 'npy', 'csv' or 'parquet'; got 'xlsx'" in r.json()["detail"]


def test_sweeps_are_listed_newest_first_with_their_members(client, worker):
    body = {"base": {**SPEC, "epochs": 1}, "grid": {"loss": ["cce", "cosine"], "seed": [0, 1]}}
    first = client.post("/sweeps", json=body).json()["id"]
    second = client.post("/sweeps", json=body).json()["id"]
    page = client.get("/sweeps", params={"limit": 2}).json()
    assert [s["id"] for s in page["items"]] == [second, first] and page["total"] >= 2
    members = client.get("/experiments", params={"sweep_id": first, "limit": 200}).json()
    assert members["total"] == 4
    assert sorted(e["id"] for e in members["items"]) == client.get(f"/sweeps/{first}").json()["experiment_ids"]
    for sweep_id in (first, second):
        progress = client.get(f"/sweeps/{sweep_id}").json()
        for exp_id in progress["experiment_ids"]:
            wait_for(client, exp_id, finished)
    page = client.get("/sweeps", params={"limit": 2}).json()
    assert all(s["finished"] and s["counts"]["succeeded"] == 4 for s in page["items"])
    # A limit past the server's page size gives a page of that size, and says so.
    big = client.get("/sweeps", params={"limit": 500})
    assert big.status_code == 200 and big.json()["limit"] == 200
