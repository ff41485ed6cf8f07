"""Model export: the encoder and head in one ONNX or TorchScript file, checked under
onnxruntime (and torch.jit) against the service's own /embed and /predict rows, on
models a real worker trained."""

from __future__ import annotations

import io
import json

import numpy as np
import onnxruntime as ort
import pytest
import torch
from sklearn.datasets import load_digits

from corel.cli import main
from corel.data import prepare_images
from tests.app.conftest import finished, serving, wait_for
from tests.conftest import assert_rows_close

SPEC = {"dataset": "digits", "lr": 0.003, "batch_size": 64, "epochs": 3}


@pytest.fixture(scope="module")
def trained(client, worker) -> dict[str, int]:
    runs = {"ffnn-gaussian": {"model": "ffnn", "loss": "gaussian", "lam": 0.85},
            "cnn-cosine": {"model": "cnn", "loss": "cosine", "lam": 0.85}}
    ids = {k: client.post("/experiments", json={**SPEC, **v}).json()["id"] for k, v in runs.items()}
    for i in ids.values():
        assert wait_for(client, i, finished)["status"] == "succeeded"
    return ids


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_digits().images[-40:].astype(np.float32)  # raw 8 x 8 pixels, 0..16


@pytest.mark.parametrize("run", ["ffnn-gaussian", "cnn-cosine"])
def test_an_onnx_export_matches_embed_and_predict(client, trained, images, run):
    eid = trained[run]
    r = client.get(f"/experiments/{eid}/export", params={"format": "onnx"})
    assert r.status_code == 200, r.text
    session = ort.InferenceSession(r.content)
    meta = json.loads(session.get_modelmeta().custom_metadata_map["corel"])
    # What a user of the file does: the recorded preprocessing, then the model.
    x = prepare_images(images, meta["preprocessing"]).numpy()
    assert list(x.shape[1:]) == meta["inputs"]["x"]["shape"][1:]
    embeddings, similarities = session.run(["embeddings", "similarities"], {"x": x})
    served = client.post("/embed", json={"experiment_id": eid, "arrays": images.tolist()}).json()
    assert_rows_close(embeddings, served["embeddings"])
    predicted = client.post("/predict", json={"experiment_id": eid, "arrays": images.tolist()}).json()
    assert_rows_close(similarities, [p["similarities"] for p in predicted["predictions"]])
    assert meta["class_names"] == predicted["class_names"]
    assert meta["similarity"] == predicted["similarity"]
    assert meta["trained_on"] == {"dataset": "digits"}


def test_a_torchscript_export_matches_embed(client, trained, images):
    eid = trained["ffnn-gaussian"]
    r = client.get(f"/experiments/{eid}/export", params={"format": "torchscript"})
    assert r.status_code == 200
    extra = {"corel.json": ""}
    module = torch.jit.load(io.BytesIO(r.content), _extra_files=extra)
    meta = json.loads(extra["corel.json"])
    with torch.no_grad():
        embeddings, _ = module(prepare_images(images, meta["preprocessing"]))
    served = client.post("/embed", json={"experiment_id": eid, "arrays": images.tolist()}).json()
    assert_rows_close(embeddings.numpy(), served["embeddings"])


def test_corel_export_writes_the_file(settings, trained, tmp_path, capsys):
    from app.main import create_app

    out = tmp_path / "model.onnx"
    with serving(create_app(settings)) as url:
        assert main(["export", "--url", url, "--experiment", str(trained["ffnn-gaussian"]),
                     "--out", str(out)]) == 0
    assert "model.onnx" in capsys.readouterr().out
    session = ort.InferenceSession(out.read_bytes())
    assert [o.name for o in session.get_outputs()] == ["embeddings", "similarities"]


def test_bad_exports_are_refused(client, trained, worker):
    r = client.get(f"/experiments/{trained['ffnn-gaussian']}/export", params={"format": "pickle"})
    assert r.status_code == 422 and "Input should be 'onnx' or 'torchscript'; got 'pickle'" in r.json()["detail"]
    queued = client.post("/experiments", json={**SPEC, "epochs": 500}).json()["id"]
    try:
        r = client.get(f"/experiments/{queued}/export")
        assert r.status_code == 409 and "needs a succeeded experiment" in r.json()["detail"]
    finally:
        client.post(f"/experiments/{queued}/cancel")
