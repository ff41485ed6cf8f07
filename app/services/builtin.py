"""The built-in datasets on this server: which are here, where, and why not.

A dataset is looked for in each of the settings' data folders (``COREL_DATA_DIR``, then
``var_dir/datasets``) and in the library's system locations. One that is in none of them
is ``downloadable`` when downloads are on (``COREL_DOWNLOAD``): the first worker to train
it downloads it once into ``var_dir/datasets`` (:func:`prepare`), and the others wait for
that download. Whether its source can be reached is asked at the service's start and again
now and then (:func:`probe_sources`): one that does not answer within a few seconds (no
internet, a mirror that is down) is ``unavailable`` too. Otherwise it is ``unavailable``, and a spec naming it is refused at
submission (422, naming the setting), instead of failing later in a worker; the
dashboard's form marks it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

from app.core.errors import InvalidInput
from app.core.settings import Settings
from corel.data import BUILTIN_DATASETS as BUILTIN
from corel.data import DatasetNotFoundError, locate, training_split_rows
from corel.data.download import DOWNLOADABLE, DownloadError, Progress, download, probe, source


@dataclass(frozen=True)
class Availability:
    dataset: str
    status: str  # "present" | "downloadable" | "unavailable"
    where: str | None
    why: str | None


@dataclass(frozen=True)
class _Found:
    folder: Path | None  # the data folder to train from (None: system locations alone)
    files: Path | None  # what training reads there (None: digits, which needs no files)


def download_dir(settings: Settings) -> Path:
    """Where a worker downloads built-in datasets (the last of the data folders)."""
    return settings.data_dirs[-1]


def _downloadable(settings: Settings, dataset: str) -> bool:
    return settings.download and dataset in DOWNLOADABLE


def _find(settings: Settings, dataset: str) -> tuple[_Found | None, str | None]:
    """(where it is, None) or (None, where it was looked for)."""
    for folder in [*settings.data_dirs, None]:  # None: the system locations alone
        try:
            files = locate(dataset, folder)
        except DatasetNotFoundError:
            continue
        return _Found(folder, files), None
    where = ", ".join(str(d) for d in settings.data_dirs)
    return None, f"its files are in none of the data folders ({where}) nor a system location"


def offline_fix(settings: Settings) -> str:
    """What to do when a built-in dataset cannot be downloaded from here."""
    return (f"put its files in a folder named in COREL_DATA_DIR or in {download_dir(settings)} "
            "(COREL_VAR_DIR/datasets), or set COREL_DOWNLOAD_MIRROR to a server this host can "
            "reach that serves <dataset>/<file name> (a mirror of the public release)")


# What the download sources answered: (dataset, mirror) -> (why not reachable or None, when).
# Asked once at start (probe_sources) and again when older than download_recheck_seconds.
_answers: dict[tuple[str, str], tuple[str | None, float]] = {}
_asking: dict[tuple[str, str], Future[str | None]] = {}
_lock = threading.Lock()


def _ask(settings: Settings, dataset: str) -> Future[str | None]:
    key = (dataset, settings.download_mirror)
    with _lock:
        asking = _asking.get(key)
        if asking is not None:
            return asking
        asking = Future()
        _asking[key] = asking

    def ask() -> None:
        try:
            asking.set_result(probe(dataset, settings.download_mirror or None,
                                    settings.download_probe_seconds))
        except Exception as exc:
            asking.set_exception(exc)

    def answered(done: Future[str | None]) -> None:
        try:
            why = done.result()
        except Exception as exc:  # a probe that broke: say so, as for one that timed out
            why = f"{type(exc).__name__}: {exc}"
        with _lock:
            _answers[key] = (why, time.monotonic())
            _asking.pop(key, None)

    asking.add_done_callback(answered)
    # A daemon thread: a name that never resolves must not hold up the process's exit (an
    # executor's threads are joined at exit).
    threading.Thread(target=ask, name="corel-download-probe", daemon=True).start()
    return asking


def _unreachable(settings: Settings, dataset: str) -> str | None:
    """None when ``dataset``'s download source answered; otherwise why not. The first
    question waits for the answer (download_probe_seconds at most); later ones get the last
    answer, asked again in the background once it is older than download_recheck_seconds."""
    key = (dataset, settings.download_mirror)
    with _lock:
        known = _answers.get(key)
    if known is not None:
        if time.monotonic() - known[1] > settings.download_recheck_seconds:
            _ask(settings, dataset)
        return known[0]
    asking = _ask(settings, dataset)
    try:
        return asking.result(timeout=settings.download_probe_seconds + 0.5)
    except FutureTimeout:
        why = f"it did not answer within {settings.download_probe_seconds:g} s"
        with _lock:  # until the probe itself ends and says more
            _answers.setdefault(key, (why, time.monotonic()))
        return why


def probe_sources(settings: Settings) -> None:
    """Start asking the download source of each built-in dataset that is not here (at the
    service's start, so that the first submission does not wait for the answer)."""
    for dataset in DOWNLOADABLE:
        if _downloadable(settings, dataset) and _find(settings, dataset)[0] is None:
            _ask(settings, dataset)


def status(settings: Settings, dataset: str) -> Availability:
    """Whether ``dataset`` is here, downloadable (downloads on, its source answered) or
    unavailable, and why."""
    found, missing = _find(settings, dataset)
    if found is not None:
        return Availability(dataset, "present", str(found.files) if found.files else None, None)
    if not _downloadable(settings, dataset):
        fix = "put them in a folder named in COREL_DATA_DIR (several: separated by ':')"
        if dataset in DOWNLOADABLE:
            fix += ", or allow downloads (COREL_DOWNLOAD=true)"
        return Availability(dataset, "unavailable", None, f"{missing}; {fix}")
    unreachable = _unreachable(settings, dataset)
    if unreachable is None:
        mb = source(dataset, settings.download_mirror or "http://mirror").megabytes
        return Availability(dataset, "downloadable", None,
                            f"{missing}; a worker downloads it (about {mb} MB) into "
                            f"{download_dir(settings)} when a run first needs it")
    return Availability(dataset, "unavailable", None,
                        f"{missing}, and its download source could not be reached from this "
                        f"server ({unreachable}); {offline_fix(settings)}")


def availability(settings: Settings) -> list[Availability]:
    return [status(settings, dataset) for dataset in BUILTIN]


def data_dir_for(settings: Settings, dataset: str) -> Path | None:
    """The data folder a worker passes to the library for ``dataset`` (None: none needed,
    or none has it, and the library's error names every place it looked)."""
    if dataset not in BUILTIN:
        return settings.data_dirs[0] if settings.data_dir else None
    found, _ = _find(settings, dataset)
    if found is not None:
        return found.folder
    return download_dir(settings) if _downloadable(settings, dataset) else None


def needs_download(settings: Settings, dataset: str) -> bool:
    """True when training ``dataset`` needs a download first (see :func:`prepare`)."""
    return _downloadable(settings, dataset) and _find(settings, dataset)[0] is None


def prepare(settings: Settings, dataset: str, progress: Progress | None = None) -> None:
    """Download ``dataset`` into ``var_dir/datasets`` if training will need it and it is
    not here (and downloads are on); a no-op otherwise. Waits for a download another
    process has under way. Raises DownloadError (a FileNotFoundError saying what was
    refused; nothing is kept) when the download fails."""
    if not needs_download(settings, dataset):
        return
    try:
        download(dataset, download_dir(settings), mirror=settings.download_mirror or None,
                 progress=progress)
    except DownloadError as exc:
        raise DownloadError(f"{exc}\nTo train it: {offline_fix(settings)}.") from exc


def require_available(settings: Settings, datasets: set[str]) -> None:
    """422 for a spec naming a built-in dataset that is neither here nor downloadable."""
    for dataset in sorted(datasets & set(BUILTIN)):
        known = status(settings, dataset)
        if known.status == "unavailable":
            raise InvalidInput(f"dataset {dataset!r} is not available on this server: {known.why}; "
                               "GET /datasets/builtin lists what is")


def require_rows(settings: Settings, wanted: set[tuple[str, int | None]]) -> None:
    """422 for a spec whose ``train_subset`` asks a built-in dataset for more training rows
    than its split holds (``wanted``: (dataset, train_subset) pairs)."""
    for dataset, subset in sorted(wanted, key=str):
        if subset is None or dataset not in BUILTIN:
            continue
        rows = training_split_rows(dataset, data_dir_for(settings, dataset))
        if rows is not None and subset > rows:
            raise InvalidInput(f"train_subset is {subset}, but {dataset}'s training split holds "
                               f"{rows} rows on this server; ask for at most {rows}, or leave "
                               "train_subset unset to train on all of them")
