"""A user's own encoders (POST /encoders): checked on arrival, stored once per content,
shared like uploads, and fetched by whichever worker trains on one or process serves one.

Two kinds:

* ``sentence-transformers``: a zipped sentence-transformers folder (its ``modules.json`` at
  the root of the archive or of its one top folder). It is loaded offline, never with remote
  code, and must embed a sentence.
* ``timm``: a weights file (safetensors, or a PyTorch state dict) for a named timm
  architecture. Its keys and shapes must fit the architecture (the classifier's may be left
  out or given), and a forward pass must give finite features.

An accepted encoder is one row (:class:`app.core.models.EncoderUpload`) and its file one
artifact (app/storage, keyed by sha256: the same file uploaded twice is stored
once). A spec names it by ``encoder_id``; the runs trained on it record its content digest,
by which any process finds the files again (:func:`local_files`).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import uuid
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.access import policy
from app.core.errors import MAX_ID, InvalidInput, NotFound
from app.core.lookup import get_or_404, page_of
from app.core.models import EncoderUpload, utcnow
from app.core.settings import Settings
from app.storage import ArtifactMissing, store_of
from corel.encoder_catalog import declared_name

KINDS = ("sentence-transformers", "timm")
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
MAX_UNZIPPED_RATIO = 4
"""A zipped folder may unpack to at most this many times the encoder limit (a zip bomb is a 413)."""


def guess_kind(filename: str, kind: str | None) -> str:
    if kind is not None:
        if kind not in KINDS:
            raise InvalidInput(f"unknown encoder kind {kind!r}; allowed: {', '.join(KINDS)}")
        return kind
    name = filename.lower()
    if name.endswith(".zip"):
        return "sentence-transformers"
    if name.endswith(WEIGHT_SUFFIXES):
        return "timm"
    raise InvalidInput(f"cannot tell the kind of {filename!r}: a zipped sentence-transformers folder "
                       f"(*.zip) or a weights file ({', '.join(WEIGHT_SUFFIXES)}) for a timm "
                       "architecture; or pass kind=sentence-transformers|timm")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def create_encoder(session: Session, settings: Settings, filename: str, kind: str, path: Path,
                   architecture: str | None, name: str | None) -> EncoderUpload:
    """Check the uploaded encoder where it lies, then store it; a 422 says what is wrong
    (a 413 for an archive that unpacks too large). Nothing is stored unless all is well."""
    from corel.encoders import files, upload_summary

    if path.stat().st_size == 0:
        raise InvalidInput("the uploaded file is empty")
    if kind == "timm" and not architecture:
        raise InvalidInput("architecture: name the timm architecture the weights are for (e.g. "
                           "resnet18; timm.list_models() lists them)")
    if kind != "timm" and architecture:
        raise InvalidInput("architecture applies to kind timm (a weights file); a "
                           "sentence-transformers folder says its own in modules.json")
    sha = _sha256(path)
    try:
        if kind == "timm":
            summary = upload_summary(kind, path, architecture)
            digest, modality = sha, "image"
        else:
            with tempfile.TemporaryDirectory() as tmp:
                folder = unpack_folder(path, Path(tmp), settings.max_encoder_bytes * MAX_UNZIPPED_RATIO)
                summary = upload_summary(kind, folder)
                digest, modality = files.digest(folder), "text"
    except OverflowError as exc:
        from app.core.errors import PayloadTooLarge

        raise PayloadTooLarge(str(exc)) from exc
    except (ValueError, OSError) as exc:
        raise InvalidInput(f"the uploaded {kind} encoder is not usable: {exc}") from exc
    # The file into the artifact store (streamed; stored once per content) before the row.
    store_of(session).put_file(path)
    row = EncoderUpload(
        name=(name or Path(filename).stem or kind)[:64], kind=kind, modality=modality,
        architecture=architecture if kind == "timm" else None, features=summary["features"],
        filename=Path(filename).name[:255] or "encoder", size=path.stat().st_size, sha256=sha,
        digest=digest, summary=summary, created_at=utcnow())
    session.add(row)
    session.flush()
    return row


def referenced_encoder(session: Session, encoder_id: int) -> EncoderUpload:
    """The encoder a spec names by ``encoder_id``: a 404 if there is none (or the caller may
    not see it), a 403 if it may only read it (training on it is a write, as for uploads)."""
    row = session.get(EncoderUpload, encoder_id) if 1 <= encoder_id <= MAX_ID else None
    words = f"encoder_id {encoder_id} does not exist; upload your encoder with POST /encoders"
    if row is None:
        raise NotFound(words)
    try:
        policy.require(session, "encoder", encoder_id, "write")
    except policy.Hidden as exc:
        raise policy.Hidden(words) from exc
    return row


def check_spec_encoder(row: EncoderUpload, modality: str, dataset: str, named: str | None,
                       trainable_blocks: int | None = None) -> str:
    """How the spec names ``row`` (``sentence-transformers`` or ``timm:<architecture>``); a
    422 when it does not fit the dataset's modality, the spec names another encoder, or it
    asks to train more blocks than the encoder has (counted when it was uploaded)."""
    if trainable_blocks is not None and "blocks" in row.summary:
        blocks = row.summary["blocks"]
        if not blocks:
            raise InvalidInput(f"trainable_blocks: encoder_id {row.id} ({row.spec_name}) has no blocks "
                               "corel can count (a transformer's encoder.layer, a network's blocks or "
                               "stages); leave trainable_blocks out to fine-tune all of it")
        if trainable_blocks > blocks:
            raise InvalidInput(f"trainable_blocks is {trainable_blocks}; encoder_id {row.id} "
                               f"({row.spec_name}) has {blocks} blocks")
    if row.modality != modality:
        raise InvalidInput(f"encoder_id {row.id} is an {row.modality} encoder ({row.spec_name}), and "
                           f"dataset {dataset!r} holds {modality} inputs")
    if named is not None and declared_name(named) == declared_name(row.spec_name) and named != row.spec_name \
            and not named.endswith(":uploaded"):
        raise InvalidInput(f"encoder {named!r} is not encoder_id {row.id}'s ({row.spec_name}); "
                           "leave encoder out with encoder_id")
    return row.spec_name


def list_encoders(session: Session, limit: int, offset: int) -> tuple[list[EncoderUpload], int]:
    visible = policy.readable(policy.principal_of(session), EncoderUpload)
    return page_of(session, select(EncoderUpload).where(visible).order_by(EncoderUpload.id.desc()),
                   limit, offset)


def get_encoder(session: Session, encoder_id: int) -> EncoderUpload:
    return get_or_404(session, EncoderUpload, encoder_id, "encoder")


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
