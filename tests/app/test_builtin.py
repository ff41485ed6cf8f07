"""Built-in datasets from a fresh clone: the service says which are here (GET
/datasets/builtin), refuses at submission a spec naming one that is not (it used to accept
it and fail in the worker with "MNIST not found ... in:" and an empty list), and trains
MNIST and AG News from ../shared/datasets, as `make serve` and the tests set it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.main import create_app
from tests.app.conftest import finished, wait_for


def _items(client: TestClient) -> dict[str, dict]:
    r = client.get("/datasets/builtin")
    assert r.status_code == 200, r.text
    return {d["dataset"]: d for d in r.json()["items"]}


def test_without_their_files_mnist_and_ag_news_are_refused_naming_the_setting(settings, tmp_path):
    bare = settings.model_copy(update={"data_dir": str(tmp_path / "nothing-here"),
                                       "var_dir": tmp_path / "var"})
    with TestClient(create_app(bare)) as c:
        items = _items(c)
        assert {k: v["status"] for k, v in items.items()} == {
            "mnist": "unavailable", "fashion-mnist": "present", "ag-news": "unavailable",
            "digits": "present"}
        assert "COREL_DATA_DIR" in items["mnist"]["why"] and "nothing-here" in items["mnist"]["why"]
        before = c.get("/experiments", params={"limit": 1}).json()["total"]
        sweeps = c.get("/sweeps", params={"limit": 1}).json()["total"]
        r = c.post("/experiments", json={"dataset": "mnist", "epochs": 1})
        assert r.status_code == 422 and "'mnist' is not available on this server" in r.json()["detail"]
        assert "COREL_DATA_DIR" in r.json()["detail"]
        r = c.post("/sweeps", json={"base": {"dataset": "ag-news", "epochs": 1},
                                    "grid": {"lam": [0.3, 0.6]}})
        assert r.status_code == 422 and "'ag-news' is not available" in r.json()["detail"], r.text
        assert c.get("/experiments", params={"limit": 1}).json()["total"] == before
        assert c.get("/sweeps", params={"limit": 1}).json()["total"] == sweeps


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
