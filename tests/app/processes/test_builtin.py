"""Built-in datasets from a fresh clone: the service says which are here (GET /datasets/builtin),
refuses at submission a spec naming one that is not (it used to accept it and fail in the
worker with "MNIST not found ... in:" and an empty list), and trains MNIST and AG News from
../shared/datasets, as `make serve` and the tests set it.

This file holds those of its tests that belong in the processes tier (processes of its own);
the others, and the helpers they share, are in tests/app/api/test_builtin.py."""

from __future__ import annotations

import gzip
import shutil
import uuid

from fastapi.testclient import TestClient

from app.main import create_app
from tests.app.api.test_builtin import MNIST, RUN, _items
from tests.app.conftest import finished, wait_for
from tests.conftest import SHARED_DATASETS, require
from tests.mirror import Mirror


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
