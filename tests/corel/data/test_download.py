"""Downloading the built-in datasets, against a local HTTP server that serves the dataset
files this project is tested with (so it runs offline): verified, locked, never half-written."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from corel import data
from corel.data.download import TORCHVISION_MIRRORS, DownloadError, download, probe, source
from corel.spec import ExperimentSpec
from tests.conftest import FASHION_DIR, SHARED_DATASETS, require
from tests.mirror import Mirror

MNIST_FILES = [f.name for f in source("mnist", "http://x").files]


def mnist_mirror_root(tmp_path: Path) -> Path:
    require((SHARED_DATASETS / "mnist").is_dir(), "MNIST in ../shared/datasets")
    root = tmp_path / "mirror"
    shutil.copytree(SHARED_DATASETS / "mnist", root / "mnist")
    return root


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    m = Mirror(mnist_mirror_root(tmp_path))
    yield m
    m.close()


def test_mnist_downloads_verified_into_its_folder(mirror: Mirror, tmp_path: Path) -> None:
    into = tmp_path / "datasets"
    seen: list[tuple[str, int, int | None]] = []
    folder = download("mnist", into, mirror=mirror.url, progress=lambda *a: seen.append(a))
    assert folder == into / "mnist"
    for name in MNIST_FILES:
        assert (folder / name).read_bytes() == (mirror.root / "mnist" / name).read_bytes()
    assert sorted(p.name for p in into.iterdir()) == [".mnist.lock", "mnist"]
    # progress: every file, ending at its full size
    last = {what: (done, total) for what, done, total in seen}
    assert len(last) == 4
    assert all(done == total and total > 0 for done, total in last.values())
    # and training reads what was downloaded
    ds = data.load_dataset(ExperimentSpec(dataset="mnist", train_subset=50), into)
    assert ds.x_test.shape[0] == 10_000


def test_a_second_call_downloads_nothing(mirror: Mirror, tmp_path: Path) -> None:
    download("mnist", tmp_path / "d", mirror=mirror.url)
    n = len(mirror.requests)
    download("mnist", tmp_path / "d", mirror=mirror.url)
    assert len(mirror.requests) == n == 4


def test_concurrent_callers_download_once(mirror: Mirror, tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool:
        folders = list(pool.map(lambda _: download("mnist", tmp_path / "d", mirror=mirror.url),
                                range(4)))
    assert len(set(folders)) == 1
    assert sorted(mirror.requests) == sorted(f"/mnist/{n}" for n in MNIST_FILES)


def test_a_corrupt_file_is_refused_by_its_checksum_and_nothing_is_kept(
    mirror: Mirror, tmp_path: Path
) -> None:
    # One pixel changed: still a valid gzip file and a valid IDX file, but not MNIST.
    victim = mirror.root / "mnist" / "t10k-images-idx3-ubyte.gz"
    content = bytearray(gzip.decompress(victim.read_bytes()))
    content[5000] ^= 0xFF
    victim.write_bytes(gzip.compress(bytes(content)))
    into = tmp_path / "datasets"
    with pytest.raises(DownloadError) as caught:
        download("mnist", into, mirror=mirror.url)
    message = str(caught.value)
    expected = source("mnist", mirror.url).files[2].digest.split(":")[1]
    assert "t10k-images-idx3-ubyte.gz" in message and "refused" in message
    assert f"expected {expected}" in message
    assert hashlib.sha256(bytes(content)).hexdigest() in message
    assert "nothing was kept" in message
    # nothing half-written: no dataset folder, no partial folder, only the lock
    assert [p.name for p in into.iterdir()] == [".mnist.lock"]
    # the library's loader says the same, and where it looked
    with pytest.raises(data.DatasetNotFoundError, match=r"download into .* failed"):
        data.load_dataset(ExperimentSpec(dataset="mnist"), into, download=True)


def test_a_truncated_transfer_is_refused(mirror: Mirror, tmp_path: Path) -> None:
    victim = mirror.root / "mnist" / "train-labels-idx1-ubyte.gz"
    victim.write_bytes(victim.read_bytes()[:1000])
    with pytest.raises(DownloadError, match="not a readable gzip file"):
        download("mnist", tmp_path / "d", mirror=mirror.url)
    assert not (tmp_path / "d" / "mnist").exists()


def test_a_server_that_does_not_answer_is_named(tmp_path: Path) -> None:
    with pytest.raises(DownloadError, match=r"127\.0\.0\.1:9/mnist/train-images"):
        download("mnist", tmp_path / "d", mirror="http://127.0.0.1:9", timeout=5)
    assert not (tmp_path / "d" / "mnist").exists()


def test_the_public_sources_are_torchvision_s_mirrors() -> None:
    import torchvision.datasets

    for name, mirrors in TORCHVISION_MIRRORS.items():
        assert list(mirrors) == list(getattr(torchvision.datasets, name).mirrors), name
    assert source("mnist").files[0].urls == tuple(
        f"{base}train-images-idx3-ubyte.gz" for base in torchvision.datasets.MNIST.mirrors)


def test_a_probe_downloads_nothing_and_says_why_a_source_cannot_serve(
    mirror: Mirror, tmp_path: Path
) -> None:
    assert probe("mnist", mirror.url, timeout=5) is None
    assert mirror.requests == []  # a HEAD request: no file was sent
    (tmp_path / "empty").mkdir()
    empty = Mirror(tmp_path / "empty")
    try:
        why = probe("mnist", empty.url, timeout=5)
        assert why == f"{empty.url}/mnist/train-images-idx3-ubyte.gz: HTTP 404 File not found"
    finally:
        empty.close()
    why = probe("mnist", "http://127.0.0.1:9", timeout=5)
    assert why is not None and why.startswith("http://127.0.0.1:9/mnist/train-images")
    assert "refused" in why.lower()


def test_fashion_mnist_checksums_match_the_release_files(tmp_path: Path) -> None:
    require(FASHION_DIR.is_dir(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    for remote in source("fashion-mnist", "http://x").files:
        assert remote.check(FASHION_DIR / remote.name) is None


def test_ag_news_is_refused_unless_byte_for_byte_the_release(tmp_path: Path) -> None:
    # The AG News copy in ../shared is the test split re-written (unquoted CSV): the same
    # rows, not the release's bytes, so its md5 does not match and it is refused.
    require((SHARED_DATASETS / "ag_news" / "test.csv").exists(), "AG News test split")
    root = tmp_path / "mirror"
    (root / "ag-news").mkdir(parents=True)
    shutil.copy(SHARED_DATASETS / "ag_news" / "test.csv", root / "ag-news" / "test.csv")
    shutil.copy(SHARED_DATASETS / "ag_news" / "test.csv", root / "ag-news" / "train.csv")
    m = Mirror(root)
    try:
        with pytest.raises(DownloadError, match=r"md5 of the file is .* expected b1a00f82"):
            download("ag-news", tmp_path / "d", mirror=m.url)
    finally:
        m.close()
    assert not (tmp_path / "d" / "ag_news").exists()
