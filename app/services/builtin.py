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
from corel.data import DatasetNotFoundError, locate

BUILTIN = ("mnist", "fashion-mnist", "ag-news", "digits")


@dataclass(frozen=True)
class Availability:
    dataset: str
    status: str  # "present" | "unavailable"
    where: str | None
    why: str | None


def _find(settings: Settings, dataset: str) -> tuple[Path | None, str | None]:
    """(the data folder to train from, None) or (None, why not)."""
    for folder in [*settings.data_dirs, None]:  # None: the system locations alone
        try:
            locate(dataset, folder)
        except DatasetNotFoundError:
            continue
        return folder, None
    where = ", ".join(str(d) for d in settings.data_dirs)
    return None, (f"its files are in none of the data folders ({where}) nor a system location; "
                  "put them in a folder named in COREL_DATA_DIR (several: separated by ':')")


def availability(settings: Settings) -> list[Availability]:
    out = []
    for dataset in BUILTIN:
        folder, why = _find(settings, dataset)
        if why is None:
            found = locate(dataset, folder)
            out.append(Availability(dataset, "present", str(found) if found else None, None))
        else:
            out.append(Availability(dataset, "unavailable", None, why))
    return out


def data_dir_for(settings: Settings, dataset: str) -> Path | None:
    """The data folder a worker passes to the library for ``dataset`` (None: none needed,
    or none has it, and the library's error names every place it looked)."""
    if dataset not in BUILTIN:
        return settings.data_dirs[0] if settings.data_dir else None
    folder, _ = _find(settings, dataset)
    return folder


def require_available(settings: Settings, datasets: set[str]) -> None:
    """422 for a spec naming a built-in dataset that is not on this server."""
    for dataset in sorted(datasets & set(BUILTIN)):
        _, why = _find(settings, dataset)
        if why is not None:
            raise InvalidInput(f"dataset {dataset!r} is not available on this server: {why}; "
                               "GET /datasets/builtin lists what is")
