"""Decompression bombs: a small PNG that declares far more pixels than it holds is refused with a
413 naming its size and the limit (COREL_MAX_IMAGE_PIXELS), before it is decoded, on every
route that opens an image; none answers a 500.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_image_bombs.py."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from tests.app.api.test_image_bombs import BIG, BOMB, _check, _png


@pytest.mark.parametrize("data", [BOMB, BIG], ids=["bomb", "big"])
def test_every_serving_route_answers_413_for_a_bomb(client, digits_runs, data):
    eid = digits_runs["cosine"]
    size = "20,000 x 20,000" if data is BOMB else "8,000 x 8,000"
    fine = base64.b64encode(_png(np.zeros((8, 8), np.uint8))).decode()
    bomb = base64.b64encode(data).decode()
    for route in ("/embed", "/predict"):
        r = client.post(route, json={"experiment_id": eid, "images": [fine, bomb]})
        _check(r, size)
        assert r.json()["detail"].startswith("input 1: "), r.text
        files = [("files", ("fine.png", base64.b64decode(fine), "image/png")),
                 ("files", ("bomb.png", data, "image/png"))]
        _check(client.post(f"{route}/files", data={"experiment_id": str(eid)}, files=files), size)
    _check(client.post(f"/experiments/{eid}/neighbors", json={"images": [bomb], "k": 3}), size)
    _check(client.post(f"/experiments/{eid}/neighbors/files",
                       files=[("files", ("bomb.png", data, "image/png"))]), size)
    # The same model still serves an image of its own size.
    ok = client.post("/predict", json={"experiment_id": eid, "images": [fine]})
    assert ok.status_code == 200, ok.text
