"""POST /embed and /predict against a trained experiment in PostgreSQL."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from app.main import create_app
from corel.data import read_idx
from tests.app.conftest import finished, wait_for
from tests.app.conftest import stored_latent as read_latent
from tests.conftest import FASHION_DIR, SHARED_DATASETS, assert_rows_close, require


@pytest.fixture(scope="module")
def trained(client, worker, workers):
    r = client.post("/experiments", json={"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian",
                                          "lam": 0.85, "lr": 1e-3, "train_subset": 3000, "epochs": 2})
    body = wait_for(client, r.json()["id"], finished, workers=workers)
    assert body["status"] == "succeeded", body
    return body


@pytest.fixture(scope="module")
def test_images():
    return read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")  # (10000, 28, 28) uint8


@pytest.fixture(scope="module")
def stored_latent(settings, trained):
    return read_latent(settings, trained["id"], "test")


def binary(array: np.ndarray) -> dict:
    return {"dtype": "uint8" if array.dtype == np.uint8 else "float32", "shape": list(array.shape),
            "data": base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()}


def png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def test_embeddings_of_test_images_equal_the_stored_latent_space(client, trained, test_images,
                                                                  stored_latent):
    reps, _ = stored_latent
    r = client.post("/embed", json={"experiment_id": trained["id"], "binary": binary(test_images[:1024])})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["dim"] == 128 and body["n"] == 1024
    assert body["checkpoint"]["epoch"] == trained["best_epoch"] and len(body["checkpoint"]["sha256"]) == 64
    assert_rows_close(body["embeddings"], reps[:1024])


def test_input_forms_agree(client, trained, test_images):
    eid, few = trained["id"], test_images[:5]
    via_binary = client.post("/embed", json={"experiment_id": eid, "binary": binary(few),
                                             "output": "binary"}).json()["embeddings"]
    assert via_binary["dtype"] == "float32" and via_binary["shape"] == [5, 128]
    expected = np.frombuffer(base64.b64decode(via_binary["data"]), "<f4").reshape(5, 128)
    forms = {
        "arrays": {"arrays": few.tolist()},
        "float binary": {"binary": binary(few.astype(np.float32))},
        "png": {"images": [base64.b64encode(png(im)).decode() for im in few]},
    }
    for name, form in forms.items():
        got = np.array(client.post("/embed", json={"experiment_id": eid, **form}).json()["embeddings"])
        assert_rows_close(got, expected, err_msg=name)
    files = [("files", (f"{i}.png", png(im), "image/png")) for i, im in enumerate(few)]
    r = client.post("/embed", data={"experiment_id": str(eid)}, files=files)
    assert r.status_code == 200, r.text
    assert_rows_close(r.json()["embeddings"], expected)


def test_predict_agrees_with_argmax_and_the_stored_test_accuracy(client, trained, test_images,
                                                                 stored_latent):
    _, labels = stored_latent
    predicted, near_ties = [], 0
    for start in range(0, 10_000, 4096):
        r = client.post("/predict", json={"experiment_id": trained["id"],
                                          "binary": binary(test_images[start:start + 4096])})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["similarity"] == "gaussian" and len(body["class_names"]) == 10
        for p in body["predictions"]:
            sims = p["similarities"]
            assert len(sims) == 10 and p["class_index"] == int(np.argmax(sims))
            assert p["class_name"] == body["class_names"][p["class_index"]]
            assert all(s <= 0 for s in sims)  # -gamma |h - w|^2
            top = np.sort(sims)[-2:]
            near_ties += bool(top[1] - top[0] <= 1e-5 * np.abs(sims).max())
        predicted += [p["class_index"] for p in body["predictions"]]
    correct = int(np.sum(np.array(predicted) == labels))
    # The worker scored the same images in batches of 2,048; only an image whose top two
    # classes tie to rounding can be predicted otherwise here.
    assert abs(correct - round(trained["test_accuracy"] * len(labels))) <= near_ties


def test_models_are_cached(client, trained):
    cache = client.app.state.model_cache
    client.post("/embed", json={"experiment_id": trained["id"], "arrays": [[[0] * 28] * 28]})
    first = cache.peek(trained["id"])
    client.post("/embed", json={"experiment_id": trained["id"], "arrays": [[[0] * 28] * 28]})
    assert first is not None and cache.peek(trained["id"]) is first


@pytest.mark.parametrize(
    ("payload", "status", "words"),
    [
        ({"arrays": []}, 422, "arrays: List should have at least 1 item"),
        ({"texts": ["a shirt"]}, 422, "trained on image inputs (fashion-mnist); send images or arrays or binary"),
        ({"arrays": [[1, 2, 3]]}, 422, "images must have shape (N, 28, 28)"),
        ({"arrays": [[[0] * 28] * 28, [[0] * 27] * 28]}, 422, "input 1"),
        ({"arrays": [[[300] * 28] * 28]}, 422, "pixel values must lie in [0, 255]"),
        ({"images": ["aGVsbG8="]}, 422, "input 0: not a decodable PNG or JPEG"),
        ({"images": ["%%%"]}, 422, "input 0 is not valid base64"),
        ({"binary": {"dtype": "uint8", "shape": [2, 28, 28], "data": "AAAA"}}, 422, "needs 1568"),
        ({"binary": {"dtype": "int64", "shape": [1], "data": ""}}, 422, "binary.dtype"),
        ({"texts": None, "arrays": [[0.0]]}, 422, "texts is null: give its inputs, or leave"),
        ({}, 422, "send exactly one of images, texts, arrays, rows or binary"),
        ({"arrays": [[[0] * 28] * 28], "texts": ["x"]}, 422, "got texts, arrays"),
        ({"arrays": [[[float("nan")] * 28] * 28]}, 422, None),
    ],
)
def test_bad_inputs_are_4xx_with_the_problem(client, trained, payload, status, words):
    import json as _json

    body = _json.dumps({"experiment_id": trained["id"], **payload}).replace("NaN", "NaN")
    r = client.post("/embed", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    if words:
        assert words in r.json()["detail"], r.json()
    # Pillow's own words named the buffer it read: "<_io.BytesIO object at 0x7f...>".
    assert " at 0x" not in r.json()["detail"], r.json()


def test_batch_limit_is_413(settings, trained, test_images):
    small = settings.model_copy(update={"max_embed_batch": 4})
    with TestClient(create_app(small)) as c:
        r = c.post("/embed", json={"experiment_id": trained["id"], "binary": binary(test_images[:5])})
    assert r.status_code == 413 and "at most 4 inputs" in r.json()["detail"]


def test_text_model_embeds_raw_strings(client, worker, workers):
    require((SHARED_DATASETS / "ag_news" / "test.csv").exists(), "AG News test split")
    rows = (SHARED_DATASETS / "ag_news" / "test.csv").read_bytes().splitlines()[:600]
    ds = client.post("/datasets", files={"file": ("news.csv", b"\n".join(rows))}).json()
    r = client.post("/experiments", json={"dataset": "ag-news", "dataset_id": ds["id"], "epochs": 3,
                                          "lr": 3e-3, "loss": "cosine", "lam": 0.8})
    body = wait_for(client, r.json()["id"], finished, workers=workers)
    assert body["status"] == "succeeded", body
    texts = ["Stocks fell sharply as oil prices rose", "The home team won the final in overtime"]
    r = client.post("/predict", json={"experiment_id": body["id"], "texts": texts})
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert len(preds) == 2 and all(-1 <= s <= 1 for p in preds for s in p["similarities"])
    one = client.post("/embed", json={"experiment_id": body["id"], "texts": texts[:1]}).json()
    both = client.post("/embed", json={"experiment_id": body["id"], "texts": texts}).json()
    assert_rows_close(one["embeddings"][0], both["embeddings"][0])
    files = [("files", ("a.txt", texts[0].encode(), "text/plain")),
             ("files", ("b.txt", b"caf\xe9 \xff", "text/plain"))]
    r = client.post("/embed", data={"experiment_id": str(body["id"])}, files=files)
    assert r.status_code == 422 and "input 1: text is not valid UTF-8" in r.json()["detail"]
    r = client.post("/embed", json={"experiment_id": body["id"], "arrays": [[0.0] * 50]})
    assert r.status_code == 422 and "send texts" in r.json()["detail"]

    # A CSV of new texts, as a feature model takes a CSV of its rows (it was refused: "send
    # texts, not rows"): the same predictions, each named by its row.
    table = "label,text\n" + "".join(f'?,"{t}"\n' for t in texts)
    files = [("files", ("new.csv", table.encode(), "text/csv"))]
    r = client.post("/predict", data={"experiment_id": str(body["id"])}, files=files)
    assert r.status_code == 200, r.text
    assert [p["input"] for p in r.json()["predictions"]] == ["new.csv, row 1", "new.csv, row 2"]
    assert [p["class_index"] for p in r.json()["predictions"]] == [p["class_index"] for p in preds]
    r = client.post("/predict", data={"experiment_id": str(body["id"])},
                    files=[("files", ("two.csv", b"a,b\nx,y\n", "text/csv"))])
    assert r.status_code == 422 and "cannot tell which column holds the texts" in r.json()["detail"]

    # An empty text, or one of no known word, was predicted as confidently as any: now with a
    # warning; a text the model can read has none.
    r = client.post("/predict", json={"experiment_id": body["id"], "texts": [texts[0], "", "zqxjv wqpzk"]})
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    assert "warning" not in preds[0]
    assert "the text holds no words" in preds[1]["warning"], preds[1]
    assert "none of its 2 words is in the model's vocabulary" in preds[2]["warning"], preds[2]


def test_octet_stream_bodies_in_and_out(client, trained, test_images, stored_latent):
    reps, _ = stored_latent
    batch = np.ascontiguousarray(test_images[:64])
    params = {"experiment_id": trained["id"], "dtype": "uint8", "shape": "64,28,28"}
    r = client.post("/embed", params=params, content=batch.tobytes(),
                    headers={"content-type": "application/octet-stream",
                             "accept": "application/octet-stream"})
    assert r.status_code == 200, r.text
    assert r.headers["x-corel-shape"] == "64,128" and r.headers["x-corel-dtype"] == "float32"
    got = np.frombuffer(r.content, "<f4").reshape(64, 128)
    assert_rows_close(got, reps[:64])
    # The same body answered as JSON, and through /predict.
    r = client.post("/embed", params=params, content=batch.tobytes(),
                    headers={"content-type": "application/octet-stream"})
    np.testing.assert_allclose(np.array(r.json()["embeddings"], np.float32), got, rtol=1e-6)
    r = client.post("/predict", params=params, content=batch.tobytes(),
                    headers={"content-type": "application/octet-stream"})
    assert len(r.json()["predictions"]) == 64
    bad = client.post("/embed", params={**params, "shape": "65,28,28"}, content=batch.tobytes(),
                      headers={"content-type": "application/octet-stream"})
    assert bad.status_code == 422 and "needs 50960" in bad.json()["detail"]
    bad = client.post("/embed", params={"experiment_id": trained["id"]}, content=batch.tobytes(),
                      headers={"content-type": "application/octet-stream"})
    assert bad.status_code == 422 and "query parameters" in bad.json()["detail"]


def test_concurrent_small_requests_share_a_forward_pass_and_get_their_own_rows(settings, trained,
                                                                               test_images):
    """32 single-image requests arriving together: one forward pass, and each request gets
    the rows of its own image (embed) or its own similarities (predict), in order."""
    import asyncio

    from app.core.db import make_engine, make_sessionmaker, session_scope
    from app.core.schemas.inference import InferenceRequest
    from app.serving.inference import InferenceRunner, forward, model_inputs
    from app.serving.model_cache import load_from_database
    from app.storage import ensure

    engine = make_engine(settings.db_url)
    with session_scope(ensure(make_sessionmaker(engine), settings)) as session:
        loaded = load_from_database(session, trained["id"], "cpu")
    engine.dispose()
    requests = [InferenceRequest.model_validate({"experiment_id": trained["id"],
                                                 "binary": binary(test_images[i:i + 1 + i % 3])})
                for i in range(32)]
    runner = InferenceRunner(threads=2)

    async def together():
        return await asyncio.gather(*(runner.run(r, loaded, similarities=i % 2 == 1)
                                      for i, r in enumerate(requests)))

    try:
        results = asyncio.run(together())
    finally:
        runner.close()
    assert runner.forward_passes == 1
    for i, (req, (h, sims)) in enumerate(zip(requests, results, strict=True)):
        alone_h, alone_sims = forward(loaded, model_inputs(req, loaded), similarities=True)
        assert h.shape == (1 + i % 3, 128)
        assert_rows_close(h.numpy(), alone_h.numpy())
        if i % 2:
            assert_rows_close(sims.numpy(), alone_sims.numpy())
        else:
            assert sims is None


def test_large_batch_errors_name_the_whole_batch(client, trained, test_images):
    """A large batch is prepared in slices; a complaint still describes the request."""
    bad = test_images[:600, :, :27]
    r = client.post("/embed", json={"experiment_id": trained["id"], "binary": binary(bad)})
    assert r.status_code == 422 and "got (600, 1, 28, 27)" in r.json()["detail"], r.json()
    over = test_images[:600].astype(np.float32)
    over[599, 0, 0] = 300.0
    r = client.post("/embed", json={"experiment_id": trained["id"], "binary": binary(over)})
    assert r.status_code == 422 and "pixel values must lie in [0, 255]" in r.json()["detail"]
