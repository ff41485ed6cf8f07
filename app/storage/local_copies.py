"""Artifacts copied out of the store onto this machine where a library needs a path.

* A user's own encoder's files: written once into ``var_dir/cache/encoders`` (the weights
  file, or the unpacked folder), by the content digest the runs trained on it record. A
  worker that trains on one, and a process that serves or exports a model trained on one,
  find the files here (:func:`files_for_model`); corel checks them against the digest.
* An uploaded dataset's file (:func:`materialise_upload`), named for its loader.
"""

from __future__ import annotations

import os
import shutil
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import NotFound
from app.core.models import DatasetUpload, EncoderUpload
from app.core.settings import Settings
from app.storage import ArtifactMissing, store_of
from corel.encoder_catalog import declared_name

KINDS = ("sentence-transformers", "timm")
"""The kinds of a user's own encoder (POST /encoders)."""


def unpack_folder(archive: Path, into: Path, limit: int) -> Path:
    """Unpack a zipped sentence-transformers folder into ``into``; the folder holding its
    ``modules.json`` (the archive's root, or its one top folder). ValueError for a file that
    is not a zip, a member outside the folder, or one with no model; OverflowError when it
    unpacks to more than ``limit`` bytes."""
    if not zipfile.is_zipfile(archive):
        raise ValueError("not a .zip archive")
    try:
        with zipfile.ZipFile(archive) as z:
            members = z.infolist()
            total = sum(m.file_size for m in members)
            if total > limit:
                raise OverflowError(f"the archive unpacks to {total} bytes; the limit is {limit}")
            for m in members:
                parts = PurePosixPath(m.filename).parts
                if m.filename.startswith("/") or ".." in parts or ":" in m.filename:
                    raise ValueError(f"the archive's member {m.filename!r} lies outside its folder")
            z.extractall(into)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
        raise ValueError(f"the archive cannot be read ({exc})") from exc
    if (into / "modules.json").is_file():
        return into
    tops = [p for p in into.iterdir() if not p.name.startswith(("__MACOSX", "."))]
    if len(tops) == 1 and (tops[0] / "modules.json").is_file():
        return tops[0]
    raise ValueError("no modules.json at the archive's root or in its one top folder: zip the "
                     "folder that SentenceTransformer.save wrote")


def local_files(session: Session, settings: Settings, row: EncoderUpload) -> Path:
    """The encoder's files on this machine (its weights file, or its unpacked folder), written
    once from the artifact store into ``var_dir/cache/encoders``: the path a run on it, or a
    model trained on it, is given (corel checks it against the encoder's digest)."""
    base = settings.var_dir.resolve() / "cache" / "encoders"
    target = base / (f"{row.digest[:32]}.weights" if row.kind == "timm" else row.digest[:32])
    if not target.exists():
        try:
            source = store_of(session).local_path(row.sha256)
        except ArtifactMissing as exc:
            raise ValueError(f"encoder {row.id}'s files are missing from the artifact store") from exc
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".{uuid.uuid4().hex}.tmp"
        try:
            shutil.copyfile(source, tmp)
            if row.kind == "timm":
                tmp.replace(target)
            else:
                unpacked = base / f".{uuid.uuid4().hex}.dir"
                folder = unpack_folder(tmp, unpacked, max(tmp.stat().st_size, 1) * 1000)
                try:
                    folder.rename(target)  # whole, or not at all (another process may have won)
                except OSError:
                    if not target.exists():
                        raise
                shutil.rmtree(unpacked, ignore_errors=True)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def files_for_model(session: Session, settings: Settings, preprocessing: dict[str, Any]) -> Path | None:
    """Before a model trained on a user's own encoder is served here: its files on this
    machine, by the digest its checkpoint records (whoever may read the model may run its
    encoder); None for a model on no encoder or a packaged one."""
    from corel.encoders.record import EncoderRecord

    record = EncoderRecord.of(preprocessing)
    if record is None or declared_name(record.name) not in KINDS:
        return None
    row = session.scalar(select(EncoderUpload).where(EncoderUpload.digest == record.digest).limit(1))
    if row is None:
        raise NotFound(f"the encoder this model was trained on ({record.name}, {record.digest[:12]}) "
                       "is no longer stored")
    return local_files(session, settings, row)


def materialise_upload(session: Session, dataset_id: int, settings: Settings) -> Path:
    """Uploads live in the artifact store; a worker reads a local copy named for the loader
    (``.csv`` or ``.npz``): a link to the store's file where it can, else a copy."""
    upload = session.get(DatasetUpload, dataset_id)
    if upload is None:
        raise ValueError(f"dataset {dataset_id} no longer exists")
    suffix = ".csv" if upload.kind == "ag-news" else ".npz"  # tables are stored as .npz
    path = settings.var_dir.resolve() / "cache" / f"dataset-{dataset_id}-{upload.sha256[:16]}{suffix}"
    if not path.exists():
        source = store_of(session).local_path(upload.blob_sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{uuid.uuid4().hex}.tmp")
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)
        tmp.replace(path)
    return path
