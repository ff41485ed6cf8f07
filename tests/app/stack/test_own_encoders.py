"""POST /encoders: a user's own encoder (a zipped sentence-transformers folder, or timm weights),
checked before it is accepted, stored once per content, named by encoder_id in a spec, trained
on by a real worker and served; every bad upload a clear 4xx that stores nothing.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_own_encoders.py."""

from __future__ import annotations

import io
import zipfile

import numpy as np

from tests.app.api import test_own_encoders as shared
from tests.app.api.test_own_encoders import _counts, _text_table
from tests.app.conftest import finished, wait_for
from tests.encoder_files import timm_weights

# Fixtures shared with the tests in tests/app/api/test_own_encoders.py (pytest finds a fixture by its name here).
st_zip = shared.st_zip


def test_a_zipped_sentence_transformer_is_stored_once_trained_on_and_served(client, worker, settings,
                                                                            st_zip, tmp_path):
    from sentence_transformers import SentenceTransformer

    rows, blobs = _counts(settings)
    r = client.post("/encoders", files={"file": ("my-model.zip", st_zip)}, data={"name": "my model"})
    assert r.status_code == 201, r.text
    first = r.json()
    assert (first["kind"], first["modality"], first["features"], first["spec_name"]) == \
        ("sentence-transformers", "text", 32, "sentence-transformers")
    assert first["summary"]["modules"][-1] == "Pooling"
    again = client.post("/encoders", files={"file": ("copy.zip", st_zip)}).json()
    assert again["id"] != first["id"] and again["sha256"] == first["sha256"]
    assert _counts(settings) == (rows + 2, blobs + 1)  # the files once, however many uploads
    listed = client.get("/encoders/uploads").json()
    assert {first["id"], again["id"]} <= {e["id"] for e in listed["items"]}

    dataset_id = _text_table(client)
    spec = {"dataset": "text", "dataset_id": dataset_id, "encoder_id": first["id"], "loss": "cosine",
            "lam": 0.85, "epochs": 10, "lr": 0.01, "batch_size": 8, "hidden": 16}
    r = client.post("/experiments", json=spec)
    assert r.status_code == 202, r.text
    stored = client.get(f"/experiments/{r.json()['id']}").json()["spec"]
    assert stored["encoder"] == "sentence-transformers" and stored["encoder_id"] == first["id"]
    assert "encoder_path" not in stored or stored["encoder_path"] is None
    body = wait_for(client, r.json()["id"], finished, timeout=180)
    assert body["status"] == "succeeded", body.get("error")
    sentences = ["the goalkeeper saved a penalty", "bond yields rose again"]
    got = client.post("/embed", json={"experiment_id": body["id"], "texts": sentences})
    assert got.status_code == 200, got.text
    assert np.array(got.json()["embeddings"]).shape == (2, 16)
    # The served features are the uploaded model's own (sentence-transformers on the files).
    folder = tmp_path / "unzipped"
    zipfile.ZipFile(io.BytesIO(st_zip)).extractall(folder)
    reference = SentenceTransformer(str(folder / "my-model"), device="cpu", local_files_only=True)
    assert reference.get_embedding_dimension() == 32
    predicted = client.post("/predict", json={"experiment_id": body["id"], "texts": sentences})
    assert predicted.status_code == 200, predicted.text
    # Fine-tuned through the service: the uploaded encoder trains with the head.
    r = client.post("/experiments", json={**spec, "encoder_mode": "finetune", "trainable_blocks": 1,
                                          "encoder_lr": 0.001, "epochs": 3})
    assert r.status_code == 202, r.text
    tuned = wait_for(client, r.json()["id"], finished, timeout=180)
    assert tuned["status"] == "succeeded", tuned.get("error")
    both = [client.post("/embed", json={"experiment_id": tuned["id"], "texts": sentences, "layer": layer})
            for layer in ("head", "encoder")]
    assert [np.array(b.json()["embeddings"]).shape for b in both] == [(2, 16), (2, 32)], both[0].text
    tuned_export = client.get(f"/experiments/{tuned['id']}/export", params={"format": "onnx"})
    assert tuned_export.status_code == 200, tuned_export.text
    zipfile.ZipFile(io.BytesIO(tuned_export.content)).extractall(tmp_path / "tuned")
    # The export holds the uploaded encoder too: a zip with its tokenizer, run under onnxruntime.
    import onnxruntime as ort
    from transformers import AutoTokenizer

    exported = client.get(f"/experiments/{body['id']}/export", params={"format": "onnx"})
    assert exported.status_code == 200, exported.text
    zipfile.ZipFile(io.BytesIO(exported.content)).extractall(tmp_path / "export")
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "export" / "tokenizer"), local_files_only=True)
    batch = tokenizer(sentences, padding=True, truncation=True, return_tensors="np")
    session = ort.InferenceSession(str(tmp_path / "export" / "model.onnx"))
    names = {i.name for i in session.get_inputs()}
    out = session.run(["embeddings"], {k: v.astype(np.int64) for k, v in batch.items() if k in names})[0]
    np.testing.assert_allclose(out, np.array(got.json()["embeddings"]), atol=2e-5, rtol=1e-4)
    # The fine-tuned run's export holds its trained encoder: it gives what /embed gives for it.
    session = ort.InferenceSession(str(tmp_path / "tuned" / "model.onnx"))
    out, encoder = session.run(["embeddings", "encoder"], {k: v.astype(np.int64) for k, v in batch.items()
                                                            if k in names})
    np.testing.assert_allclose(out, np.array(both[0].json()["embeddings"]), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(encoder, np.array(both[1].json()["embeddings"]), atol=2e-5, rtol=1e-4)


def test_timm_weights_are_checked_against_their_architecture_and_a_run_trains_on_them(
        client, worker, settings, tmp_path):
    # timm's test_convnext, random weights: its features of digits still separate the classes
    # (logistic regression 0.5 on 300 rows), where test_efficientnet's barely vary.
    weights = timm_weights(tmp_path / "convnext.safetensors", arch="test_convnext").read_bytes()
    r = client.post("/encoders", files={"file": ("convnext.safetensors", weights)},
                    data={"architecture": "test_convnext"})
    assert r.status_code == 201, r.text
    enc = r.json()
    assert (enc["kind"], enc["modality"], enc["features"], enc["spec_name"]) == \
        ("timm", "image", 64, "timm:test_convnext")
    spec = {"dataset": "digits", "encoder_id": enc["id"], "loss": "gaussian", "lam": 0.8, "epochs": 8,
            "lr": 0.01, "train_subset": 300, "hidden": 16, "batch_size": 16}
    r = client.post("/experiments", json=spec)
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, timeout=300)
    assert body["status"] == "succeeded", body.get("error")
    image = [[0.0] * 8 for _ in range(8)]
    got = client.post("/embed", json={"experiment_id": body["id"], "arrays": [image, image]})
    assert got.status_code == 200, got.text
    assert np.array(got.json()["embeddings"]).shape == (2, 16)
    # The same weights named for text: refused, naming both modalities.
    r = client.post("/experiments", json={"dataset": "ag-news", "encoder_id": enc["id"], "epochs": 1})
    assert r.status_code == 422 and "image encoder" in r.text and "text inputs" in r.text, r.text
