"""``/encoders``: every encoder a spec may name, as corel.encoder_catalog declares it
(``GET /encoders``), and the user's own (``POST /encoders``: a zipped sentence-transformers
folder or timm weights, checked, then named by ``encoder_id``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile, status
from pydantic import BaseModel, Field

import app.services.encoders as encoders_service
from app.api.deps import AuthDep, SessionDep, SettingsDep
from app.api.routes.datasets import spool
from app.core.errors import MAX_OFFSET
from app.core.schemas.common import Page
from app.core.schemas.encoders import EncoderUploadRead
from corel.encoder_catalog import DECLARATIONS, Input, Modality

router = APIRouter(tags=["encoders"])


class EncoderRead(BaseModel):
    name: str = Field(description="As a spec's `model` names it; one name may cover several modalities.")
    modality: Modality = Field(description="The inputs it reads: the datasets of this modality may use it.")
    display: str
    input: Input = Field(description="What the data loader prepares for it.")
    input_description: str
    width: int | None = Field(description="The width of its output; null: the spec's `hidden`.")
    dropout: float
    freezable: bool = Field(description="Whether a head may train on it with its weights frozen.")
    pretrained: bool = Field(description="A pretrained encoder: a spec names it as its `encoder`.")
    features: int | None = Field(description="A pretrained encoder's own output width.")
    modes: list[str] = Field(description="How a spec may train it (`encoder_mode`).")
    custom: bool = Field(description="A family of your own encoders (POST /encoders), not one encoder.")
    available: bool = Field(description="Whether what it needs is installed on this server.")
    install: str = Field(description="Where unavailable: the command that installs it.")
    export: str = Field(description="How a run of it exports (POST /experiments/{id}/export).")
    doc: str


@router.get("/encoders", response_model=list[EncoderRead],
            summary="Every encoder, the inputs it reads and how it trains")
def list_encoders() -> list[dict[str, Any]]:
    return [d.to_dict() for d in DECLARATIONS.values()]


@router.post(
    "/encoders", status_code=status.HTTP_201_CREATED, response_model=EncoderUploadRead,
    dependencies=[AuthDep],
    summary="Upload your own encoder: a zipped sentence-transformers folder, or a weights file "
    "(safetensors or a PyTorch state dict) for a timm architecture",
)
async def upload_encoder(
    session: SessionDep,
    settings: SettingsDep,
    file: Annotated[UploadFile, File(description="the .zip of a sentence-transformers folder, or the "
                                                 "weights file")],
    kind: Annotated[Literal["sentence-transformers", "timm"] | None, Form(
        description="default: from the file name (.zip: sentence-transformers; .safetensors, .pt, "
        ".pth, .bin: timm)")] = None,
    architecture: Annotated[str | None, Form(
        max_length=128, description="timm: the architecture the weights are for (e.g. resnet18)")] = None,
    name: Annotated[str | None, Form(max_length=64, description="default: the file's name")] = None,
):
    # app.api.middleware.RequestGuard has refused a body that declares more (413, unread).
    limit = settings.max_encoder_bytes
    filename = file.filename or ""
    chosen = encoders_service.guess_kind(filename, kind)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("encoder.zip" if chosen == "sentence-transformers" else "weights")
        await spool(file, path, limit, "encoders (COREL_MAX_ENCODER_BYTES)")
        return encoders_service.create_encoder(session, settings, filename, chosen, path, architecture, name)


@router.get("/encoders/uploads", response_model=Page[EncoderUploadRead],
            summary="Your own encoders (and those shared with you)")
def list_uploaded(
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
):
    rows, total = encoders_service.list_encoders(session, limit, offset)
    return Page[EncoderUploadRead](items=[EncoderUploadRead.model_validate(r) for r in rows],
                                   total=total, limit=limit, offset=offset)


@router.get("/encoders/{encoder_id:int}", response_model=EncoderUploadRead,
            summary="One of your own encoders")
def get_encoder(encoder_id: int, session: SessionDep):
    return encoders_service.get_encoder(session, encoder_id)
