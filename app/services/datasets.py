"""Uploaded datasets: validated once on arrival, stored in the database so any
worker on any machine can fetch them.

Kinds: ``npz`` (arrays x, y), ``ag-news`` (AG News's positional CSV), and tables with
named columns, CSV or Parquet: ``features`` (numeric columns and a label; stored as the
``npz`` it becomes, so it trains as ``"dataset": "npz"``) and ``text`` (a text column and
a label; trains as ``"dataset": "text"``); and image folders, a .zip or .tar.gz of
``class_name/*.png|jpg`` (``images``; stored as the .npz of its resized pixels).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.access import policy
from app.core.errors import MAX_ID, InvalidInput, NotFound, PayloadTooLarge
from app.core.lookup import get_or_404, page_of
from app.core.models import DatasetUpload, utcnow
from app.storage import store_of
from corel.data import tables, validate_ag_news_csv, validate_npz
from corel.data.image_folders import MAX_PIXELS, ImageTooLarge, read_image_folder

# The kinds an upload may be, and the kind (dataset name) it is stored and trained as.
STORED_AS = {"npz": "npz", "ag-news": "ag-news", "features": "npz", "text": "text",
             "images": "images"}
KINDS = tuple(STORED_AS)
TABLE_SUFFIXES = (".csv", ".parquet", ".pq")
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar")
SUFFIXES = {"npz": ".npz", "ag-news": ".csv"}


@dataclass(frozen=True)
class TableOptions:
    """The form fields of a table upload."""

    label_column: str | None = None
    text_column: str | None = None
    standardize: bool = False
    split_column: str | None = None


def guess_kind(filename: str, kind: str | None) -> str:
    """The upload's kind: given, or from the name (``.npz``; ``.csv`` and ``.parquet``
    are tables, told apart by their content later, except AG News's CSV)."""
    if kind is not None:
        if kind not in KINDS:
            raise InvalidInput(f"unknown dataset kind {kind!r}; allowed: {', '.join(KINDS)}")
        return kind
    suffix = Path(filename).suffix.lower()
    if suffix == ".npz":
        return "npz"
    if suffix in TABLE_SUFFIXES:
        return "table"
    if filename.lower().endswith(ARCHIVE_SUFFIXES):
        return "images"
    raise InvalidInput(
        f"cannot tell the kind of {filename!r}: name it *.npz, *.csv, *.parquet, *.zip or "
        f"*.tar.gz, or pass kind={'|'.join(KINDS)}")


def suffix_for(filename: str, kind: str) -> str:
    if kind in SUFFIXES:
        return SUFFIXES[kind]
    if kind == "images":
        return ".archive"
    suffix = Path(filename).suffix.lower()
    return suffix if suffix in TABLE_SUFFIXES else ".csv"


def _looks_like_ag_news(path: Path) -> bool:
    """AG News's CSV has no header: its first cell is a class index."""
    with path.open("rb") as fh:
        first = fh.readline(4096).decode("utf-8", errors="replace")
    cell = first.split(",", 1)[0].strip().strip('"')
    return cell.isdigit()


def _reason(exc: Exception, path: Path) -> str:
    # The library names the file it read; here that is a temporary path of the
    # server's, which is nobody's business: name the upload instead.
    return str(exc).replace(str(path), "the upload").replace(str(path.parent), "")


def _table(path: Path, kind: str, options: TableOptions) -> tuple[str, bytes, dict[str, Any]]:
    """A table upload as the .npz it trains from, with its summary."""
    fmt = "parquet" if path.suffix in (".parquet", ".pq") else "csv"
    table = tables.read_table(path, fmt)
    if kind == "table":  # not given: numbers besides the label (typos aside) mean features
        try:
            label: str | None = tables.pick_label(table, options.label_column,
                                                  [options.split_column] if options.split_column else [])
        except ValueError:  # said again, with the table's kind, below
            label = None
        others = [n for n in table.column_names if n not in (label, options.split_column)]
        kind = "features" if others and all(tables.looks_numeric(table, n) for n in others) else "text"
    if kind == "features":
        arrays = tables.feature_table(table, options.label_column, options.split_column)
        arrays["standardize"] = np.array([options.standardize])
        extra = {"feature_columns": arrays["feature_names"], "num_features": int(arrays["x"].shape[1]),
                 "standardize": options.standardize}
    else:
        arrays = tables.text_table(table, options.text_column, options.label_column,
                                   options.split_column)
        extra = {"text_column": arrays["text_column"]}
    names = arrays["class_names"]
    summary = {"source": f"{kind} table ({fmt})", "n": len(arrays["y"]),
               "label_column": arrays["label_column"], "num_classes": len(names),
               "class_names": names,
               "class_counts": np.bincount(arrays["y"], minlength=len(names)).tolist(), **extra}
    if "split" in arrays:
        summary["split_column"] = options.split_column
        summary["split_counts"] = dict(zip(("train", "validation", "test"),
                                           np.bincount(arrays["split"], minlength=3).tolist(),
                                           strict=True))
    return STORED_AS[kind], tables.to_npz(arrays), summary


def _images(path: Path, max_pixels: int) -> tuple[str, bytes, dict[str, Any]]:
    folder = read_image_folder(path, max_pixels=max_pixels)
    names = folder["class_names"]
    summary = {"source": "image folder", "n": len(folder["y"]), "num_classes": len(names),
               "class_names": names,
               "class_counts": np.bincount(folder["y"], minlength=len(names)).tolist(),
               "channels": folder["channels"], "size": list(folder["size"])}
    return "images", tables.to_npz(folder), summary


def create_upload(session: Session, filename: str, kind: str, path: Path,
                  options: TableOptions | None = None, max_pixels: int = MAX_PIXELS) -> DatasetUpload:
    """Check the uploaded file where it lies, then store it (a table as the .npz it
    becomes); any problem is a 422 saying what is wrong (a 413 for an image that declares
    more than ``max_pixels``)."""
    if path.stat().st_size == 0:
        raise InvalidInput("the uploaded file is empty")
    if kind == "table" and path.suffix == ".csv" and _looks_like_ag_news(path):
        kind = "ag-news"
    data: bytes | None
    try:
        if kind in ("npz", "ag-news"):
            summary = validate_npz(path) if kind == "npz" else validate_ag_news_csv(path)
            stored, data = kind, None  # stored as sent: streamed from the file
        elif kind == "images":
            stored, data, summary = _images(path, max_pixels)
        else:
            stored, data, summary = _table(path, kind, options or TableOptions())
    except ImageTooLarge as exc:
        raise PayloadTooLarge(f"the uploaded images file is not usable: {exc} "
                              "(COREL_MAX_IMAGE_PIXELS)") from None
    except (ValueError, OSError) as exc:
        shown = kind if kind != "table" else "table"
        raise InvalidInput(f"the uploaded {shown} file is not usable: {_reason(exc, path)}") from exc
    # The size and sha256 of the user's file as sent (a table or an image folder is
    # stored converted, but the user checks the answer against the file they have).
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    # The file into the artifact store before the row exists (an unreachable store: a 503,
    # and no row).
    store = store_of(session)
    art = store.put_file(path) if data is None else store.put_bytes(data)
    upload = DatasetUpload(
        kind=stored,
        blob_sha256=art.sha256,
        filename=Path(filename).name[:255] or f"upload{SUFFIXES.get(stored, '.npz')}",
        size=path.stat().st_size,
        sha256=digest.hexdigest(),
        summary=summary,
        created_at=utcnow(),
    )
    session.add(upload)
    session.flush()
    return upload


def referenced_upload(session: Session, dataset_id: int) -> DatasetUpload:
    """The upload a request body names by ``dataset_id`` to train on or embed: a 404 if
    there is none (the schema can say what an id looks like, not which ids exist) or the
    caller may not see it, a 403 if it may only read it (a job made from an upload needs
    write access to it, as every write needs to what it names)."""
    upload = session.get(DatasetUpload, dataset_id) if 1 <= dataset_id <= MAX_ID else None
    if upload is None:
        raise NotFound(f"dataset_id {dataset_id} does not exist; upload with POST /datasets")
    try:
        policy.require(session, "dataset", dataset_id, "write")
    except policy.Hidden as exc:  # another user's private upload: as if there were none
        raise policy.Hidden(f"dataset_id {dataset_id} does not exist; upload with POST /datasets") from exc
    return upload


def list_uploads(session: Session, limit: int, offset: int) -> tuple[list[DatasetUpload], int]:
    """A page of uploads, newest first, and how many there are."""
    visible = policy.readable(policy.principal_of(session), DatasetUpload)
    return page_of(session, select(DatasetUpload).where(visible).order_by(DatasetUpload.id.desc()),
                   limit, offset)


def get_upload(session: Session, dataset_id: int) -> DatasetUpload:
    return get_or_404(session, DatasetUpload, dataset_id, "dataset")


def stored_file(session: Session, dataset_id: int) -> tuple[Path, str, str]:
    """The upload's stored file as a local file to stream from (verified against its
    digest), its digest, and the name to give it: the file as sent, or (a table, an image
    folder) the .npz it became."""
    upload = get_upload(session, dataset_id)
    name = upload.filename
    if upload.blob_sha256 != upload.sha256:  # stored converted
        name = f"{Path(upload.filename).stem or 'upload'}.npz"
    return store_of(session).local_path(upload.blob_sha256), upload.blob_sha256, name
