"""/datasets: upload a user's data (.npz, AG News's CSV, or a table), referenced by id in specs."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile, status
from fastapi.responses import FileResponse, Response

import app.services.datasets as datasets_service
from app.api.deps import AuthDep, ReadSessionDep, SessionDep, SettingsDep
from app.core.errors import MAX_OFFSET, PayloadTooLarge, check_id
from app.core.schemas.common import Page
from app.core.schemas.datasets import BuiltinDatasetRead, BuiltinDatasets, DatasetRead
from app.services import builtin as builtin_service
from app.services import rows as rows_service

router = APIRouter(prefix="/datasets", tags=["datasets"])

CHUNK = 1 << 20


async def spool(file: UploadFile, path: Path, limit: int, what: str) -> None:
    """Move an uploaded part (Starlette has spooled it to a temporary file), chunk by chunk,
    to the one file the checks read, and let the spooled copy go at once; a 413 past
    ``limit`` bytes (``what`` says which limit)."""
    size = 0
    with path.open("wb") as out:
        while chunk := await file.read(CHUNK):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"{what} are limited to {limit} bytes")
            out.write(chunk)
    await file.close()


@router.post(
    "", status_code=status.HTTP_201_CREATED, response_model=DatasetRead, dependencies=[AuthDep],
    summary="Upload an .npz (x, y), AG News's CSV, or a CSV/Parquet table with named columns "
    "(features + label, or text + label)",
)
async def upload(
    session: SessionDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="the .npz, .csv or .parquet file (a CSV's cells "
                                                 "separated by commas, semicolons, tabs or |)")],
    kind: Annotated[Literal["npz", "ag-news", "features", "text", "images"] | None, Form(
        description="npz, ag-news, features (numeric columns + a label; trains as npz) or text "
        "(a text column + a label; trains as text); default: from the file name and content")] = None,
    label_column: Annotated[str | None, Form(
        description="tables: the label column (default: one named label, class, target, y, "
        "category or topic)")] = None,
    text_column: Annotated[str | None, Form(
        description="text tables: the text column (default: the one other column, or one named "
        "text, body, content, ...)")] = None,
    split_column: Annotated[str | None, Form(
        description="tables: a column that names each row's split (train, validation or test); "
        "default: a seeded, stratified split")] = None,
    standardize: Annotated[bool, Form(
        description="feature tables: standardise each feature with the training split's mean and "
        "standard deviation (recorded, and applied again at serve time)")] = False,
):
    # app.api.middleware.RequestGuard has refused a body that declares more (413, unread).
    limit = settings.max_upload_bytes
    name = file.filename or ""
    chosen = datasets_service.guess_kind(name, kind)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"upload{datasets_service.suffix_for(name, chosen)}"
        await spool(file, path, limit, "uploads")
        options = datasets_service.TableOptions(label_column, text_column, standardize, split_column)
        return datasets_service.create_upload(session, name, chosen, path, options,
                                              max_pixels=settings.max_image_pixels)


@router.get("", response_model=Page[DatasetRead], summary="Uploaded datasets")
def list_(
    session: ReadSessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
):
    rows, total = datasets_service.list_uploads(session, limit, offset)
    return Page[DatasetRead](
        items=[DatasetRead.model_validate(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/builtin", response_model=BuiltinDatasets,
            summary="The built-in datasets: present on this server, or why not")
def builtin(settings: SettingsDep):
    return BuiltinDatasets(items=[BuiltinDatasetRead.model_validate(a)
                                  for a in builtin_service.availability(settings)])


@router.get("/{dataset_id:int}", response_model=DatasetRead, summary="One uploaded dataset")
def get(dataset_id: int, session: ReadSessionDep):
    return datasets_service.get_upload(session, dataset_id)


@router.get(
    "/{dataset_id:int}/file", response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}},
                     "description": "the stored file: the upload as sent, or the .npz a table or "
                                    "an image folder became"}},
    summary="Download an upload's stored file (streamed; answers Range, ETag: its sha256)",
)
def file(dataset_id: int, session: SessionDep) -> FileResponse:
    path, digest, name = datasets_service.stored_file(session, dataset_id)
    return FileResponse(path, media_type="application/octet-stream", filename=name,
                        headers={"etag": f'"{digest}"'})


_PNG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/png": {}}, "description": "the row's image, as PNG"}}


@router.get("/builtin/{dataset}/rows/{row:int}/image", response_class=Response, responses=_PNG,
            summary="A row of a built-in image dataset's training file, as PNG (a neighbour's image_url)")
def builtin_row_image(dataset: Literal["digits", "mnist", "fashion-mnist"], row: int,
                      settings: SettingsDep) -> Response:
    return Response(rows_service.builtin_image(settings, dataset, row), media_type="image/png",
                    headers={"cache-control": "max-age=3600"})


@router.get("/{dataset_id:int}/rows/{row:int}/image", response_class=Response, responses=_PNG,
            summary="A row of an uploaded image folder, as PNG (a neighbour's image_url)")
def row_image(dataset_id: int, row: int, session: SessionDep) -> Response:
    check_id("dataset", dataset_id)
    return Response(rows_service.upload_image(session, dataset_id, row), media_type="image/png")
