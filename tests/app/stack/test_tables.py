"""Users' own tables through POST /datasets: a CSV feature table (standardised) and a Parquet text
table with string labels, each trained by a real worker and then served by /embed and /predict;
and bad variants of each, refused with a 422 naming the problem.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_tables.py."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from corel.train import checkpoint_from_bytes, model_from_checkpoint
from tests.app.api import test_tables as shared
from tests.app.api.test_tables import FAST, _csv, _latent_rows, _upload
from tests.app.conftest import finished, wait_for
from tests.conftest import assert_rows_close

# Fixtures shared with the tests in tests/app/api/test_tables.py (pytest finds a fixture by its name here).
digits_table, news = shared.digits_table, shared.news


def test_a_feature_table_trains_standardised_and_serves_raw_rows(client, worker, digits_table):
    x, y, data = digits_table
    r = _upload(client, "features.csv", data, label_column="digit", standardize=True)
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["kind"] == "npz" and ds["summary"]["num_features"] == 64
    # The user's file, not the .npz it is stored as: they check it against what they sent.
    assert ds["size"] == len(data) and ds["sha256"] == hashlib.sha256(data).hexdigest()
    assert ds["summary"]["class_names"] == [f"digit {d}" for d in range(10)]
    eid = client.post("/experiments", json={"dataset": "npz", "dataset_id": ds["id"], **FAST}).json()["id"]
    body = wait_for(client, eid, finished)
    assert body["status"] == "succeeded" and body["test_accuracy"] > 0.8, body
    ckpt = checkpoint_from_bytes(client.get(f"/experiments/{eid}/checkpoint").content)
    scale = json.loads(ckpt["preprocessing"])["standardize"]
    # The statistics of the training split, not of the whole table.
    assert not np.allclose(scale["mean"], x.mean(axis=0), atol=1e-6)
    assert np.allclose(scale["mean"], x.mean(axis=0), atol=1.0)
    served = client.post("/embed", json={"experiment_id": eid, "arrays": x[:20].tolist()}).json()
    _, model = model_from_checkpoint(ckpt)
    standardised = (x[:20] - np.asarray(scale["mean"])) / np.asarray(scale["std"])
    with torch.no_grad():
        ours = model.encoder(torch.from_numpy(standardised.astype(np.float32))).numpy()
    assert_rows_close(served["embeddings"], ours)
    predicted = client.post("/predict", json={"experiment_id": eid, "arrays": x[:50].tolist()}).json()
    hits = sum(p["class_name"] == f"digit {t}" for p, t in zip(predicted["predictions"], y[:50], strict=True))
    assert hits >= 40, hits

    # The same rows as a CSV by column name (shuffled columns, the label column kept: it
    # is ignored), in two files: the answers name each file and row, and agree with arrays.
    header = [f"px{i}" for i in range(64)]
    order = [*reversed(header), "digit"]
    first = _csv([[*(float(x[i, 63 - j]) for j in range(64)), "?"] for i in range(12)], order)
    second = _csv([[float(v) for v in x[i]] for i in range(12, 20)], header)
    files = [("files", ("first.csv", first, "text/csv")), ("files", ("second.csv", second, "text/csv"))]
    by_csv = client.post("/embed", data={"experiment_id": str(eid)}, files=files).json()
    assert by_csv["inputs"] == [f"first.csv, row {k}" for k in range(1, 13)] + \
        [f"second.csv, row {k}" for k in range(1, 9)]
    assert_rows_close(by_csv["embeddings"], ours)
    told = client.post("/predict", data={"experiment_id": str(eid)}, files=files).json()
    assert [p["input"] for p in told["predictions"]] == by_csv["inputs"]
    assert [p["class_name"] for p in told["predictions"]] == \
        [p["class_name"] for p in predicted["predictions"][:20]]
    # A CSV as a spreadsheet in many locales saves it, with semicolons: the same rows.
    semi = _csv([[float(v) for v in x[i]] for i in range(12, 20)], header, delimiter=";")
    r = client.post("/embed", data={"experiment_id": str(eid)}, files=[("files", ("semi.csv", semi))])
    assert r.status_code == 200, r.text
    assert_rows_close(r.json()["embeddings"], ours[12:20])
    # An export says what it was trained on in the user's terms, and no server path.
    onnx_file = client.get(f"/experiments/{eid}/export", params={"format": "onnx"}).content
    meta = json.loads(ort.InferenceSession(onnx_file).get_modelmeta().custom_metadata_map["corel"])
    assert meta["trained_on"] == {"dataset": "upload", "dataset_id": ds["id"], "format": "npz",
                                  "filename": "features.csv"}
    assert "dataset_path" not in meta["spec"]
    assert meta["preprocessing"]["feature_names"] == header

    # The latent space's CSV says each row's class in the user's words.
    latent = client.get(f"/experiments/{eid}/latent", params={"format": "csv"}).text.splitlines()
    assert latent[0].startswith("label,class_name,h0,")
    cells = [line.split(",")[:2] for line in latent[1:]]
    assert cells and all(name == f"digit {label}" for label, name in cells)

    # JSON takes the same rows by name; a missing or non-numeric column is named.
    rows = [dict(zip(header, map(float, x[i]), strict=True)) for i in range(3)]
    r = client.post("/embed", json={"experiment_id": eid, "rows": rows})
    assert r.status_code == 200 and "inputs" not in r.json()
    assert_rows_close(r.json()["embeddings"], ours[:3])
    del rows[1]["px7"]
    r = client.post("/embed", json={"experiment_id": eid, "rows": rows})
    assert r.status_code == 422 and "input 1: no value for feature column(s) 'px7'" in r.json()["detail"]
    bad = _csv([[*(float(v) for v in x[0][:63]), "n/a"]], header)
    r = client.post("/predict", data={"experiment_id": str(eid)}, files=[("files", ("bad.csv", bad))])
    assert r.status_code == 422 and "input 0, column 'px63': 'n/a' is not a number" in r.json()["detail"]


def test_a_parquet_text_table_with_string_labels_trains_and_predicts(client, worker, news):
    texts, labels = news
    buf = io.BytesIO()
    pq.write_table(pa.table({"headline": texts, "topic": labels}), buf)
    r = _upload(client, "news.parquet", buf.getvalue())  # kind and columns guessed
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["kind"] == "text" and ds["summary"]["text_column"] == "headline"
    assert ds["summary"]["class_names"] == sorted(set(labels))
    eid = client.post("/experiments", json={"dataset": "text", "dataset_id": ds["id"],
                                            **FAST, "epochs": 8}).json()["id"]
    body = wait_for(client, eid, finished)
    assert body["status"] == "succeeded", body
    assert body["test_accuracy"] > 0.5, body  # 4 classes: chance is 0.25
    predicted = client.post("/predict", json={
        "experiment_id": eid, "texts": ["Stocks fell as the central bank raised interest rates",
                                        "The striker scored twice in the cup final"]}).json()
    assert predicted["class_names"] == sorted(set(labels))
    assert {p["class_name"] for p in predicted["predictions"]} <= set(labels)
    # A text model takes texts, not arrays.
    r = client.post("/embed", json={"experiment_id": eid, "arrays": [[1.0, 2.0]]})
    assert r.status_code == 422 and "send texts" in r.json()["detail"]
    # /neighbors names each neighbour by its row of the upload, and gives its text: the
    # upload's own text at that row, of that row's class (it answered row numbers alone).
    asked = [texts[0], "The striker scored twice in the cup final"]
    r = client.post(f"/experiments/{eid}/neighbors", json={"texts": asked, "k": 5})
    assert r.status_code == 200, r.text
    assert r.json()["source"] == {"dataset_id": ds["id"]}
    for result in r.json()["results"]:
        for n in result["neighbors"]:
            assert isinstance(n["id"], int) and n["text"] == texts[n["id"]], n
            assert n["class_name"] == labels[n["id"]] and "image_url" not in n


def test_a_split_column_decides_the_test_set(client, worker):
    rng = np.random.default_rng(1)
    rows, parts = [], []
    for i in range(120):
        label = i % 3
        part = "test" if i % 10 == 0 else "validation" if i % 10 == 1 else "train"
        rows.append([*(rng.normal(label, 0.3, 4)), f"c{label}", part])
        parts.append(part)
    r = _upload(client, "split.csv", _csv(rows, ["a", "b", "c", "d", "label", "part"]),
                split_column="part")
    assert r.status_code == 201, r.text
    summary = r.json()["summary"]
    assert summary["split_counts"] == {"train": 96, "validation": 12, "test": 12}
    assert summary["num_features"] == 4  # the split column is not a feature
    eid = client.post("/experiments", json={"dataset": "npz", "dataset_id": r.json()["id"], **FAST}).json()["id"]
    assert wait_for(client, eid, finished)["status"] == "succeeded"
    assert _latent_rows(client, eid) == parts.count("test")
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": r.json()["id"], "test_fraction": 0.3})
    assert r.status_code == 422 and "names its own splits" in r.json()["detail"]
    bad = [[*row[:5], "holdout" if i == 7 else row[5]] for i, row in enumerate(rows)]
    r = _upload(client, "bad-split.csv", _csv(bad, ["a", "b", "c", "d", "label", "part"]), split_column="part")
    assert r.status_code == 422 and "column 'part', row 8: 'holdout' is not a split" in r.json()["detail"]


def test_fractions_set_the_sizes_of_a_random_split(client, worker, digits_table):
    _, _, data = digits_table
    ds = _upload(client, "features.csv", data, label_column="digit").json()["id"]
    eid = client.post("/experiments", json={"dataset": "npz", "dataset_id": ds, "val_fraction": 0.1,
                                            "test_fraction": 0.3, **FAST}).json()["id"]
    assert wait_for(client, eid, finished)["status"] == "succeeded"
    assert _latent_rows(client, eid) == round(0.3 * 600)
    for body, words in (({"dataset": "mnist", "val_fraction": 0.2}, "apply to uploaded datasets"),
                        ({"dataset": "npz", "dataset_id": ds, "val_fraction": 0.5, "test_fraction": 0.45},
                         "val_fraction: Input should be less than or equal to 0.45")):
        r = client.post("/experiments", json=body)
        assert r.status_code == 422 and words in r.json()["detail"], r.text
