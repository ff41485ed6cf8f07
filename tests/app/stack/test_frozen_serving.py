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
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from PIL import Image

from corel.data import prepare_images
from corel.serving import ServedModel
from corel.train import checkpoint_from_bytes
from harness.wait import wait_until
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


# The text queue (app.serving.inference.InferenceRunner): a token budget, first in first out,
# a cap answered 429, and clients that leave dropped before their pass.

class _Batches:
    """An observer that keeps what the runner reports."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, int]] = []  # (texts, tokens) per pass
        self.refused: list[tuple[str, int]] = []

    def observe_text_batch(self, inputs, tokens, queued, compute):
        assert len(queued) >= 1 and all(q >= 0 for q in queued) and compute > 0
        self.batches.append((inputs, tokens))

    def observe_text_refused(self, reason, inputs):
        self.refused.append((reason, inputs))


def _served(settings, minilm):
    from app.core.db import make_engine, make_sessionmaker, session_scope
    from app.serving.model_cache import load_from_database
    from app.storage import ensure

    engine = make_engine(settings.db_url)
    with session_scope(ensure(make_sessionmaker(engine), settings)) as session:
        loaded = load_from_database(session, minilm["id"], "cpu")
    engine.dispose()
    return loaded


class _Held:
    """Every thread of a runner's pool held busy until released: its next pass waits."""

    def __init__(self, runner) -> None:
        import threading

        self.release = threading.Event()
        started = [threading.Event() for _ in range(runner.threads)]

        def hold(i):
            started[i].set()
            self.release.wait(60)

        for i in range(runner.threads):
            runner._pool.submit(hold, i)
        for event in started:
            assert event.wait(10)


def test_the_tokens_counted_are_the_encoder_s_own(settings, minilm):
    from sentence_transformers import SentenceTransformer

    from corel.encoders.files import installed

    served = _served(settings, minilm).served
    st = SentenceTransformer(str(installed("minilm", "text")), device="cpu", local_files_only=True)
    want = [int(st.tokenize([t])["attention_mask"].sum()) for t in SENTENCES]
    assert served.tokens(SENTENCES) == want
    assert want[2] == 3 and want[3] == 256  # [CLS] short [SEP]; cut where the encoder cuts


def test_queued_texts_are_batched_first_in_first_out_within_the_token_budget(settings, minilm):
    """Twelve requests of two layers arrive together; the budget lets two or three through at
    a time. Each pass takes the oldest request's layer and the same layer's requests after it
    in order while their tokens fit; each request gets its own rows."""
    import asyncio

    from app.core.schemas.inference import InferenceRequest
    from app.serving.inference import InferenceRunner

    loaded = _served(settings, minilm)
    served = loaded.served
    texts = minilm["texts"]
    requests = [(texts[3 * i:3 * i + 1 + i % 3], "encoder" if i % 4 == 0 else "head") for i in range(12)]
    tokens = [sum(served.tokens(t)) for t, _ in requests]
    budget = max(tokens) + min(tokens)  # two or three requests a pass
    want, queue = [], list(range(12))
    while queue:  # the batches the rule gives
        layer, batch, used, rest = requests[queue[0]][1], [], 0, []
        for j, i in enumerate(queue):
            if requests[i][1] != layer:
                rest.append(i)
            elif batch and used + tokens[i] > budget:
                rest.extend(k for k in queue[j:])
                break
            else:
                batch.append(i)
                used += tokens[i]
        queue = rest
        want.append((sum(len(requests[i][0]) for i in batch), used))
    assert len(want) >= 5  # the budget splits the head's requests, the layers split the rest
    seen = _Batches()
    runner = InferenceRunner(threads=2, batch_tokens=budget, observer=seen)

    async def together():
        return await asyncio.gather(*(
            runner.run(InferenceRequest.model_validate({"experiment_id": minilm["id"], "texts": t}),
                       loaded, similarities=False, layer=layer) for t, layer in requests))

    try:
        results = asyncio.run(together())
    finally:
        runner.close()
    assert seen.batches == want
    assert runner.forward_passes == len(want) and runner.queued_inputs == 0 == runner.queued_tokens
    for (t, layer), (h, _) in zip(requests, results, strict=True):
        assert_rows_close(h.numpy(), served.embed(served.prepare(t), layer).numpy())


def test_a_text_pass_computes_on_the_runner_s_text_threads_and_the_others_keep_theirs(
        settings, minilm, monkeypatch):
    """The queue's pass runs the encoder on ``text_threads`` torch threads (the encoder is
    where a text request's time goes: bench/text_latency.py); the thread that asked, and the
    pool's thread once the pass is over, keep the count they had; the rows are those of a
    pass on one thread."""
    import asyncio

    import torch

    import app.serving.inference as inference
    from app.core.schemas.inference import InferenceRequest

    loaded = _served(settings, minilm)
    during: list[int] = []
    real = inference.prepare

    def counted(raw, model):
        during.append(torch.get_num_threads())
        return real(raw, model)

    monkeypatch.setattr(inference, "prepare", counted)
    mine = torch.get_num_threads()
    request = InferenceRequest.model_validate({"experiment_id": minilm["id"], "texts": minilm["texts"][:8]})
    rows = {}
    for n in (1, 2):
        runner = inference.InferenceRunner(threads=1, text_threads=n)
        try:
            runner._pool.submit(torch.set_num_threads, 1).result()  # the pool's thread at 1, as in the API
            rows[n] = asyncio.run(runner.run(request, loaded, similarities=False, layer="head"))[0].numpy()
            assert runner._pool.submit(torch.get_num_threads).result() == 1
        finally:
            runner.close()
    assert during == [1, 2]
    assert torch.get_num_threads() == mine
    assert_rows_close(rows[2], rows[1])
    with pytest.raises(ValueError, match="text_threads must be at least 1"):
        inference.InferenceRunner(threads=1, text_threads=0)


def test_a_full_queue_is_refused_at_once_and_a_client_that_leaves_is_never_computed(settings, minilm):
    import asyncio

    from app.core.errors import ClientGone, QueueFull
    from app.core.schemas.inference import InferenceRequest
    from app.serving.inference import InferenceRunner

    loaded = _served(settings, minilm)
    texts = minilm["texts"]
    seen = _Batches()
    runner = InferenceRunner(threads=2, queue_max_inputs=3, observer=seen)

    def request(n):
        return InferenceRequest.model_validate({"experiment_id": minilm["id"], "texts": texts[:n]})

    async def scenario():
        held = _Held(runner)  # the first request's pass waits for the pool
        first = asyncio.ensure_future(runner.run(request(1), loaded, False))
        while runner.forward_passes == 0:
            await asyncio.sleep(0.001)
        left = asyncio.Event()
        second = asyncio.ensure_future(runner.run(request(2), loaded, True, gone=left.wait))
        await asyncio.sleep(0.01)
        assert (runner.queued_inputs, runner.queued_requests) == (2, 1)
        with pytest.raises(QueueFull) as full:
            await runner.run(request(2), loaded, False)  # 2 + 2 > 3
        assert full.value.status_code == 429 and full.value.retry_after >= 1
        assert "COREL_TEXT_QUEUE_MAX_INPUTS" in full.value.detail and "cap of 3" in full.value.detail
        third = asyncio.ensure_future(runner.run(request(1), loaded, False))  # 2 + 1 fits
        await asyncio.sleep(0.01)
        left.set()  # the second's client leaves while it waits
        with pytest.raises(ClientGone):
            await second
        assert (runner.queued_inputs, runner.queued_requests) == (1, 1)  # the third alone
        held.release.set()
        h1, _ = await first
        h3, _ = await third
        return h1, h3

    try:
        h1, h3 = asyncio.run(scenario())
    finally:
        runner.close()
    assert seen.refused == [("queue_full", 2), ("client_gone", 2)]
    assert [n for n, _ in seen.batches] == [1, 1]  # the first's and the third's: never the second's
    assert h1.shape == h3.shape == (1, 64)
    assert runner.queued_inputs == 0 == runner.queued_tokens


def test_the_service_answers_a_full_text_queue_with_429_and_retry_after(client, minilm):
    """Through HTTP: one request in a pass held back, one waiting; the next, past the cap,
    is a 429 with Retry-After at once, and /metrics counts each."""
    import threading

    from app.api.state import state_of

    runner = state_of(client.app).inference
    eid, texts = minilm["id"], minilm["texts"]
    assert client.post("/embed", json={"experiment_id": eid, "texts": texts[:1]}).status_code == 200

    def metric(name, text=None):
        text = text or client.get("/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    before = client.get("/metrics").text
    cap, passes = runner.queue_max_inputs, runner.forward_passes
    held = _Held(runner)
    answers: dict[str, Any] = {}

    def post(name, n):
        answers[name] = client.post("/embed", json={"experiment_id": eid, "texts": texts[:n]})

    threads = [threading.Thread(target=post, args=("first", 1))]
    try:
        threads[0].start()
        wait_until(lambda: runner.forward_passes == passes + 1, 30, "the first request's pass")
        threads.append(threading.Thread(target=post, args=("second", 4)))
        threads[1].start()
        wait_until(lambda: runner.queued_inputs == 4, 30, "the second request to wait")
        runner.queue_max_inputs = 5
        full = client.post("/embed", json={"experiment_id": eid, "texts": texts[:2]})
        during = client.get("/metrics").text
    finally:
        runner.queue_max_inputs = cap
        held.release.set()
        for t in threads:
            t.join(60)
    assert full.status_code == 429, full.text
    assert int(full.headers["retry-after"]) >= 1
    assert full.json()["error"] == "queue_full" and "cap of 5" in full.json()["detail"]
    assert answers["first"].status_code == 200 and answers["second"].status_code == 200
    assert metric("corel_text_queue_inputs", during) == 4
    assert metric("corel_text_queue_requests", during) == 1
    assert metric('corel_text_refused_inputs_total{reason="queue_full"}') - metric(
        'corel_text_refused_inputs_total{reason="queue_full"}', before) == 2
    assert metric("corel_text_batch_inputs_count") - metric("corel_text_batch_inputs_count", before) == 2
    assert metric("corel_text_batch_inputs_sum") - metric("corel_text_batch_inputs_sum", before) == 5
    for name in ("corel_text_batch_tokens_sum", "corel_text_queued_seconds_count",
                 "corel_text_compute_seconds_sum"):
        assert metric(name) > metric(name, before)


def test_a_client_that_disconnects_is_dropped_from_the_queue(live_app, client, minilm):
    """Over a real connection (uvicorn): a request waiting behind a held pass, whose client
    closes its socket, leaves the queue and is never computed."""
    import socket
    import threading

    import httpx

    from app.api.state import state_of

    app, url = live_app
    runner = state_of(app).inference
    eid, texts = minilm["id"], minilm["texts"]
    headers = {"authorization": client.headers["authorization"]} if "authorization" in client.headers else {}
    assert httpx.post(f"{url}/embed", json={"experiment_id": eid, "texts": texts[:1]},
                      headers=headers, timeout=60).status_code == 200  # the model loaded
    passes = runner.forward_passes
    held = _Held(runner)
    answers = []
    first = threading.Thread(target=lambda: answers.append(httpx.post(
        f"{url}/embed", json={"experiment_id": eid, "texts": texts[:1]}, headers=headers, timeout=60)))
    try:
        first.start()
        wait_until(lambda: runner.forward_passes == passes + 1, 30, "the first request's pass")
        body = json.dumps({"experiment_id": eid, "texts": texts[:3]}).encode()
        host, port = url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: runner.queued_inputs == 3, 30, "the second request to wait")
        sock.close()
        wait_until(lambda: runner.queued_inputs == 0, 30, "the gone client's texts to leave")
    finally:
        held.release.set()
        first.join(60)
    assert answers[0].status_code == 200
    wait_until(lambda: not runner._draining, 30, "the queue to drain")
    assert runner.forward_passes == passes + 1  # the first's pass alone
    text = httpx.get(f"{url}/metrics", headers=headers).text
    assert 'corel_text_refused_inputs_total{reason="client_gone"} 3.0' in text


def test_a_text_over_the_byte_limit_is_413_naming_it(client, minilm):
    r = client.post("/embed", json={"experiment_id": minilm["id"],
                                    "texts": ["fine", "é" * (128 * 1024 + 1)]})
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == ("input 1: the text is 262,146 bytes of UTF-8; a text may have at "
                                  "most 262,144 (COREL_MAX_TEXT_BYTES)")
    r = client.post("/embed", json={"experiment_id": minilm["id"], "texts": []})
    assert r.status_code == 422 and "texts" in r.text


def test_a_text_model_s_load_readies_the_session_its_served_texts_run_on(client, minilm):
    """Loading a model on a frozen text encoder computes a text on the text passes' threads
    (api_text_threads), so its ONNX Runtime session (fp32 or int8) is made at the load, made
    for those threads, and not by the first request. Three threads: a count no other test
    serves on, so no earlier test made that session."""
    from types import SimpleNamespace

    from app.serving.inference import load_model
    from app.serving.model_cache import ModelCache
    from corel.encoders import text_transformers as tt

    app = client.app.state
    state = SimpleNamespace(settings=app.settings.model_copy(update={"api_text_threads": 3}),
                            sessionmaker=app.sessionmaker, model_cache=ModelCache(2))
    served = ServedModel.from_bytes(client.get(f"/experiments/{minilm['id']}/checkpoint").content)
    path = served.encoder.path
    kind = served.preprocessing["encoder"]["features_path"]["precision"]
    engine = tt.served_engine(path, kind)
    made = (str(path), f"onnx-{kind}-3")
    assert made not in tt._FAST
    loaded = load_model(state, minilm["id"])  # type: ignore[arg-type]
    assert loaded.experiment_id == minilm["id"]
    assert (made in tt._FAST) == (engine == "onnx"), (kind, engine)  # bf16: torch, no session
