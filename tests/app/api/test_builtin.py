"""Built-in datasets from a fresh clone: the service says which are here (GET
/datasets/builtin), refuses at submission a spec naming one that is not (it used to accept
it and fail in the worker with "MNIST not found ... in:" and an empty list), and trains
MNIST and AG News from ../shared/datasets, as `make serve` and the tests set it."""

from __future__ import annotations

import shutil
import socket
import time

from fastapi.testclient import TestClient

from app.main import create_app
from tests.conftest import SHARED_DATASETS, require
from tests.mirror import Mirror

MNIST = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
RUN = {"dataset": "mnist", "epochs": 1, "lr": 1e-3, "train_subset": 300, "batch_size": 64}


def _items(client: TestClient) -> dict[str, dict]:
    r = client.get("/datasets/builtin")
    assert r.status_code == 200, r.text
    return {d["dataset"]: d for d in r.json()["items"]}


def test_without_their_files_mnist_and_ag_news_are_refused_naming_the_setting(settings, tmp_path):
    bare = settings.model_copy(update={"data_dir": str(tmp_path / "nothing-here"),
                                       "var_dir": tmp_path / "var", "download": False})
    with TestClient(create_app(bare)) as c:
        items = _items(c)
        assert {k: v["status"] for k, v in items.items()} == {
            "mnist": "unavailable", "fashion-mnist": "present", "ag-news": "unavailable",
            "digits": "present"}
        assert "COREL_DATA_DIR" in items["mnist"]["why"] and "nothing-here" in items["mnist"]["why"]
        assert "COREL_DOWNLOAD=true" in items["ag-news"]["why"]
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


def test_offline_a_download_that_cannot_reach_its_source_is_refused_at_submission(
    settings, tmp_path
):
    """Downloads on, no files, and a source that cannot be reached (a port nobody listens
    on; a server that never answers): the datasets are unavailable, and a spec naming one is
    refused within seconds with a 422 saying what to do (it used to be accepted and fail in
    the worker with two DNS errors). A source that comes back is asked again."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    silent = socket.socket()  # accepts connections (the kernel does) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    silent_url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        for i, (url, says) in enumerate([(refused_url, "refused"), (silent_url, "timed out")]):
            offline = settings.model_copy(update={
                "data_dir": str(tmp_path / "nothing-here"), "var_dir": tmp_path / f"var{i}",
                "download": True, "download_mirror": url, "download_probe_seconds": 1.0})
            with TestClient(create_app(offline)) as c:
                before = c.get("/experiments", params={"limit": 1}).json()["total"]
                started = time.monotonic()
                r = c.post("/experiments", json=RUN)
                assert time.monotonic() - started < 5
                assert r.status_code == 422, r.text
                detail = r.json()["detail"]
                assert "'mnist' is not available on this server" in detail
                assert "its download source could not be reached" in detail
                assert f"{url}/mnist/train-images-idx3-ubyte.gz" in detail and says in detail
                for name in ("COREL_DATA_DIR", str(tmp_path / f"var{i}" / "datasets"),
                             "COREL_DOWNLOAD_MIRROR"):
                    assert name in detail, (name, detail)
                assert c.get("/experiments", params={"limit": 1}).json()["total"] == before
                items = _items(c)
                assert items["mnist"]["status"] == items["ag-news"]["status"] == "unavailable"
                assert "COREL_DOWNLOAD_MIRROR" in items["ag-news"]["why"]
    finally:
        silent.close()

    # A mirror that is up but lacks the files, then gets them: asked again once the last
    # answer is older than download_recheck_seconds.
    require((SHARED_DATASETS / "mnist").is_dir(), "MNIST in ../shared/datasets")
    (tmp_path / "mirror").mkdir()
    mirror = Mirror(tmp_path / "mirror")
    later = settings.model_copy(update={
        "data_dir": str(tmp_path / "nothing-here"), "var_dir": tmp_path / "var-later",
        "download": True, "download_mirror": mirror.url, "download_recheck_seconds": 0.5})
    try:
        with TestClient(create_app(later)) as c:
            mnist = _items(c)["mnist"]
            assert mnist["status"] == "unavailable" and "HTTP 404" in mnist["why"], mnist
            shutil.copytree(SHARED_DATASETS / "mnist", tmp_path / "mirror" / "mnist")
            deadline = time.monotonic() + 10
            while _items(c)["mnist"]["status"] != "downloadable":
                assert time.monotonic() < deadline, _items(c)["mnist"]
                time.sleep(0.2)
            assert _items(c)["ag-news"]["status"] == "unavailable"  # not on that mirror
            assert mirror.requests == []  # asked with HEAD: nothing downloaded
    finally:
        mirror.close()


def test_a_train_subset_above_the_training_split_is_refused_naming_the_limit(client, shared_datasets):
    """It used to be accepted (train_subset 1e12 trained on the whole split, without a word)."""
    r = client.post("/experiments", json={"dataset": "digits", "epochs": 1, "train_subset": 10**12})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == ("train_subset is 1000000000000, but digits's training split holds "
                                  "1257 rows on this server; ask for at most 1257, or leave "
                                  "train_subset unset to train on all of them")
    # AG News's rows are counted in the files this server has (the shared test split).
    r = client.post("/sweeps", json={"base": {"dataset": "ag-news", "epochs": 1, "train_subset": 5321},
                                     "grid": {"lam": [0.3, 0.6]}})
    assert r.status_code == 422 and "ag-news's training split holds 5320 rows" in r.json()["detail"]
    before = client.get("/experiments", params={"limit": 1}).json()["total"]
    r = client.post("/experiments", json={"dataset": "digits", "epochs": 1, "train_subset": 1257})
    assert r.status_code == 202, r.text
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == before + 1
