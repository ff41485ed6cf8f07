"""Runs on a frozen pretrained encoder, served end to end by a real worker and the API:
/embed's two layers (the head's h, and the encoder's own output, which equals
sentence-transformers' own encode); the whole model exported (ONNX and TorchScript: for
texts from the shipped tokenizer's token ids, for images from the pixels) and run on raw
sentences and images against /embed and /predict; a batch embedding job over raw texts
against /embed.

Tolerances: assert_rows_close's 1e-5 of a row's largest entry (float32 rounding of the same
layers summed in another order) for everything but the ONNX image model, held to 1e-4:
onnxruntime's convolutions through EfficientNet-Lite0's 50-odd layers round apart from
torch's by up to 6e-6 of a row's scale here (64 images), which leaves 1e-5 little margin.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import zipfile

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from corel.data import prepare_images
from corel.serving import ServedModel
from corel.train import checkpoint_from_bytes
from tests.app.conftest import clothes_upload, finished, wait_body, wait_for
from tests.conftest import assert_rows_close

TOPICS = ["World", "Sports", "Business", "Sci/Tech"]
SENTENCES = ["Stocks fell as the central bank raised interest rates",
             "The striker scored twice in the cup final",
             "short",
             # Past the encoder's 256 tokens: cut there, by sentence-transformers and the tokenizer alike.
             " ".join(["the spacecraft's probe sent pictures of the surface of mars"] * 40)]
IMAGE_TOL = 1e-4


@pytest.fixture(scope="module")
def minilm(client, worker, shared_datasets) -> dict:
    """A Cosine-COREL head over frozen all-MiniLM-L6-v2 on 120 AG News rows (a parquet upload)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[:120]
    texts = [f"{r[1]} {r[2]}" for r in rows]
    buf = io.BytesIO()
    pq.write_table(pa.table({"headline": texts, "topic": [TOPICS[int(r[0]) - 1] for r in rows]}), buf)
    upload = client.post("/datasets", files={"file": ("news.parquet", buf.getvalue())})
    assert upload.status_code == 201, upload.text
    r = client.post("/experiments", json={"dataset": "text", "dataset_id": upload.json()["id"],
                                          "encoder": "minilm", "loss": "cosine", "lam": 0.85, "epochs": 6,
                                          "lr": 0.003, "batch_size": 32, "hidden": 64})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, timeout=300)
    assert body["status"] == "succeeded", body
    return {"id": body["id"], "dataset_id": upload.json()["id"], "texts": texts}


def _embed(client, eid: int, **body) -> dict:
    r = client.post("/embed", json={"experiment_id": eid, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_embed_returns_the_head_s_representation_or_the_encoder_s_own(client, minilm):
    from sentence_transformers import SentenceTransformer

    from corel.encoders.files import installed

    eid = minilm["id"]
    default = _embed(client, eid, texts=SENTENCES)
    head = _embed(client, eid, texts=SENTENCES, layer="head")
    encoder = _embed(client, eid, texts=SENTENCES, layer="encoder")
    assert (default["layer"], head["layer"], encoder["layer"]) == ("head", "head", "encoder")
    assert default["dim"] == 64 and encoder["dim"] == 384
    np.testing.assert_array_equal(head["embeddings"], default["embeddings"])
    # The encoder's own output: sentence-transformers' encode, by a copy loaded here.
    own = SentenceTransformer(str(installed("minilm", "text")), device="cpu", local_files_only=True)
    assert_rows_close(encoder["embeddings"], own.encode(SENTENCES))
    # and h is the trained layers over it.
    served = ServedModel.from_bytes(client.get(f"/experiments/{eid}/checkpoint").content)
    assert_rows_close(default["embeddings"],
                      served.embed(torch.tensor(encoder["embeddings"], dtype=torch.float32)).numpy())
    # A form takes the layer too.
    r = client.post("/embed", data={"experiment_id": str(eid), "layer": "encoder"},
                    files=[("files", ("a.txt", SENTENCES[0].encode(), "text/plain"))])
    assert r.status_code == 200 and r.json()["layer"] == "encoder", r.text
    assert_rows_close(r.json()["embeddings"], np.asarray(encoder["embeddings"])[:1])


def test_concurrent_text_requests_share_the_encoder_s_pass_and_get_their_own_rows(settings, minilm):
    """Twelve small requests of raw texts arriving together, for the head and for the
    encoder's own layer: one encoder pass per layer, computed off the event loop, and each
    request gets the rows of its own texts, in order."""
    import asyncio

    from app.core.db import make_engine, make_sessionmaker, session_scope
    from app.core.schemas.inference import InferenceRequest
    from app.serving.inference import InferenceRunner
    from app.serving.model_cache import load_from_database
    from app.storage import ensure

    engine = make_engine(settings.db_url)
    with session_scope(ensure(make_sessionmaker(engine), settings)) as session:
        loaded = load_from_database(session, minilm["id"], "cpu")
    engine.dispose()
    texts = minilm["texts"]
    requests = [(InferenceRequest.model_validate({"experiment_id": minilm["id"],
                                                  "texts": texts[i:i + 1 + i % 2]}),
                 "encoder" if i % 3 == 0 else "head", i % 2 == 1) for i in range(12)]
    runner = InferenceRunner(threads=2)

    async def together():
        return await asyncio.gather(*(runner.run(r, loaded, similarities=sims, layer=layer)
                                      for r, layer, sims in requests))

    try:
        results = asyncio.run(together())
    finally:
        runner.close()
    assert runner.forward_passes == 2  # one per layer
    served = loaded.served
    for i, ((req, layer, sims), (h, got_sims)) in enumerate(zip(requests, results, strict=True)):
        x = served.prepare(req.texts)
        want = served.embed(x, "encoder") if layer == "encoder" else served.embed(x)
        assert h.shape == (1 + i % 2, 384 if layer == "encoder" else 64)
        assert_rows_close(h.numpy(), want.numpy())
        if sims and layer == "head":
            assert_rows_close(got_sims.numpy(), served.forward(x, True)[1].numpy())
        else:
            assert got_sims is None


def test_a_text_longer_than_the_encoder_reads_is_answered_with_a_warning(client, minilm):
    """SENTENCES[3] is some 500 tokens: MiniLM reads 256. Cut silently before."""
    eid = minilm["id"]
    predicted = client.post("/predict", json={"experiment_id": eid, "texts": SENTENCES}).json()["predictions"]
    assert [("warning" in p) for p in predicted] == [False, False, False, True]
    assert "tokens long and the encoder reads its first 256" in predicted[3]["warning"]
    embedded = _embed(client, eid, texts=SENTENCES)
    assert embedded["warnings"][:3] == [None, None, None]
    assert embedded["warnings"][3] == predicted[3]["warning"]
    assert "warnings" not in _embed(client, eid, texts=SENTENCES[:2])


def test_a_layer_that_is_not_there_is_refused_with_what_is_allowed(client, digits_runs):
    eid = digits_runs["cosine"]  # the paper's FFNN on the pixels: no pretrained encoder
    pixels = np.zeros((1, 8, 8)).tolist()
    r = client.post("/embed", json={"experiment_id": eid, "arrays": pixels, "layer": "encoder"})
    assert r.status_code == 422, r.text
    assert "has no pretrained encoder" in r.json()["detail"] and "allowed here: 'head'" in r.json()["detail"]
    r = client.post("/embed", params={"experiment_id": eid, "dtype": "float32", "shape": "1,8,8",
                                      "layer": "encoder"},
                    content=np.zeros((1, 8, 8), np.float32).tobytes(),
                    headers={"content-type": "application/octet-stream"})
    assert r.status_code == 422 and "has no pretrained encoder" in r.json()["detail"], r.text
    r = client.post("/embed", json={"experiment_id": eid, "arrays": pixels, "layer": "penultimate"})
    assert r.status_code == 422
    assert "layer: Input should be 'head' or 'encoder'; got 'penultimate'" in r.json()["detail"]
    r = client.post("/predict", json={"experiment_id": eid, "arrays": pixels, "layer": "head"})
    assert r.status_code == 422 and "layer" in r.json()["detail"], r.text
    assert _embed(client, eid, arrays=pixels, layer="head")["dim"] == 128


def _unzip(content: bytes, folder) -> dict:
    with zipfile.ZipFile(io.BytesIO(content)) as z:
        z.extractall(folder)
    return json.loads((folder / "corel.json").read_text())


def _tokens(folder, meta: dict) -> tuple[np.ndarray, np.ndarray]:
    """SENTENCES through the shipped tokenizer, as a user of the export does."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / meta["tokenizer"]["folder"] / "tokenizer.json"))
    batch = tokenizer.encode_batch(SENTENCES)
    return (np.array([e.ids for e in batch], np.int64), np.array([e.attention_mask for e in batch], np.int64))


def test_the_onnx_export_of_a_text_run_holds_the_encoder_and_its_tokenizer(client, minilm, tmp_path):
    from transformers import AutoTokenizer

    eid = minilm["id"]
    r = client.get(f"/experiments/{eid}/export", params={"format": "onnx"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/zip"
    assert f'filename="experiment-{eid}.zip"' in r.headers["content-disposition"]
    meta = _unzip(r.content, tmp_path)
    session = ort.InferenceSession(str(tmp_path / meta["files"]["model"]))
    assert json.loads(session.get_modelmeta().custom_metadata_map["corel"]) == meta
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    assert [o.name for o in session.get_outputs()] == ["embeddings", "similarities", "encoder"]
    assert meta["tokenizer"]["modules"] == ["Transformer", "Pooling", "Normalize"]  # its modules.json
    assert meta["tokenizer"]["max_length"] == 256 and meta["spec"]["encoder"] == "minilm"
    ids, mask = _tokens(tmp_path, meta)
    assert ids.shape == (4, 256)  # the long text cut at 256, the rest padded to it
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))(
        SENTENCES, padding=True, truncation=True, return_tensors="np")
    np.testing.assert_array_equal(auto["input_ids"], ids)
    embeddings, similarities, features = session.run(None, {"input_ids": ids, "attention_mask": mask})
    assert_rows_close(embeddings, _embed(client, eid, texts=SENTENCES)["embeddings"])
    assert_rows_close(features, _embed(client, eid, texts=SENTENCES, layer="encoder")["embeddings"])
    predicted = client.post("/predict", json={"experiment_id": eid, "texts": SENTENCES}).json()
    assert_rows_close(similarities, [p["similarities"] for p in predicted["predictions"]])
    assert meta["class_names"] == predicted["class_names"]


def test_the_torchscript_export_of_a_text_run_matches_embed(client, minilm, tmp_path):
    eid = minilm["id"]
    r = client.get(f"/experiments/{eid}/export", params={"format": "torchscript"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip", r.text
    meta = _unzip(r.content, tmp_path)
    module = torch.jit.load(str(tmp_path / meta["files"]["model"]))
    ids, mask = _tokens(tmp_path, meta)
    with torch.no_grad():
        embeddings, _, features = module(torch.from_numpy(ids), torch.from_numpy(mask))
    assert_rows_close(embeddings.numpy(), _embed(client, eid, texts=SENTENCES)["embeddings"])
    assert_rows_close(features.numpy(), _embed(client, eid, texts=SENTENCES, layer="encoder")["embeddings"])


def test_a_batch_job_over_raw_texts_equals_embed(client, minilm):
    eid = minilm["id"]
    r = client.post(f"/experiments/{eid}/embeddings", json={"dataset_id": minilm["dataset_id"]})
    assert r.status_code == 202, r.text
    job = wait_body(client, f"/embeddings/{r.json()['id']}", timeout=180)
    assert job["status"] == "succeeded" and job["n_done"] == len(minilm["texts"]) and job["dim"] == 64, job
    table = np.load(io.BytesIO(client.get(f"/embeddings/{job['id']}/result").content), allow_pickle=False)
    assert_rows_close(table["h"], _embed(client, eid, texts=minilm["texts"])["embeddings"])


# --- images: EfficientNet-Lite0 ------------------------------------------------------------------

CLOTHES = {0: "t-shirt", 1: "trouser", 7: "sneaker"}


@pytest.fixture(scope="module")
def lite0(client, worker, fashion_dir) -> dict:
    """A Gaussian-COREL head over frozen EfficientNet-Lite0 on 36 Fashion-MNIST images (an
    image folder upload: class/*.png, 28 x 28 grey)."""
    x, y, upload = clothes_upload(client, fashion_dir, CLOTHES)
    r = client.post("/experiments", json={"dataset": "images", "dataset_id": upload.json()["id"],
                                          "encoder": "efficientnet-lite0", "loss": "gaussian", "lam": 0.8,
                                          "epochs": 4, "lr": 0.003, "batch_size": 16, "hidden": 32})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, timeout=300)
    assert body["status"] == "succeeded", body
    test_images = x[np.isin(y, list(CLOTHES))][-5:]  # not among the 36
    return {"id": body["id"], "images": test_images}


def test_the_onnx_export_of_an_image_run_holds_the_encoder(client, lite0):
    eid, images = lite0["id"], lite0["images"]
    r = client.get(f"/experiments/{eid}/export", params={"format": "onnx"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/onnx", r.text
    session = ort.InferenceSession(r.content)
    meta = json.loads(session.get_modelmeta().custom_metadata_map["corel"])
    assert meta["inputs"]["x"]["shape"] == ["N", 1, 28, 28]
    # What a user of the file does: the pixels as the dataset's loader scales them, then the model.
    x = prepare_images(images, meta["preprocessing"]["pixels"]).numpy()
    embeddings, similarities, features = session.run(["embeddings", "similarities", "encoder"], {"x": x})
    assert_rows_close(embeddings, _embed(client, eid, arrays=images.tolist())["embeddings"], rtol=IMAGE_TOL)
    assert_rows_close(features, _embed(client, eid, arrays=images.tolist(), layer="encoder")["embeddings"],
                      rtol=IMAGE_TOL)
    pngs = []
    for image in images:
        png = io.BytesIO()
        Image.fromarray(image, "L").save(png, format="PNG")
        pngs.append(base64.b64encode(png.getvalue()).decode())
    predicted = client.post("/predict", json={"experiment_id": eid, "images": pngs}).json()
    assert_rows_close(similarities, [p["similarities"] for p in predicted["predictions"]], rtol=IMAGE_TOL)
    assert meta["class_names"] == predicted["class_names"]


def test_the_torchscript_export_of_an_image_run_matches_embed(client, lite0):
    eid, images = lite0["id"], lite0["images"]
    r = client.get(f"/experiments/{eid}/export", params={"format": "torchscript"})
    assert r.status_code == 200, r.text
    extra = {"corel.json": ""}
    module = torch.jit.load(io.BytesIO(r.content), _extra_files=extra)
    meta = json.loads(extra["corel.json"])
    with torch.no_grad():
        embeddings, _, features = module(prepare_images(images, meta["preprocessing"]["pixels"]))
    assert_rows_close(embeddings.numpy(), _embed(client, eid, arrays=images.tolist())["embeddings"])
    assert_rows_close(features.numpy(), _embed(client, eid, arrays=images.tolist(), layer="encoder")["embeddings"])


def test_images_wider_than_the_encoder_s_export_to_torchscript_only(client, lite0):
    """Served, 128-pixel images shrink to 96 with an antialiased resize; ONNX has none, so its
    export is refused, and TorchScript's holds it (the same run's head, over 128-pixel pixels)."""
    from corel.export import export_file

    checkpoint = checkpoint_from_bytes(client.get(f"/experiments/{lite0['id']}/checkpoint").content)
    preprocessing = json.loads(checkpoint["preprocessing"])
    preprocessing["pixels"]["input_shape"] = [1, 128, 128]
    checkpoint["preprocessing"] = json.dumps(preprocessing)
    with pytest.raises(ValueError, match="antialiased bilinear resize, which ONNX"):
        export_file(checkpoint, "onnx")
    module = torch.jit.load(io.BytesIO(export_file(checkpoint, "torchscript").data))
    raw = np.random.default_rng(0).integers(0, 256, (3, 128, 128)).astype(np.uint8)
    served = ServedModel.from_checkpoint(checkpoint)
    x = served.prepare(raw)
    with torch.no_grad():
        embeddings, _, features = module(prepare_images(raw, preprocessing["pixels"]))
    assert_rows_close(features.numpy(), x.numpy())
    assert_rows_close(embeddings.numpy(), served.embed(x).numpy())
