"""/datasets: upload a user's .npz or AG-News-style CSV, referenced by id in specs."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile, status
from sqlalchemy import func, select

import app.services.datasets as datasets_service
from app.deps import AuthDep, SessionDep, SettingsDep
from app.errors import MAX_OFFSET, PayloadTooLarge
from app.models import DatasetUpload
from app.schemas import DatasetRead, Page

router = APIRouter(prefix="/datasets", tags=["datasets"])

CHUNK = 1 << 20


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=DatasetRead, dependencies=[AuthDep],
    summary="Upload an .npz (arrays x, y, optional class_names) or a CSV (class_index,title,description)",
)
async def upload(
    session: SessionDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="the .npz or .csv file")],
    kind: Annotated[str | None, Form(description="npz or ag-news; default: from the file name")] = None,
):
    # app.guard.RequestGuard has refused a body that declares more (413, unread).
    limit = settings.max_upload_bytes
    kind = datasets_service.guess_kind(file.filename or "", kind)
    # Starlette has spooled the part to a temporary file: move it, chunk by chunk, to the
    # one file the checks read, and let the spooled copy go at once.
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"upload{datasets_service.KINDS[kind]}"
        size = 0
        with path.open("wb") as out:
            while chunk := await file.read(CHUNK):
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"uploads are limited to {limit} bytes")
                out.write(chunk)
        await file.close()
        return datasets_service.create_upload(session, file.filename or "", kind, path)


@router.get("", response_model=Page[DatasetRead], summary="Uploaded datasets")
def list_(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
):
    rows = session.scalars(
        select(DatasetUpload).order_by(DatasetUpload.id.desc()).limit(limit).offset(offset)
    ).all()
    total = session.scalar(select(func.count()).select_from(DatasetUpload)) or 0
    return Page[DatasetRead](
        items=[DatasetRead.model_validate(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{dataset_id:int}", response_model=DatasetRead, summary="One uploaded dataset")
def get(dataset_id: int, session: SessionDep):
    return datasets_service.get_upload(session, dataset_id)
