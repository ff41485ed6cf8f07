"""Image folders through POST /datasets: a .zip (RGB, mixed sizes) and a .tar.gz (grey) of
class_name/*.png, trained by a real worker with the CNN and the FFNN, then served by /embed and
/predict; and bad archives, refused with a 422 naming the problem.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_image_folders.py."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from tests.app.api import test_image_folders as shared
from tests.app.api.test_image_folders import (
    CLASSES,
    FAST,
    _members,
    _picture,
    _png,
    _targz,
    _upload,
)
from tests.app.conftest import finished, wait_for

# Fixtures shared with the tests in tests/app/api/test_image_folders.py (pytest finds a fixture by its name here).
rgb_upload = shared.rgb_upload


@pytest.mark.parametrize("model", ["cnn", "ffnn"])
def test_an_image_folder_trains_and_serves_new_images(client, worker, rgb_upload, model):
    eid = client.post("/experiments", json={"dataset": "images", "dataset_id": rgb_upload["id"],
                                            "model": model, **FAST}).json()["id"]
    body = wait_for(client, eid, finished)
    assert body["status"] == "succeeded", body
    rng = np.random.default_rng(123)
    fresh = [(kind, _picture(kind, rng, (40, 48), grey=False)) for kind in CLASSES for _ in range(3)]
    images = [base64.b64encode(_png(img)).decode() for _, img in fresh]
    predicted = client.post("/predict", json={"experiment_id": eid, "images": images})
    assert predicted.status_code == 200, predicted.text
    got = [p["class_name"] for p in predicted.json()["predictions"]]
    assert sum(g == kind for g, (kind, _) in zip(got, fresh, strict=True)) >= 7, got
    embedded = client.post("/embed", json={"experiment_id": eid, "images": images[:2]}).json()
    assert embedded["n"] == 2 and embedded["dim"] == 128
    # Each neighbour links its image: the upload's row, as stored.
    stored = np.load(io.BytesIO(client.get(f"/datasets/{rgb_upload['id']}/file").content))
    found = client.post(f"/experiments/{eid}/neighbors", json={"images": images[:1], "k": 3}).json()
    for n in found["results"][0]["neighbors"]:
        assert n["image_url"] == f"/datasets/{rgb_upload['id']}/rows/{n['id']}/image"
        assert n["label"] == int(stored["y"][n["id"]])
        png = Image.open(io.BytesIO(client.get(n["image_url"]).content))
        np.testing.assert_array_equal(np.asarray(png), np.moveaxis(stored["x"][n["id"]], 0, -1))


def test_a_grey_tar_gz_has_one_channel(client, worker):
    r = _upload(client, "shapes.tar.gz", _targz(_members(grey=True, per_class=5)))
    assert r.status_code == 201, r.text
    assert r.json()["summary"]["channels"] == 1
