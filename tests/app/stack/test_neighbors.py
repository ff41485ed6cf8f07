"""POST /experiments/{id}/neighbors on runs a real worker trained: the inputs go through
/embed's pipeline, and their neighbours are the brute-force nearest of their /embed rows
among the stored training rows, in the loss's geometry; every input form works; bad
requests are clear 4xx."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from tests.app.conftest import DIGITS_SPEC as SPEC
from tests.app.conftest import stored_latent


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_digits().images[-12:].astype(np.float32)  # raw 8 x 8, 0..16


@pytest.mark.parametrize(("loss", "geometry"), [("cosine", "cosine"), ("gaussian", "euclidean")])
def test_neighbours_are_the_brute_force_nearest_of_the_embed_rows(client, settings, digits_runs, images,
                                                                   loss, geometry):
    eid = digits_runs[loss]
    r = client.post(f"/experiments/{eid}/neighbors", json={"arrays": images.tolist(), "k": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["geometry"] == geometry and body["k"] == 7 and len(body["results"]) == len(images)
    h = np.asarray(client.post("/embed", json={"experiment_id": eid, "arrays": images.tolist()})
                   .json()["embeddings"], np.float64)
    reference, labels = stored_latent(settings, eid, "train")
    ref = reference.astype(np.float64)
    if geometry == "cosine":
        d = 1 - (h / np.linalg.norm(h, axis=1, keepdims=True)) @ (
            ref / np.linalg.norm(ref, axis=1, keepdims=True)).T
    else:
        d = np.sqrt(((h[:, None, :] - ref[None, :, :]) ** 2).sum(-1))
    predicted = client.post("/predict", json={"experiment_id": eid, "arrays": images.tolist()}).json()
    for i, result in enumerate(body["results"]):
        want = np.argsort(d[i], kind="stable")[:7]
        got = [n["row"] for n in result["neighbors"]]
        assert set(got) == set(want.tolist()), (i, got, want)  # ties may swap places
        np.testing.assert_allclose([n["distance"] for n in result["neighbors"]], np.sort(d[i])[:7],
                                   atol=1e-4)
        assert all(n["label"] == labels[n["row"]] and n["class_name"] == str(n["label"])
                   for n in result["neighbors"])
        votes = [n["label"] for n in result["neighbors"]]
        assert votes.count(result["knn_prediction"]["class_index"]) == max(votes.count(v) for v in votes)
        assert result["prediction"]["class_name"] == predicted["predictions"][i]["class_name"]
    hits = sum(r["knn_prediction"]["class_index"] == t for r, t in
               zip(body["results"], load_digits().target[-12:], strict=True))
    assert hits >= 9, hits  # a trained representation retrieves by class


def test_each_neighbour_is_named_by_its_id_and_links_its_image(client, digits_runs, images):
    """It answered row numbers of the stored training split alone; a search user wants the
    neighbours themselves. The id is the neighbour's row in scikit-learn's digits: its pixels
    there embed at the distance given, and its image link answers those pixels."""
    eid = digits_runs["gaussian"]
    body = client.post(f"/experiments/{eid}/neighbors", json={"arrays": images[:3].tolist(), "k": 5}).json()
    assert body["source"] == {"dataset": "digits"}
    d = load_digits()
    h = np.asarray(client.post("/embed", json={"experiment_id": eid, "arrays": images[:3].tolist()})
                   .json()["embeddings"], np.float64)
    for i, result in enumerate(body["results"]):
        ids = [n["id"] for n in result["neighbors"]]
        assert len(set(ids)) == 5 and all(isinstance(p, int) and 0 <= p < len(d.target) for p in ids)
        assert [n["label"] for n in result["neighbors"]] == d.target[ids].tolist()
        theirs = np.asarray(client.post("/embed", json={
            "experiment_id": eid, "arrays": d.images[ids].astype(np.float32).tolist()}).json()["embeddings"])
        np.testing.assert_allclose([n["distance"] for n in result["neighbors"]],
                                   np.linalg.norm(theirs - h[i], axis=1), atol=1e-3)
        assert all(n["image_url"] == f"/datasets/builtin/digits/rows/{n['id']}/image"
                   for n in result["neighbors"])
    first = body["results"][0]["neighbors"][0]
    png = client.get(first["image_url"])
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    pixels = np.asarray(Image.open(io.BytesIO(png.content)))
    np.testing.assert_array_equal(pixels, np.rint(d.images[first["id"]] * 255 / 16).astype(np.uint8))
    # A training row searched for is found as itself.
    again = client.post(f"/experiments/{eid}/neighbors", json={
        "arrays": d.images[[first["id"]]].astype(np.float32).tolist(), "k": 1}).json()
    assert again["results"][0]["neighbors"][0]["id"] == first["id"]
    r = client.get(f"/datasets/builtin/digits/rows/{len(d.target)}/image")
    assert r.status_code == 404 and r.json()["detail"] == (
        f"row {len(d.target)} does not exist: digits has {len(d.target)} rows (0 to {len(d.target) - 1})")


def test_every_input_form_and_the_file_names(client, digits_runs, images):
    eid = digits_runs["gaussian"]
    json_body = client.post(f"/experiments/{eid}/neighbors", json={"arrays": images[:2].tolist(), "k": 3}).json()
    raw = client.post(f"/experiments/{eid}/neighbors",
                      params={"dtype": "float32", "shape": "2,8,8", "k": "3"},
                      content=np.ascontiguousarray(images[:2]).tobytes(),
                      headers={"content-type": "application/octet-stream"}).json()
    assert [r["neighbors"] for r in raw["results"]] == [r["neighbors"] for r in json_body["results"]]
    files = []
    for i in range(2):
        buf = io.BytesIO()
        Image.fromarray((images[i] * 255 / 16).round().astype(np.uint8)).save(buf, format="PNG")
        files.append(("files", (f"digit-{i}.png", buf.getvalue(), "image/png")))
    multi = client.post(f"/experiments/{eid}/neighbors", data={"k": "3"}, files=files)
    assert multi.status_code == 200, multi.text
    assert [r["input"] for r in multi.json()["results"]] == ["digit-0.png", "digit-1.png"]
    assert all(len(r["neighbors"]) == 3 for r in multi.json()["results"])


def test_bad_neighbour_requests(client, digits_runs, images):
    eid = digits_runs["cosine"]
    one = images[:1].tolist()
    for body, status, words in (
        ({"arrays": one, "k": 0}, 422, "k: Input should be greater than or equal to 1"),
        ({"arrays": one, "k": 100000}, 422, "k: Input should be less than or equal to 1000"),
        ({"arrays": [[1.0, 2.0]]}, 422, "images must have shape"),
        ({"arrays": one, "experiment_id": eid + 1000}, 422, "differs from the path's experiment"),
    ):
        r = client.post(f"/experiments/{eid}/neighbors", json=body)
        assert r.status_code == status and words in r.json()["detail"], (body, r.text)
    n = client.post(f"/experiments/{eid}/neighbors", json={"arrays": one, "k": 1}).json()["n_reference"]
    if n < 1000:
        r = client.post(f"/experiments/{eid}/neighbors", json={"arrays": one, "k": n + 1})
        assert r.status_code == 422 and f"k must be at most {n}" in r.json()["detail"]
    r = client.post("/experiments/987654/neighbors", json={"arrays": one})
    assert r.status_code == 404
    queued = client.post("/experiments", json={**SPEC, "epochs": 500}).json()["id"]
    r = client.post(f"/experiments/{queued}/neighbors", json={"arrays": one})
    assert r.status_code == 409 and "succeeded" in r.json()["detail"]
    client.post(f"/experiments/{queued}/cancel")
