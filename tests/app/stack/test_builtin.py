"""Built-in datasets from a fresh clone: the service says which are here (GET /datasets/builtin),
refuses at submission a spec naming one that is not (it used to accept it and fail in the
worker with "MNIST not found ... in:" and an empty list), and trains MNIST and AG News from
../shared/datasets, as `make serve` and the tests set it.

This file holds those of its tests that belong in the stack tier (the session's worker); the
others, and the helpers they share, are in tests/app/api/test_builtin.py."""

from __future__ import annotations

import csv
import io

import numpy as np
from PIL import Image

from corel.data import read_idx
from tests.app.api.test_builtin import MNIST, _items
from tests.app.conftest import finished, wait_for


def test_mnist_and_ag_news_train_from_the_shared_datasets(client, worker, shared_datasets):
    items = _items(client)
    assert all(d["status"] == "present" for d in items.values()), items
    assert items["mnist"]["where"].startswith(str(shared_datasets))
    ids = [client.post("/experiments", json={"dataset": dataset, "epochs": 1, "lr": 1e-3,
                                             "train_subset": 600, "batch_size": 64}).json()["id"]
           for dataset in ("mnist", "ag-news")]
    for experiment_id in ids:
        body = wait_for(client, experiment_id, finished, timeout=300)
        assert body["status"] == "succeeded", body
    # Their neighbours are named by their rows of the files trained on: MNIST's training
    # images (an image link), AG News's CSV (the text).
    mnist = read_idx(shared_datasets / "mnist" / MNIST[0])
    found = client.post(f"/experiments/{ids[0]}/neighbors", json={"arrays": mnist[:1].tolist(), "k": 3}).json()
    for n in found["results"][0]["neighbors"]:
        png = client.get(n["image_url"])
        assert n["image_url"] == f"/datasets/builtin/mnist/rows/{n['id']}/image" and png.status_code == 200
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png.content))), mnist[n["id"]])
    with open(shared_datasets / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        news = [f"{r[1]} {r[2]}" for r in csv.reader(fh)]
    found = client.post(f"/experiments/{ids[1]}/neighbors", json={"texts": news[:1], "k": 3}).json()
    assert found["source"] == {"dataset": "ag-news"}
    assert all(n["text"] == news[n["id"]] for n in found["results"][0]["neighbors"])
