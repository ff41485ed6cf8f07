"""Built-in datasets from a fresh clone: the service says which are here (GET
/datasets/builtin), refuses at submission a spec naming one that is not (it used to accept
it and fail in the worker with "MNIST not found ... in:" and an empty list), and trains
MNIST and AG News from ../shared/datasets, as `make serve` and the tests set it."""

from __future__ import annotations

import csv
import gzip
import io
import shutil
import socket
import time
import uuid

import numpy as np
from fastapi.testclient import TestClient
from PIL import Image

from app.main import create_app
from corel.data import read_idx
from tests.app.conftest import finished, wait_for
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


def test_a_missing_dataset_is_downloaded_once_by_the_worker_verified_and_shown(
    settings, workers, tmp_path
):
    """No data folder holds MNIST: the service offers it as downloadable, and the worker
    downloads it from the mirror (a local HTTP server with the canonical files). A corrupt
    file is refused by its checksum, the run fails saying so and nothing is kept; once the
    mirror is right, the next runs show `preparing data` with the download's progress,
    download it once between them, and train."""
    require((SHARED_DATASETS / "mnist").is_dir(), "MNIST in ../shared/datasets")
    (tmp_path / "mirror").mkdir()
    shutil.copytree(SHARED_DATASETS / "mnist", tmp_path / "mirror" / "mnist")
    mirror = Mirror(tmp_path / "mirror")
    var = tmp_path / "var"
    s = settings.model_copy(update={"data_dir": "", "var_dir": var, "download": True,
                                    "download_mirror": mirror.url,
                                    "queue": f"corel-download-{uuid.uuid4().hex[:8]}"})
    proc = workers.start(s)
    try:
        with TestClient(create_app(s)) as c:
            items = _items(c)
            assert items["mnist"]["status"] == "downloadable", items
            assert "a worker downloads it" in items["mnist"]["why"]
            # AG News is not on that mirror: its source answers 404, so it is not offered.
            assert items["ag-news"]["status"] == "unavailable"
            assert "HTTP 404" in items["ag-news"]["why"], items["ag-news"]

            # 1. A corrupt file (one pixel changed, still valid gzip): refused, nothing kept.
            victim = tmp_path / "mirror" / "mnist" / "t10k-images-idx3-ubyte.gz"
            good = victim.read_bytes()
            content = bytearray(gzip.decompress(good))
            content[7000] ^= 0xFF
            victim.write_bytes(gzip.compress(bytes(content)))
            failed = c.post("/experiments", json=RUN).json()["id"]
            body = wait_for(c, failed, finished, timeout=120, workers=workers)
            assert body["status"] == "failed", body
            assert "could not download t10k-images-idx3-ubyte.gz; nothing was kept" in body["error"]
            assert "refused, sha256 of its content" in body["error"]
            for name in ("COREL_DATA_DIR", str(var / "datasets"), "COREL_DOWNLOAD_MIRROR"):
                assert name in body["error"], (name, body["error"])
            assert body["phase"] is None
            assert sorted(p.name for p in (var / "datasets").iterdir()) == [".mnist.lock"]
            assert _items(c)["mnist"]["status"] == "downloadable"

            # 2. The mirror put right; its last file held back so the phase can be seen.
            victim.write_bytes(good)
            before = len(mirror.requests)
            mirror.hold("/mnist/t10k-labels-idx1-ubyte.gz")
            ids = [c.post("/experiments", json={**RUN, "lam": lam}).json()["id"]
                   for lam in (0.5, 0.7)]
            seen = wait_for(c, ids[0], lambda b: b["phase"] == "preparing data"
                            and "(file 3 of 4)" in (b["phase_detail"] or ""),
                            timeout=120, workers=workers)
            assert seen["status"] == "running" and seen["current_epoch"] == 0
            assert seen["phase_detail"].startswith("downloading MNIST: t10k-images-idx3-ubyte.gz")
            assert not (var / "datasets" / "mnist").exists()  # nothing in place before the end
            mirror.release()
            for experiment_id in ids:
                body = wait_for(c, experiment_id, finished, timeout=180, workers=workers)
                assert body["status"] == "succeeded", body
                assert body["phase"] is None and body["phase_detail"] is None
            assert sorted(mirror.requests[before:]) == sorted(f"/mnist/{n}" for n in MNIST)
            for name in MNIST:
                assert (var / "datasets" / "mnist" / name).read_bytes() == \
                    (SHARED_DATASETS / "mnist" / name).read_bytes()
            items = _items(c)
            assert items["mnist"]["status"] == "present"
            assert items["mnist"]["where"] == str(var / "datasets" / "mnist")
    finally:
        workers.stop(proc)  # its reconciler would take other tests' runs to its own queue
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
