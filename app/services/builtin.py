"""The built-in datasets on this server: which are here, where, and why not.

A dataset is looked for in each of the settings' data folders (``COREL_DATA_DIR``, then
``var_dir/datasets``) and in the library's system locations. One that is in none of them
is ``downloadable`` when downloads are on (``COREL_DOWNLOAD``): the first worker to train
it downloads it once into ``var_dir/datasets`` (:func:`prepare`), and the others wait for
that download. Otherwise it is ``unavailable``, and a spec naming it is refused at
submission (422, naming the setting), instead of failing later in a worker; the
dashboard's form marks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.errors import InvalidInput
from app.settings import Settings
from corel.data import BUILTIN_DATASETS as BUILTIN
from corel.data import DatasetNotFoundError, locate
from corel.data.download import DOWNLOADABLE, Progress, download, source


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
    """(where it is, None) or (None, why not)."""
    for folder in [*settings.data_dirs, None]:  # None: the system locations alone
        try:
            files = locate(dataset, folder)
        except DatasetNotFoundError:
            continue
        return _Found(folder, files), None
    where = ", ".join(str(d) for d in settings.data_dirs)
    why = f"its files are in none of the data folders ({where}) nor a system location"
    if _downloadable(settings, dataset):
        mb = source(dataset, settings.download_mirror or "http://mirror").megabytes
        return None, (f"{why}; a worker downloads it (about {mb} MB) into "
                      f"{download_dir(settings)} when a run first needs it")
    fix = "put them in a folder named in COREL_DATA_DIR (several: separated by ':')"
    if dataset in DOWNLOADABLE:
        fix += ", or allow downloads (COREL_DOWNLOAD=true)"
    return None, f"{why}; {fix}"


def availability(settings: Settings) -> list[Availability]:
    out = []
    for dataset in BUILTIN:
        found, why = _find(settings, dataset)
        if found is not None:
            files = str(found.files) if found.files else None
            out.append(Availability(dataset, "present", files, None))
        elif _downloadable(settings, dataset):
            out.append(Availability(dataset, "downloadable", None, why))
        else:
            out.append(Availability(dataset, "unavailable", None, why))
    return out


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
    download(dataset, download_dir(settings), mirror=settings.download_mirror or None,
             progress=progress)


def require_available(settings: Settings, datasets: set[str]) -> None:
    """422 for a spec naming a built-in dataset that is neither here nor downloadable."""
    for dataset in sorted(datasets & set(BUILTIN)):
        found, why = _find(settings, dataset)
        if found is None and not _downloadable(settings, dataset):
            raise InvalidInput(f"dataset {dataset!r} is not available on this server: {why}; "
                               "GET /datasets/builtin lists what is")
