"""One resolver for an encoder's files, whichever way they came: packaged (a PyPI package
installs them; the catalog's ``files`` says where), uploaded (the service writes them to
this machine's cache and gives that path) or given to the library (``encoder_path``). A
user's own encoder's files are always given by their caller, never looked up in a registry
of the process. An encoder is identified by the content of its files: a folder's every
file (weights, tokenizer, configuration), or one weights file, hashed with sha256; a model
that records a digest is only ever run on files with that digest.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from pathlib import Path

from corel.encoder_catalog import EncoderDeclaration, pretrained

__all__ = ["digest", "installed", "packaged", "recorded", "resolve"]


def packaged(decl: EncoderDeclaration) -> Path:
    """The files of packaged encoder ``decl`` (its folder or weights file); ValueError if
    what it needs is not installed here."""
    if not decl.available():
        raise ValueError(f"encoder {decl.name!r} is not installed here: {decl.install}")
    module, _, attribute = decl.files.partition(":")
    found: object = importlib.import_module(module)
    if not attribute:  # the module's own folder
        return Path(str(getattr(found, "__file__", ""))).parent
    for part in attribute.split("."):
        found = getattr(found, part)
    return Path(found())  # type: ignore[operator]


def installed(name: str, modality: str) -> Path:
    """The files of packaged encoder ``name`` for ``modality`` (as :func:`packaged`)."""
    return packaged(pretrained(name, modality))


def _folder_files(folder: Path) -> list[Path]:
    """A folder's files in order, without Python's compiled caches (written when its code is
    first imported: not what the folder holds)."""
    return [f for f in sorted(folder.rglob("*"))
            if f.is_file() and "__pycache__" not in f.relative_to(folder).parts]


@functools.cache
def _folder_digest(path: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    del stamp  # part of the cache key only: a changed file is hashed again
    key = hashlib.sha256()
    for file in _folder_files(Path(path)):
        if file.is_file():
            key.update(str(file.relative_to(path)).encode())
            with file.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    key.update(chunk)
    return key.hexdigest()


@functools.cache
def _file_digest(path: str, size: int, mtime: int) -> str:
    del size, mtime  # part of the cache key only
    key = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            key.update(chunk)
    return key.hexdigest()


def digest(path: str | os.PathLike[str]) -> str:
    """sha256 of an encoder's files: a folder's every file (names and contents, in order;
    compiled Python caches left out), or one file's content. Hashed once per process while the files do not change."""
    where = Path(path)
    if where.is_dir():
        stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in _folder_files(where))
        return _folder_digest(str(where), stamp)
    stat = where.stat()
    return _file_digest(str(where), stat.st_size, stat.st_mtime_ns)


def resolve(decl: EncoderDeclaration, path: str | os.PathLike[str] | None = None) -> Path:
    """The files a new run on ``decl`` reads: a packaged encoder's, or (a user's own) ``path``."""
    if not decl.custom:
        return packaged(decl)
    if path is None:
        what = "the model's folder" if decl.modality == "text" else "its weights file"
        raise ValueError(f"encoder {decl.name!r} needs encoder_path: {what}")
    return Path(path).expanduser()


def recorded(decl: EncoderDeclaration, content: str, path: str | os.PathLike[str] | None = None) -> Path:
    """The files on this machine of the encoder a model records (``decl``, by its content
    digest ``content``): a packaged encoder's, or (a user's own) ``path``, checked against
    that digest; ValueError if they are not given, not here, or differ."""
    if decl.custom:
        where = Path(path).expanduser() if path is not None else None
        if where is None or not where.exists():
            raise ValueError(f"your own encoder {content[:12]} is not on this machine"
                             + (f" ({where} does not exist)" if where is not None else "")
                             + ": give its files (the library: encoder_path; the service fetches them "
                               "from its upload)")
        path = where
    else:
        path = packaged(decl)
    here = digest(path)
    if here != content:
        raise ValueError(f"encoder {decl.name!r} here ({here[:12]}) is not the one this model "
                         f"was trained on ({content[:12]}); install that version")
    return path
