"""``GET /encoders``: every encoder a spec may name, as corel.encoder_catalog declares it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

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
    available: bool = Field(description="Whether what it needs is installed on this server.")
    install: str = Field(description="Where unavailable: the command that installs it.")
    export: str = Field(description="How a run of it exports (POST /experiments/{id}/export).")
    doc: str


@router.get("/encoders", response_model=list[EncoderRead],
            summary="Every encoder, the inputs it reads and how it trains")
def list_encoders() -> list[dict[str, Any]]:
    return [d.to_dict() for d in DECLARATIONS.values()]
