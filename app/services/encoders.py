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
by which any process finds the files again (:func:`app.storage.local_copies.local_files`).
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.access import policy
from app.core.errors import MAX_ID, InvalidInput, NotFound
from app.core.lookup import get_or_404, page_of
from app.core.models import EncoderUpload, utcnow
from app.core.settings import Settings
from app.storage import store_of
from app.storage.local_copies import KINDS, unpack_folder
from corel.encoder_catalog import declared_name

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
