"""GET /encoders: every declared encoder, and the API's spec check agrees with it."""

from __future__ import annotations

from tests.app.conftest import finished, wait_for


def test_a_text_upload_trains_on_frozen_minilm_and_serves_raw_sentences(client, worker, shared_datasets):
    """A text table trained through the service with a Cosine-COREL head over frozen
    all-MiniLM-L6-v2; /embed, /predict and /neighbors then take raw sentences."""
    import csv
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    names = ["World", "Sports", "Business", "Sci/Tech"]
    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:200]
    texts, labels = [f"{r[1]} {r[2]}" for r in rows], [names[int(r[0]) - 1] for r in rows]
    buf = io.BytesIO()
    pq.write_table(pa.table({"headline": texts, "topic": labels}), buf)
    r = client.post("/datasets", files={"file": ("news.parquet", buf.getvalue())})
    assert r.status_code == 201, r.text
    spec = {"dataset": "text", "dataset_id": r.json()["id"], "encoder": "minilm", "loss": "cosine",
            "lam": 0.85, "epochs": 15, "lr": 0.003, "batch_size": 32}
    r = client.post("/experiments", json=spec)
    assert r.status_code == 202, r.text
    assert client.get(f"/experiments/{r.json()['id']}").json()["spec"]["encoder_mode"] == "frozen"
    body = wait_for(client, r.json()["id"], finished, timeout=300)
    assert body["status"] == "succeeded", body
    assert body["test_accuracy"] > 0.5, body  # 4 classes: chance 0.25; GloVe's FFNN needs 800 rows
    eid = body["id"]
    sentences = ["Stocks fell as the central bank raised interest rates",
                 "The striker scored twice in the cup final"]
    embedded = client.post("/embed", json={"experiment_id": eid, "texts": sentences})
    assert embedded.status_code == 200, embedded.text
    assert len(embedded.json()["embeddings"][0]) == body["spec"]["hidden"]
    predicted = client.post("/predict", json={"experiment_id": eid, "texts": sentences}).json()
    assert [p["class_name"] for p in predicted["predictions"]] == ["Business", "Sports"], predicted
    near = client.post(f"/experiments/{eid}/neighbors", json={"texts": sentences, "k": 3})
    assert near.status_code == 200, near.text


def test_a_run_cancelled_while_its_features_are_computed_ends_within_seconds(client, worker, workers,
                                                                             shared_datasets):
    """Cancelled during its frozen encoder's features, a run ends `cancelled` within a few
    seconds, not after the last row (it took 195 s more over AG News's 7,600 texts)."""
    import csv
    import io
    import time

    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:4000]
    # Texts of this test's own, so that no other test's cached features are found for them.
    texts = [f"{r[1]} {r[2]} (cancelled during features)" for r in rows]
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts, "label": [r[0] for r in rows]}), buf)
    r = client.post("/datasets", files={"file": ("cancel-news.parquet", buf.getvalue())})
    assert r.status_code == 201, r.text
    spec = {"dataset": "text", "dataset_id": r.json()["id"], "encoder": "minilm", "precision": "fp32",
            "loss": "cosine", "epochs": 3}
    eid = client.post("/experiments", json=spec).json()["id"]
    seen = wait_for(client, eid, lambda b: b["phase"] == "computing features" or finished(b),
                    timeout=300, workers=workers)
    assert seen["phase"] == "computing features", seen
    assert client.post(f"/experiments/{eid}/cancel").status_code == 200
    asked = time.monotonic()
    body = wait_for(client, eid, finished, timeout=120, workers=workers)
    took = time.monotonic() - asked
    assert body["status"] == "cancelled", body
    assert took < 10, f"cancelled {took:.1f} s after it was asked"
    assert body["current_epoch"] == 0 and body["phase"] is None, body
    # It had nothing to serve: no epoch ended.
    assert client.post("/embed", json={"experiment_id": eid, "texts": ["a"]}).status_code == 409
