"""Where a frozen encoder's work is kept beyond this process: a file in the features folder
(this host), and a :class:`FeatureStore` shared by every host (the service's artifact store).

What is kept (a split's features, the parity gate's verdict) is named by its content: the
encoder's digest, the computing path, the inputs' digest. A name found in the folder is read
from it; else from the store, then written into the folder for next time; else it is
computed, written into the folder and put into the store. Where each came from is heard by
:func:`sources` (a run records it: ``computed``, ``from the store`` or ``cached``).

The store is set for a block by :func:`features_store` (the engine's
``EngineOptions.features_store``, through :func:`corel.data.load_dataset`). A store that
fails (down, full) is warned about and passed over: the features are computed, or kept in
the folder only; a run never fails for want of a cache.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Literal, Protocol

__all__ = ["SOURCES", "FeatureStore", "FolderStore", "Source", "features_store", "heard", "keep", "read",
           "source_of", "sources"]

log = logging.getLogger("corel.features")

Source = Literal["computed", "from the store", "cached"]
SOURCES: tuple[Source, ...] = ("computed", "from the store", "cached")
"""Where kept work came from: computed here; read from the shared store; or this host's
(its folder, or this process's memory)."""


class FeatureStore(Protocol):
    """Bytes by name, shared by every host: ``get`` is None for a name never put."""

    def get(self, name: str) -> bytes | None: ...

    def put(self, name: str, data: bytes) -> None: ...


class FolderStore:
    """A :class:`FeatureStore` in a folder every host mounts (a network share), for the
    library without the service: ``EngineOptions(features_store=FolderStore("/mnt/shared/features"))``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def get(self, name: str) -> bytes | None:
        file = self.root / name
        return file.read_bytes() if file.is_file() else None

    def put(self, name: str, data: bytes) -> None:
        _write(self.root / name, data)


_STORE: ContextVar[FeatureStore | None] = ContextVar("corel_features_store", default=None)
_HEARD: ContextVar[list[Source] | None] = ContextVar("corel_features_sources", default=None)


@contextmanager
def features_store(store: FeatureStore | None) -> Iterator[None]:
    """Within the block (this thread's context), kept work is also read from and put into
    ``store`` (None: the folder alone)."""
    token = _STORE.set(store)
    try:
        yield
    finally:
        _STORE.reset(token)


@contextmanager
def sources() -> Iterator[list[Source]]:
    """Within the block, where each piece of kept work came from, in order, into the list
    yielded (a block inside another also tells the outer one)."""
    outer = _HEARD.get()
    mine: list[Source] = []
    token = _HEARD.set(mine)
    try:
        yield mine
    finally:
        _HEARD.reset(token)
        if outer is not None:
            outer.extend(mine)


def heard(source: Source) -> None:
    """Tell the listening :func:`sources` block (if any) where a piece came from."""
    listening = _HEARD.get()
    if listening is not None:
        listening.append(source)


def source_of(heard_: list[Source]) -> Source | None:
    """One word for a run's data: ``computed`` if any piece was, else ``from the store`` if
    any piece came from it, else ``cached``; None where nothing was kept or read."""
    for source in SOURCES:
        if source in heard_:
            return source
    return None


def read(name: str, folder: str | os.PathLike[str] | None) -> bytes | None:
    """The bytes kept under ``name``: the folder's file, else the store's (then written into
    the folder); None where neither has them (compute, then :func:`keep`)."""
    file = Path(folder) / name if folder is not None else None
    if file is not None and file.is_file():
        heard("cached")
        return file.read_bytes()
    store = _STORE.get()
    if store is None:
        return None
    try:
        data = store.get(name)
    except Exception as exc:  # a cache: computed instead
        log.warning("features store not read", extra={"kept": name, "error": f"{type(exc).__name__}: {exc}"[:200]})
        return None
    if data is None:
        return None
    if file is not None:
        _write(file, data)
    heard("from the store")
    return data


def keep(name: str, folder: str | os.PathLike[str] | None, data: bytes) -> None:
    """Keep computed bytes under ``name``: in the folder, and in the store (if set)."""
    heard("computed")
    if folder is not None:
        _write(Path(folder) / name, data)
    store = _STORE.get()
    if store is not None:
        try:
            store.put(name, data)
        except Exception as exc:  # the next run on another host computes them again
            log.warning("features not put into the store",
                        extra={"kept": name, "error": f"{type(exc).__name__}: {exc}"[:200]})


def _write(file: Path, data: bytes) -> None:
    """Written beside, then renamed: a reader never sees half a file."""
    file.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=file.parent, delete=False) as tmp:
        tmp.write(data)
    os.replace(tmp.name, file)
