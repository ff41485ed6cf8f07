"""Uploads: validated on arrival, stored, and trainable by a real worker.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_datasets.py."""

from __future__ import annotations

import numpy as np

from tests.app.api.test_datasets import blobs
from tests.app.conftest import finished, npz_bytes, wait_for


def test_upload_npz_and_train_on_it(client, worker, workers):
    x, y = blobs()
    data = npz_bytes(x=x, y=y, class_names=np.array(["red", "green", "blue"]))
    r = client.post("/datasets", files={"file": ("blobs.npz", data)})
    assert r.status_code == 201, r.text
    ds = r.json()
    assert ds["kind"] == "npz" and ds["size"] == len(data)
    assert ds["summary"]["n"] == 600 and ds["summary"]["num_classes"] == 3
    assert client.get(f"/datasets/{ds['id']}").json()["sha256"] == ds["sha256"]

    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": ds["id"], "epochs": 5,
                                          "lr": 3e-3, "loss": "cosine", "lam": 0.7})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished, workers=workers)
    assert body["status"] == "succeeded", body
    assert body["test_accuracy"] > 0.9  # well-separated blobs
