"""Downloading the built-in datasets: once, verified, and never half-written.

MNIST and Fashion-MNIST come from torchvision's mirrors (``torchvision.datasets.MNIST.mirrors``
and its file names), AG News from its public CSV release (the one torchtext reads). Each
file is checked against a checksum declared here before anything is kept: for the gzipped
IDX files, the sha256 of their content (what training reads; a mirror may recompress
them), for the AG News CSVs the md5 of the file itself (torchtext's).

:func:`download` fetches into a hidden folder beside the target and renames it into place
only once every file has passed, so the target folder either holds the whole dataset or
does not exist. A lock file makes concurrent callers (several workers on one host) wait
for one download instead of making their own.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import os
import shutil
import time
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from corel.data.base import DatasetNotFoundError, PathLike

AG_NEWS_CLASSES = ("World", "Sports", "Business", "Sci/Tech")
AG_NEWS_RELEASE = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"

# sha256 of the uncompressed IDX files (the canonical content; MNIST's as published with
# the dataset copies this project is tested with, Fashion-MNIST's of its release files).
_IDX_SHA256 = {
    "mnist": {
        "train-images-idx3-ubyte.gz": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte.gz": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
}

_AG_NEWS_MD5 = {
    "train.csv": "b1a00f826fdfbd249f79597b59e1dc12",
    "test.csv": "d52ea96a97a2d943681189a97654912d",
}

# torchvision's mirrors (``torchvision.datasets.MNIST.mirrors`` and ``FashionMNIST``'s),
# written out: importing torchvision for them cost the service's process 192 MB of RSS and
# seconds, in the background, when it asked at start whether they answer
# (tests/corel/data/test_download.py checks that they are still torchvision's).
TORCHVISION_MIRRORS = {
    "MNIST": ("https://ossci-datasets.s3.amazonaws.com/mnist/", "http://yann.lecun.com/exdb/mnist/"),
    "FashionMNIST": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}

CHUNK = 1 << 16

Progress = Callable[[str, int, int | None], None]
"""``progress(what, bytes_so_far, bytes_of_the_file_or_None)`` as bytes arrive; ``what``
names the dataset, the file, and which of how many it is."""


class DownloadError(DatasetNotFoundError):
    """A download failed or was refused by its checksum; nothing of it was kept."""


@dataclass(frozen=True)
class RemoteFile:
    name: str
    urls: tuple[str, ...]  # tried in order
    digest: str  # "sha256:<hex>" or "md5:<hex>"
    of_content: bool  # the digest is of the gunzipped content, not the file as served

    def check(self, path: Path) -> str | None:
        """None if ``path`` holds this file; otherwise what is wrong with it."""
        algorithm, expected = self.digest.split(":", 1)
        h = hashlib.new(algorithm)
        try:
            with (gzip.open(path, "rb") if self.of_content else open(path, "rb")) as f:
                for block in iter(lambda: f.read(CHUNK), b""):
                    h.update(block)
        except (OSError, EOFError, zlib.error) as exc:
            return f"it is not a readable gzip file ({exc})"
        got = h.hexdigest()
        if got != expected:
            what = "its content" if self.of_content else "the file"
            return f"{algorithm} of {what} is {got}, expected {expected}"
        return None


@dataclass(frozen=True)
class Source:
    dataset: str
    title: str
    folder: str  # the subfolder of the download folder it goes into
    files: tuple[RemoteFile, ...]
    megabytes: int  # about how much is downloaded
    written: tuple[tuple[str, str], ...] = ()  # (name, text) files written beside them


def _idx_source(dataset: str, title: str, torchvision_class: str, folder: str, megabytes: int,
                mirror: str | None) -> Source:
    bases = [f"{mirror.rstrip('/')}/{dataset}/"] if mirror else list(TORCHVISION_MIRRORS[torchvision_class])
    files = tuple(
        RemoteFile(name, tuple(base + name for base in bases), f"sha256:{sha}", of_content=True)
        for name, sha in _IDX_SHA256[dataset].items()
    )
    return Source(dataset, title, folder, files, megabytes)


def source(dataset: str, mirror: str | None = None) -> Source:
    """Where ``dataset`` is downloaded from (``mirror``: a base URL serving
    ``<dataset>/<file name>`` instead of the public release)."""
    if dataset == "mnist":
        return _idx_source("mnist", "MNIST", "MNIST", "mnist", 12, mirror)
    if dataset == "fashion-mnist":
        return _idx_source("fashion-mnist", "Fashion-MNIST", "FashionMNIST", "fashion-mnist", 31,
                           mirror)
    if dataset == "ag-news":
        base = f"{mirror.rstrip('/')}/ag-news/" if mirror else AG_NEWS_RELEASE
        files = tuple(RemoteFile(name, (base + name,), f"md5:{md5}", of_content=False)
                      for name, md5 in _AG_NEWS_MD5.items())
        classes = "".join(f"{name}\n" for name in AG_NEWS_CLASSES)
        return Source("ag-news", "AG News", "ag_news", files, 31,
                      written=(("classes.txt", classes),))
    raise ValueError(f"{dataset!r} cannot be downloaded; downloadable: {', '.join(DOWNLOADABLE)}")


DOWNLOADABLE = ("mnist", "fashion-mnist", "ag-news")


def probe(dataset: str, mirror: str | None = None, timeout: float = 3.0) -> str | None:
    """None when the first file of ``dataset``'s download answers a HEAD request from one of
    its URLs within ``timeout`` seconds (each); otherwise why not, naming each URL tried.
    Nothing is downloaded. (A name that never resolves can take longer than ``timeout``:
    callers that must answer in time wait on it in a thread.)"""
    first = source(dataset, mirror).files[0]
    refused: list[str] = []
    for url in first.urls:
        request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "corel"})
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                return None
        except urllib.error.HTTPError as exc:
            if exc.code == 405:  # a server that answers GET alone is still there
                return None
            refused.append(f"{url}: HTTP {exc.code} {exc.reason}")
        except (OSError, urllib.error.URLError) as exc:
            refused.append(f"{url}: {getattr(exc, 'reason', None) or exc}")
    return "; ".join(refused)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fetch(url: str, into: Path, label: str, timeout: float, progress: Progress | None) -> None:
    request = urllib.request.Request(url, headers={"User-Agent": "corel"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(into, "wb") as out:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        done = 0
        last = 0.0
        while block := response.read(CHUNK):
            out.write(block)
            done += len(block)
            now = time.monotonic()
            if progress is not None and now - last >= 0.2:
                progress(label, done, total)
                last = now
        if total is not None and done != total:
            raise OSError(f"the connection closed after {done} of {total} bytes")
        if progress is not None:
            progress(label, done, total)


def download(dataset: str, into: PathLike, *, mirror: str | None = None,
             progress: Progress | None = None, timeout: float = 60.0) -> Path:
    """Download ``dataset`` into ``into/<its folder>`` unless it is there; return that folder.

    Each file is tried from each of its URLs in turn and kept only if its checksum
    matches. Raises :class:`DownloadError` (a DatasetNotFoundError) naming each URL tried
    and why it was refused; then nothing was written but the lock file.
    """
    src = source(dataset, mirror)
    root = Path(into).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    target = root / src.folder
    with _locked(root / f".{src.folder}.lock"):
        if target.is_dir():  # only ever created whole, by the rename below
            return target
        partial = root / f".{src.folder}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        partial.mkdir()
        try:
            for i, remote in enumerate(src.files, 1):
                label = f"{src.title}: {remote.name} (file {i} of {len(src.files)})"
                _fetch_one(remote, partial, label, timeout, progress)
            for name, text in src.written:
                (partial / name).write_text(text, encoding="utf-8")
            os.rename(partial, target)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return target


def _fetch_one(remote: RemoteFile, folder: Path, label: str, timeout: float,
               progress: Progress | None) -> None:
    path = folder / remote.name
    refused: list[str] = []
    for url in remote.urls:
        try:
            _fetch(url, path, label, timeout, progress)
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", None) or exc
            refused.append(f"  {url}: {reason}")
            continue
        wrong = remote.check(path)
        if wrong is None:
            return
        refused.append(f"  {url}: refused, {wrong}")
    path.unlink(missing_ok=True)
    raise DownloadError(
        f"could not download {remote.name}; nothing was kept. Tried:\n" + "\n".join(refused)
    )
