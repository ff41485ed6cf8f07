"""POST /encoders: a user's own encoder (a zipped sentence-transformers folder, or timm
weights), checked before it is accepted, stored once per content, named by encoder_id in a
spec, trained on by a real worker and served; every bad upload a clear 4xx that stores
nothing."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from app.core.db import make_engine
from app.core.models import EncoderUpload
from app.storage import ensure, make_store
from tests.app.conftest import finished, own_stack, wait_for
from tests.encoder_files import TOPICS, timm_weights, tiny_sentence_transformer, zipped


@pytest.fixture(scope="module")
def st_zip(tmp_path_factory) -> bytes:
    tmp = tmp_path_factory.mktemp("own-st")
    folder = tiny_sentence_transformer(tmp / "my-model")
    return zipped(folder, tmp / "my-model.zip", top="my-model").read_bytes()


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> bytes:
    return timm_weights(tmp_path_factory.mktemp("own-timm") / "w.safetensors").read_bytes()


def _counts(settings) -> tuple[int, int]:
    """(encoder rows, distinct files they name), each file checked to be in the store."""
    engine = make_engine(settings.db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(func.count()).select_from(EncoderUpload)).scalar_one()
            files = set(conn.execute(select(EncoderUpload.sha256)).scalars())
    finally:
        engine.dispose()
    store = make_store(settings)
    assert all(store.exists(sha) for sha in files)
    return rows, len(files)


def _text_table(client) -> int:
    texts, y = [], []
    for k, sentences in enumerate(TOPICS.values()):
        for i in range(40):
            texts.append(f"{sentences[i % 4]} ({i})")
            y.append(k)
    lines = ["text,topic"] + [f"{t},{list(TOPICS)[k]}" for t, k in zip(texts, y, strict=True)]
    r = client.post("/datasets", files={"file": ("topics.csv", "\n".join(lines).encode())},
                    data={"kind": "text"})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


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


def _bad_zip(**members: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize(("files", "data", "status", "words"), [
    ({"file": ("w.safetensors", "weights")}, {}, 422, "architecture: name the timm architecture"),
    ({"file": ("w.safetensors", "weights")}, {"architecture": "no_such_net"}, 422,
     "timm has no architecture 'no_such_net'"),
    ({"file": ("w.safetensors", "other-weights")}, {"architecture": "test_efficientnet"}, 422,
     "missing keys: blocks.0.0.bn1.bias"),
    ({"file": ("w.pt", b"\x00corrupt" * 100)}, {"architecture": "test_efficientnet"}, 422,
     "neither a safetensors file nor a PyTorch state dict"),
    ({"file": ("m.zip", b"PK not really a zip")}, {}, 422, "not a .zip archive"),
    ({"file": ("m.zip", "no-modules")}, {}, 422, "no modules.json"),
    ({"file": ("m.zip", "escape")}, {}, 422, "lies outside its folder"),
    ({"file": ("model.onnx", b"x")}, {}, 422, "cannot tell the kind of 'model.onnx'"),
    ({"file": ("m.zip", "st")}, {"architecture": "resnet18"}, 422, "architecture applies to kind timm"),
])
def test_a_bad_encoder_upload_is_a_clear_4xx_and_stores_nothing(client, settings, weights, st_zip, tmp_path,
                                                                 files, data, status, words):
    made = {
        "weights": weights,
        "other-weights": timm_weights(tmp_path / "r.safetensors", arch="test_resnet").read_bytes(),
        "no-modules": _bad_zip(**{"config.json": b"{}"}),
        "escape": _bad_zip(**{"../../evil.txt": b"x", "modules.json": b"[]"}),
        "st": st_zip,
    }
    name, content = files["file"]
    files = {"file": (name, made.get(content, content) if isinstance(content, str) else content)}
    before = _counts(settings)
    r = client.post("/encoders", files=files, data=data)
    assert r.status_code == status and words in r.json()["detail"], r.text
    assert _counts(settings) == before


def test_an_encoder_too_large_is_a_413_and_a_zip_bomb_too(settings, weights):
    from fastapi.testclient import TestClient

    from app.main import create_app

    small = settings.model_copy(update={"max_encoder_bytes": 200_000})
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("modules.json", b"[]")
        z.writestr("zeros.bin", b"\0" * 1_000_000)  # unpacks to over 4 x 200,000 bytes
    assert len(bomb.getvalue()) < 200_000 < len(weights)
    before = _counts(settings)
    with TestClient(create_app(small)) as c:
        r = c.post("/encoders", files={"file": ("w.safetensors", weights)},
                   data={"architecture": "test_efficientnet"})
        assert r.status_code == 413 and "limited to" in r.text, r.text
        r = c.post("/encoders", files={"file": ("bomb.zip", bomb.getvalue())})
        assert r.status_code == 413 and "unpacks to" in r.text, r.text
    assert _counts(settings) == before


@pytest.mark.parametrize(("spec", "status", "words"), [
    ({"dataset": "ag-news", "encoder_id": 999999}, 404, "encoder_id 999999 does not exist"),
    ({"dataset": "ag-news", "encoder_id": 1, "encoder": "minilm"}, 422, "installed with corel"),
    ({"dataset": "ag-news", "encoder": "sentence-transformers"}, 422, "upload it with POST /encoders"),
    ({"dataset": "digits", "encoder": "timm:resnet18"}, 422, "upload it with POST /encoders"),
    ({"dataset": "ag-news", "encoder": "minilm", "encoder_path": "/tmp/x"}, 422,
     "encoder_path is not accepted over HTTP"),
])
def test_a_spec_naming_an_own_encoder_wrongly_is_refused(client, spec, status, words):
    r = client.post("/experiments", json={**spec, "epochs": 1})
    assert r.status_code == status and words in r.text, r.text


def test_the_encoder_files_are_written_once_per_machine(client, settings, weights, tmp_path):
    """A worker's or an API process's copy: written whole (never half a file), then reused."""
    from app.core.db import make_sessionmaker
    from app.services.encoders import local_files

    r = client.post("/encoders", files={"file": ("w.safetensors", weights)},
                    data={"architecture": "test_efficientnet"})
    assert r.status_code == 201, r.text
    engine = make_engine(settings.db_url)
    try:
        # Another machine's cache (its own var_dir) over the service's store.
        with ensure(make_sessionmaker(engine), settings)() as session:
            row = session.get(EncoderUpload, r.json()["id"])
            assert row is not None
            own = settings.model_copy(update={"var_dir": tmp_path})
            path = local_files(session, own, row)
            assert path.read_bytes() == weights and path.parent == (tmp_path / "cache" / "encoders").resolve()
            stamp = path.stat().st_mtime_ns
            assert local_files(session, own, row) == path and path.stat().st_mtime_ns == stamp
            assert [p.name for p in Path(path.parent).iterdir()] == [path.name]  # no temporaries left
    finally:
        engine.dispose()


def test_a_run_on_an_uploaded_encoder_resumes_on_a_worker_with_another_data_directory(
        settings, workers, st_zip, tmp_path):
    """Each worker keeps an uploaded encoder's files in its own data directory, so the spec
    a resumed run rebuilds names other files than its checkpoint's: where they lie is not
    what they hold (the content digest is), and the run resumes from its checkpoint."""
    # A queue of its own: no other worker (the session's data directory) may take it.
    with own_stack(settings, tmp_path / "var") as (own, client):
        encoder = client.post("/encoders", files={"file": ("my-model.zip", st_zip)}).json()["id"]
        spec = {"dataset": "text", "dataset_id": _text_table(client), "encoder_id": encoder,
                "encoder_mode": "finetune", "loss": "cosine", "lam": 0.85, "epochs": 40, "lr": 0.01,
                "encoder_lr": 0.001, "batch_size": 8, "hidden": 16, "seed": 3}
        # Two hosts of their own: each its data directory, both the service's artifact store.
        host = {name: own.model_copy(update={"var_dir": tmp_path / name, "artifacts_dir": own.artifact_dir})
                for name in ("a", "b")}
        first = workers.start(host["a"])
        eid = client.post("/experiments", json=spec).json()["id"]
        wait_for(client, eid, lambda b: b["current_epoch"] >= 2, workers=workers, timeout=180)
        workers.kill(first)
        killed_at = client.get(f"/experiments/{eid}").json()
        assert killed_at["status"] == "running" and killed_at["current_epoch"] < 40
        second = workers.start(host["b"])
        try:
            body = wait_for(client, eid, finished, workers=workers, timeout=300)
            assert body["status"] == "succeeded", body.get("error")
            assert body["attempts"] == 2
            epochs = [m["epoch"] for m in client.get(f"/experiments/{eid}/metrics").json()["items"]]
            assert epochs == list(range(1, 41))  # resumed from its checkpoint: none lost, none twice
            assert {p.name for p in (tmp_path / "b" / "cache" / "encoders").iterdir()} and \
                {p.name for p in (tmp_path / "a" / "cache" / "encoders").iterdir()}  # each host its own copy
        finally:
            workers.kill(second)


def test_a_fine_tuned_run_that_cannot_train_is_refused_at_submission_and_nothing_is_stored(client, st_zip):
    encoder = client.post("/encoders", files={"file": ("my-model.zip", st_zip)}).json()["id"]
    dataset_id = _text_table(client)  # 120 rows: 84 for training
    base = {"dataset": "text", "dataset_id": dataset_id, "encoder_id": encoder, "encoder_mode": "finetune",
            "loss": "cosine", "epochs": 1, "batch_size": 8, "hidden": 16}
    before = client.get("/experiments", params={"limit": 1}).json()["total"]
    for fields, words in [
        ({"trainable_blocks": 3}, f"trainable_blocks is 3; encoder_id {encoder} (sentence-transformers) has 2 blocks"),
        ({"batch_size": 85}, "this dataset gives 84 training rows, batch_size is 85; lower batch_size to at most 84"),
        ({"train_subset": 6}, "train_subset is 6, batch_size 8"),
        ({"encoder_mode": "frozen", "warmup": 0.2}, "warmup applies to encoder_mode finetune; this encoder is frozen"),
    ]:
        r = client.post("/experiments", json={**base, **fields})
        assert r.status_code == 422 and words in r.text, (fields, r.text)
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == before
    fits = client.post("/experiments", json={**base, "batch_size": 84, "epochs": 1})
    assert fits.status_code == 202, fits.text
