"""A 1 GB upload and its download stream through the API: its memory grows by less than
100 MB either way (the service in a process of its own, its resident memory sampled while
the bytes pass)."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.core.settings import Settings
from harness.stack import Stack
from tests.app.processes.test_limits import rss_kib

# Alone (make test's serial part): it measures a process's memory and moves a gigabyte.
pytestmark = [pytest.mark.serial, pytest.mark.no_user]

ROWS, WIDTH = 1 << 20, 256  # float32: 1 GiB of x


def big_npz(path: Path) -> Path:
    """An .npz of 1 GiB of x (and its labels), written without holding x in memory."""
    npy = path.parent / "x.npy"
    x = np.lib.format.open_memmap(npy, mode="w+", dtype=np.float32, shape=(ROWS, WIDTH))
    for start in range(0, ROWS, 1 << 16):
        x[start:start + (1 << 16)] = np.float32(start % 7)
    x.flush()
    del x
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.write(npy, "x.npy")
        with archive.open("y.npy", "w") as f:
            np.lib.format.write_array(f, np.arange(ROWS, dtype=np.int64) % 4)
    npy.unlink()
    return path


class Peak:
    """The highest resident memory of a process, sampled every 20 ms while in use."""

    def __init__(self, pid: int) -> None:
        self.pid, self.base, self.peak = pid, rss_kib(pid), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_kib(self.pid))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def grown_mb(self) -> float:
        return (self.peak - self.base) / 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    root = tmp_path_factory.mktemp("big")
    stack = Stack.on(Settings(var_dir=root / "var", max_upload_bytes=2 << 30), root)
    with stack:
        proc = stack.start_api(env={"TMPDIR": str(root)})
        yield stack.url, proc.pid


def test_a_1_gb_upload_and_its_download_stream(server, tmp_path):
    url, pid = server
    path = big_npz(tmp_path / "big.npz")
    size = path.stat().st_size
    assert size > 1 << 30
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    with httpx.Client(base_url=url, timeout=600) as client:
        with Peak(pid) as up, open(path, "rb") as f:
            r = client.post("/datasets", files={"file": ("big.npz", f)})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["summary"]["n"] == ROWS
        assert body["sha256"] == digest.hexdigest() and body["size"] == size
        print(f"upload of {size / 2**30:.2f} GiB: the API grew by {up.grown_mb:.1f} MB")
        assert up.grown_mb < 100, f"the upload grew the API by {up.grown_mb:.0f} MB"

        got, received = hashlib.sha256(), 0
        with Peak(pid) as down, client.stream("GET", f"/datasets/{body['id']}/file") as r:
            assert r.status_code == 200
            assert r.headers["etag"] == f'"{digest.hexdigest()}"'
            for piece in r.iter_bytes(1 << 20):
                got.update(piece)
                received += len(piece)
        assert received == size and got.hexdigest() == digest.hexdigest()
        print(f"download: the API grew by {down.grown_mb:.1f} MB")
        assert down.grown_mb < 100, f"the download grew the API by {down.grown_mb:.0f} MB"
        tail = client.get(f"/datasets/{body['id']}/file", headers={"Range": f"bytes={size - 10}-"})
        assert tail.status_code == 206 and len(tail.content) == 10
