"""A user's own encoders (POST /encoders)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.schemas.common import OWNER, OwnerRead, Timestamp


class EncoderUploadRead(BaseModel):
    """A user's own encoder (POST /encoders): a spec names it by ``encoder_id``."""

    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="A spec names it as encoder_id.")
    name: str
    kind: str = Field(description="sentence-transformers (a zipped folder) or timm (a weights file).")
    modality: str = Field(description="The inputs it reads: text or image.")
    architecture: str | None = Field(description="timm's architecture; null for a folder.")
    spec_name: str = Field(description="How the runs trained on it name it (their spec's encoder).")
    features: int = Field(description="The width of its output, which the head trains over.")
    filename: str
    size: int = Field(description="Bytes of the file as uploaded.")
    sha256: str = Field(description="sha256 of the file as uploaded: its files are stored once "
                        "per sha256, however many uploads send them.")
    digest: str = Field(description="The encoder's content digest, as the runs on it record it.")
    summary: dict[str, Any]
    created_at: Timestamp
    owner: OwnerRead | None = OWNER
