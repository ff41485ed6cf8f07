"""Issue 71: a few-shot sweep over HTTP (no worker: its members stay queued). The protocol's
members, their specs, and each bad request's 422."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from corel.data import load_dataset
from corel.fewshot import HeadSettings, draw_splits
from corel.spec import ExperimentSpec

BASE = {"dataset": "digits"}


@pytest.fixture(scope="module")
def idle(settings):
    with TestClient(create_app(settings.model_copy(update={"queue": "corel-nobody-listens"}))) as c:
        yield c


def _pool(seed: int = 0) -> tuple[str, int]:
    """The smallest class's pool on digits, as the protocol cuts it (the library directly)."""
    data = load_dataset(ExperimentSpec(dataset="digits"))
    y = np.concatenate([data.y_train.numpy(), data.y_val.numpy()])
    cut = draw_splits(y, [1], 1, seed, data.class_names)
    pool = y[cut.pool]
    sizes = {k: int((pool == k).sum()) for k in np.unique(y)}
    k = min(sizes, key=lambda c: sizes[c])
    return data.class_names[k], sizes[k]


def test_a_fewshot_sweep_queues_every_method_at_every_n_and_draw(idle):
    body = {"base": BASE, "grid": {"loss": ["cosine", "arcface"]},
            "fewshot": {"shots": [2, 5], "splits": 3, "seed": 4}}
    r = idle.post("/sweeps", json=body)
    assert r.status_code == 202, r.text
    sweep = idle.get(f"/sweeps/{r.json()['id']}").json()
    assert sweep["size"] == 2 * 2 * 3 and sweep["fewshot"] == {"shots": [2, 5], "splits": 3, "seed": 4,
                                                         "unlabeled": False}
    head = HeadSettings()
    seen = set()
    for eid in sweep["experiment_ids"]:
        spec = idle.get(f"/experiments/{eid}").json()["spec"]
        draw = spec["fewshot"]
        seen.add((spec["loss"], draw["shots"], draw["split"]))
        assert draw["seed"] == 4 and spec["seed"] == 4 * 1000 + draw["split"] and draw["l2"] == head.l2 > 0
        assert (spec["epochs"], spec["lr"], spec["batch_size"]) == (head.steps, head.lr, 65_536)
    assert seen == {(loss, n, k) for loss in ("cosine", "arcface") for n in (2, 5) for k in range(3)}
    report = idle.get(f"/sweeps/{sweep['id']}/report").json()["fewshot"]
    assert report["draws"] == {"2": 0, "5": 0} and report["summary"] == []
    idle.post(f"/sweeps/{sweep['id']}/cancel")


def test_n_larger_than_a_class_s_pool_is_a_422_naming_the_class_and_its_size(idle):
    name, size = _pool(seed=0)
    r = idle.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cosine"]},
                                   "fewshot": {"shots": [2, size + 1], "splits": 2}})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert f"class {name!r} has {size} rows in the pool" in detail and f"at most {size} shots" in detail
    # At the pool's size it is accepted.
    r = idle.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cosine"]},
                                   "fewshot": {"shots": [size], "splits": 1}})
    assert r.status_code == 202, r.text
    idle.post(f"/sweeps/{r.json()['id']}/cancel")


@pytest.mark.parametrize(("fewshot", "grid", "base", "words"), [
    ({"splits": 0}, {"loss": ["cce"]}, {}, "splits"),
    ({"splits": 101}, {"loss": ["cce"]}, {}, "splits"),
    ({"shots": [0, 8]}, {"loss": ["cce"]}, {}, "shots must be numbers of examples per class from 1"),
    ({"shots": [8, 8]}, {"loss": ["cce"]}, {}, "shots must not repeat a number"),
    ({"shots": []}, {"loss": ["cce"]}, {}, "shots"),
    ({}, {"loss": ["cce"], "seed": [0, 1]}, {}, "grid field 'seed' is set by the few-shot protocol"),
    ({}, {"loss": ["cce"]}, {"epochs": 5}, "base field 'epochs' is set by the few-shot protocol"),
    ({}, {"loss": ["cce"]}, {"train_subset": 50}, "base field 'train_subset' is set by the few-shot protocol"),
    ({}, {"loss": ["cce"]}, {"seed": 3}, "base field 'seed' is set by the few-shot protocol"),
    ({"shots": [2], "splits": 2}, {"loss": ["cce"] * 1, "lam": [0.5] * 1}, {"loss": "cosine", "budget": "quick"},
     "base field 'budget' is set by the few-shot protocol"),
])
def test_bad_fewshot_sweeps_are_422(idle, fewshot, grid, base, words):
    r = idle.post("/sweeps", json={"base": {**BASE, **base}, "grid": grid, "fewshot": fewshot})
    assert r.status_code == 422, r.text
    assert words in str(r.json()["detail"])


def test_a_fewshot_sweep_is_not_pruned_and_has_a_size_limit(idle, settings):
    r = idle.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cosine"], "lam": [0.5, 0.8]},
                                   "fewshot": {"shots": [2], "splits": 2},
                                   "prune": {"metric": "val_accuracy", "eta": 2, "min_epochs": 1}})
    assert r.status_code == 422 and "prune does not apply to a few-shot sweep" in r.text
    too_many = settings.max_sweep_size // 100 + 1
    r = idle.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cosine"], "lam": [0.1 + 0.8 * i / too_many
                                                                                        for i in range(too_many)]},
                                   "fewshot": {"shots": [1], "splits": 100}})
    assert r.status_code == 422 and f"the limit is {settings.max_sweep_size} per sweep" in r.text


def test_an_uploaded_table_is_checked_as_the_worker_will_cut_it(idle):
    """An upload's pools are those the protocol cuts from its own split (the library on the
    same file): a class too small is named with its size; an unknown upload is a 404, not a 500."""
    from corel.fewshot import protocol_labels
    from tests.app.conftest import npz_bytes

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], [60, 60, 14])
    names = np.array(["ant", "bee", "cat"])
    blob = npz_bytes(x=rng.normal(size=(len(y), 5)).astype(np.float32), y=y, class_names=names)
    r = idle.post("/datasets", files={"file": ("bugs.npz", blob)})
    assert r.status_code == 201, r.text
    dataset_id = r.json()["id"]
    path = idle.app.state.settings.var_dir / "bugs.npz"
    path.write_bytes(blob)
    labels, _ = protocol_labels(ExperimentSpec(dataset="npz", dataset_path=str(path)))
    cut = draw_splits(labels, [1], 1, 0, list(names))
    cats = int((labels[cut.pool] == 2).sum())
    base = {"dataset": "npz", "dataset_id": dataset_id}
    r = idle.post("/sweeps", json={"base": base, "grid": {"loss": ["cce"]}, "fewshot": {"shots": [cats + 1], "splits": 1}})
    assert r.status_code == 422 and f"class 'cat' has {cats} rows in the pool" in r.json()["detail"], r.text
    r = idle.post("/sweeps", json={"base": base, "grid": {"loss": ["cce"]}, "fewshot": {"shots": [cats], "splits": 1}})
    assert r.status_code == 202, r.text
    idle.post(f"/sweeps/{r.json()['id']}/cancel")
    r = idle.post("/sweeps", json={"base": {**base, "dataset_id": 987654}, "grid": {"loss": ["cce"]},
                                   "fewshot": {"shots": [2], "splits": 1}})
    assert r.status_code == 404 and "dataset_id 987654 does not exist" in r.json()["detail"], r.text
