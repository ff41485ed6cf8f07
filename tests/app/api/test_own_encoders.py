"""POST /encoders: a user's own encoder (a zipped sentence-transformers folder, or timm
weights), checked before it is accepted, stored once per content, named by encoder_id in a
spec, trained on by a real worker and served; every bad upload a clear 4xx that stores
nothing."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.core.db import make_engine
from app.core.models import EncoderUpload
from app.storage import ensure, make_store
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
    from app.storage.local_copies import local_files

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
