"""The built-in datasets on this server: which are here, where, and why not.

A dataset is looked for in each of the settings' data folders (``COREL_DATA_DIR``, then
``var_dir/datasets``) and in the library's system locations. A spec that names one that is
not here is refused at submission (422, naming the setting), instead of failing later in a
worker; the dashboard's form marks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.errors import InvalidInput
from app.settings import Settings
from corel.data import BUILTIN_DATASETS as BUILTIN
from corel.data import DatasetNotFoundError, locate


@dataclass(frozen=True)
class Availability:
    dataset: str
    status: str  # "present" | "unavailable"
    where: str | None
    why: str | None


@dataclass(frozen=True)
class _Found:
    folder: Path | None  # the data folder to train from (None: system locations alone)
    files: Path | None  # what training reads there (None: digits, which needs no files)


def _find(settings: Settings, dataset: str) -> tuple[_Found | None, str | None]:
    """(where it is, None) or (None, why not)."""
    for folder in [*settings.data_dirs, None]:  # None: the system locations alone
        try:
            files = locate(dataset, folder)
        except DatasetNotFoundError:
            continue
        return _Found(folder, files), None
    where = ", ".join(str(d) for d in settings.data_dirs)
    return None, (f"its files are in none of the data folders ({where}) nor a system location; "
                  "put them in a folder named in COREL_DATA_DIR (several: separated by ':')")


def availability(settings: Settings) -> list[Availability]:
    out = []
    for dataset in BUILTIN:
        found, why = _find(settings, dataset)
        if found is not None:
            files = str(found.files) if found.files else None
            out.append(Availability(dataset, "present", files, None))
        else:
            out.append(Availability(dataset, "unavailable", None, why))
    return out


def data_dir_for(settings: Settings, dataset: str) -> Path | None:
    """The data folder a worker passes to the library for ``dataset`` (None: none needed,
    or none has it, and the library's error names every place it looked)."""
    if dataset not in BUILTIN:
        return settings.data_dirs[0] if settings.data_dir else None
    found, _ = _find(settings, dataset)
    return found.folder if found else None


def require_available(settings: Settings, datasets: set[str]) -> None:
    """422 for a spec naming a built-in dataset that is not on this server."""
    for dataset in sorted(datasets & set(BUILTIN)):
        found, why = _find(settings, dataset)
        if found is None:
            raise InvalidInput(f"dataset {dataset!r} is not available on this server: {why}; "
                               "GET /datasets/builtin lists what is")
