"""The encoders added through the family contract alone, trained by a real worker and
served over HTTP on raw inputs (/embed, /predict, /neighbors) and exported (ONNX), each
held to its reference implementation: WordLlama (static token embeddings, a family of its
own) to the wordllama package's own ``embed``; EfficientNet-Lite2 (a second member of the
timm family) to the original implementation (efficientnet-lite-pytorch) on the same input.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from corel.data import prepare_images
from tests.app.conftest import clothes_upload, finished, wait_for
from tests.conftest import assert_rows_close

TOPICS = ["World", "Sports", "Business", "Sci/Tech"]
SENTENCES = ["Stocks fell as the central bank raised interest rates",
             "The striker scored twice in the cup final", "short",
             " ".join(["the spacecraft's probe sent pictures of the surface of mars"] * 40)]
CLOTHES = {0: "t-shirt", 1: "trouser", 7: "sneaker"}
IMAGE_TOL = 1e-4  # onnxruntime's convolutions round apart from torch's (test_frozen_serving.py)


def _train(client, dataset: str, dataset_id: int, encoder: str, **fields) -> int:
    r = client.post("/experiments", json={"dataset": dataset, "dataset_id": dataset_id, "encoder": encoder,
                                          "loss": "cosine", "lam": 0.85, "epochs": 4, "lr": 0.003,
                                          "batch_size": 16, "hidden": 32, **fields})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, timeout=300)
    assert body["status"] == "succeeded", body
    assert client.get(f"/experiments/{body['id']}").json()["spec"]["encoder"] == encoder
    return int(body["id"])


def _embed(client, eid: int, **body) -> np.ndarray:
    r = client.post("/embed", json={"experiment_id": eid, **body})
    assert r.status_code == 200, r.text
    return np.array(r.json()["embeddings"])


@pytest.fixture(scope="module")
def news(client, shared_datasets) -> dict:
    """160 AG News rows uploaded as a text table."""
    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:160]
    texts = [f"{r[1]} {r[2]}" for r in rows]
    lines = ["text,topic"] + [f"\"{t.replace(chr(34), '')}\",{TOPICS[int(r[0]) - 1]}" for t, r in zip(texts, rows,
                                                                                                     strict=True)]
    upload = client.post("/datasets", files={"file": ("news.csv", "\n".join(lines).encode())},
                         data={"kind": "text"})
    assert upload.status_code == 201, upload.text
    return {"id": upload.json()["id"], "texts": texts}


@pytest.fixture(scope="module")
def wordllama(client, worker, news) -> dict:
    return {"id": _train(client, "text", news["id"], "wordllama"), "texts": news["texts"]}


def test_a_frozen_minilm_run_records_its_features_path_and_serves_on_it(client, worker, news):
    """40 held-out rows: enough for the parity gate, whose verdict the experiment shows and
    whose path /embed computes the encoder's features on."""
    import corel.encoder_catalog as catalog
    from corel.encoders import load, run_preprocessing
    from corel.encoders.text_transformers import FAMILY

    eid = _train(client, "text", news["id"], "minilm", val_fraction=0.25)
    body = client.get(f"/experiments/{eid}").json()
    record = body["features"]
    assert record["asked"] == "auto"
    offers = catalog.cpu_offers()  # the worker's CPU: this machine's
    if offers["bf16"] or offers["int8"]:
        assert record["gate_rows"] == 40
        assert record["precision"] in record["gate"] and record["gate"][record["precision"]]["passed"]
    else:  # an AVX2 CPU offers no faster path: fp32, with nothing to judge
        assert (record["precision"], record["gate"]) == ("fp32", {})
    assert set(record["warnings"]) <= set(body["warnings"])
    got = _embed(client, eid, texts=SENTENCES[:2], layer="encoder")
    want = FAMILY.compute(record["precision"], SENTENCES[:2], load(run_preprocessing("minilm", "text")))
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-6)


def test_wordllama_trains_and_serves_its_own_features_on_raw_texts(client, wordllama, tmp_path):
    import wordllama as package
    from wordllama import WordLlama

    eid = wordllama["id"]
    reference = WordLlama.load(cache_dir=Path(package.__file__).parent, disable_download=True).embed(SENTENCES)
    features = _embed(client, eid, texts=SENTENCES, layer="encoder")
    assert features.shape == (4, 256)
    np.testing.assert_allclose(features, reference, rtol=1e-5, atol=1e-6)
    head = _embed(client, eid, texts=SENTENCES)
    assert head.shape == (4, 32)
    predicted = client.post("/predict", json={"experiment_id": eid, "texts": SENTENCES})
    assert predicted.status_code == 200, predicted.text
    assert set(predicted.json()["class_names"]) == set(TOPICS)
    found = client.post(f"/experiments/{eid}/neighbors", json={"texts": SENTENCES[:2], "k": 3})
    assert found.status_code == 200, found.text
    assert [len(r["neighbors"]) for r in found.json()["results"]] == [3, 3]
    # The export: the mean of the token embeddings from the shipped tokenizer's ids, then the head.
    r = client.get(f"/experiments/{eid}/export", params={"format": "onnx"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip", r.text
    with zipfile.ZipFile(io.BytesIO(r.content)) as z:
        z.extractall(tmp_path)
    meta = json.loads((tmp_path / "corel.json").read_text())
    from tokenizers import Tokenizer

    batch = Tokenizer.from_file(str(tmp_path / meta["tokenizer"]["folder"] / "tokenizer.json")).encode_batch(SENTENCES)
    ids = np.array([e.ids for e in batch], np.int64)
    mask = np.array([e.attention_mask for e in batch], np.int64)
    session = ort.InferenceSession(str(tmp_path / meta["files"]["model"]))
    embeddings, _, exported = session.run(None, {"input_ids": ids, "attention_mask": mask})
    assert_rows_close(exported, features)
    assert_rows_close(embeddings, head)


@pytest.fixture(scope="module")
def lite2(client, worker, fashion_dir) -> dict:
    x, y, upload = clothes_upload(client, fashion_dir, CLOTHES)
    return {"id": _train(client, "images", upload.json()["id"], "efficientnet-lite2", loss="gaussian", lam=0.8),
            "images": x[np.isin(y, list(CLOTHES))][-5:]}


def test_efficientnet_lite2_trains_and_serves_the_reference_implementation_s_features(client, lite2):
    from efficientnet_lite_pytorch import EfficientNet

    from corel.encoders.files import installed

    eid, images = lite2["id"], lite2["images"]
    features = _embed(client, eid, arrays=images.tolist(), layer="encoder")
    assert features.shape == (5, 1280)
    # The reference on the same input: the pixels in [0, 1], grey to three channels, 128 pixels,
    # ImageNet's normalisation (timm's configuration for tf_efficientnet_lite2).
    reference = EfficientNet.from_name("efficientnet-lite2", image_size=128)  # its static padding: for 128
    reference.load_state_dict(torch.load(installed("efficientnet-lite2", "image"), map_location="cpu",
                                         weights_only=True))
    reference.eval()
    pixels = torch.from_numpy(images).float().div(255).unsqueeze(1).expand(-1, 3, -1, -1)
    pixels = torch.nn.functional.interpolate(pixels, size=(128, 128), mode="bilinear", align_corners=False)
    mean, std = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1), torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
    with torch.no_grad():
        want = reference.extract_features((pixels - mean) / std).mean(dim=(2, 3))
    assert_rows_close(features, want.numpy())
    pngs = []
    for image in images:
        png = io.BytesIO()
        Image.fromarray(image, "L").save(png, format="PNG")
        pngs.append(base64.b64encode(png.getvalue()).decode())
    predicted = client.post("/predict", json={"experiment_id": eid, "images": pngs})
    assert predicted.status_code == 200, predicted.text
    found = client.post(f"/experiments/{eid}/neighbors", json={"arrays": images[:2].tolist(), "k": 3})
    assert found.status_code == 200, found.text
    r = client.get(f"/experiments/{eid}/export", params={"format": "onnx"})
    assert r.status_code == 200, r.text
    session = ort.InferenceSession(r.content)
    meta = json.loads(session.get_modelmeta().custom_metadata_map["corel"])
    embeddings, similarities, exported = session.run(
        ["embeddings", "similarities", "encoder"], {"x": prepare_images(images, meta["preprocessing"]["pixels"]).numpy()})
    assert_rows_close(exported, features, rtol=IMAGE_TOL)
    assert_rows_close(embeddings, _embed(client, eid, arrays=images.tolist()), rtol=IMAGE_TOL)
    assert_rows_close(similarities, [p["similarities"] for p in predicted.json()["predictions"]], rtol=IMAGE_TOL)
