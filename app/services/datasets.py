"""Uploaded datasets: validated once on arrival, stored in the database so any
worker on any machine can fetch them."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sqlalchemy.orm import Session

from app.errors import InvalidInput, NotFound, check_id
from app.models import DatasetBlob, DatasetUpload, utcnow
from corel.data import validate_ag_news_csv, validate_npz

KINDS = {"npz": ".npz", "ag-news": ".csv"}


def guess_kind(filename: str, kind: str | None) -> str:
    if kind is not None:
        if kind not in KINDS:
            raise InvalidInput(f"unknown dataset kind {kind!r}; allowed: {', '.join(KINDS)}")
        return kind
    suffix = Path(filename).suffix.lower()
    for name, ext in KINDS.items():
        if suffix == ext:
            return name
    raise InvalidInput(
        f"cannot tell the kind of {filename!r}: name it *.npz or *.csv, or pass kind=npz|ag-news"
    )


def validate(kind: str, path: Path) -> dict:
    """Run the library's own checks on the file; any problem is a 422 saying what is wrong."""
    try:
        return validate_npz(path) if kind == "npz" else validate_ag_news_csv(path)
    except (ValueError, OSError) as exc:
        # The library names the file it read; here that is a temporary path of the
        # server's, which is nobody's business: name the upload instead.
        reason = str(exc).replace(str(path), "the upload").replace(str(path.parent), "")
        raise InvalidInput(f"the uploaded {kind} file is not usable: {reason}") from exc


def create_upload(session: Session, filename: str, kind: str, path: Path) -> DatasetUpload:
    """Check the uploaded file where it lies, then store it: the only copy in memory is
    the one the database column is written from."""
    if path.stat().st_size == 0:
        raise InvalidInput("the uploaded file is empty")
    summary = validate(kind, path)
    data = path.read_bytes()
    upload = DatasetUpload(
        kind=kind,
        filename=Path(filename).name[:255] or f"upload{KINDS[kind]}",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        summary=summary,
        created_at=utcnow(),
    )
    upload.blob = DatasetBlob(data=data)
    session.add(upload)
    session.flush()
    return upload


def get_upload(session: Session, dataset_id: int) -> DatasetUpload:
    check_id("dataset", dataset_id)
    upload = session.get(DatasetUpload, dataset_id)
    if upload is None:
        raise NotFound(f"dataset {dataset_id} does not exist")
    return upload
