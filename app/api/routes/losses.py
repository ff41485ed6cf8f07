"""``GET /losses``: every loss the service trains, as corel.loss_catalog declares it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from corel.geometry import Geometry
from corel.loss_catalog import DECLARATIONS

router = APIRouter(tags=["losses"])


class LossOption(BaseModel):
    field: str = Field(description="The spec field (null in a spec: this default).")
    default: float | str
    allowed: str = Field(description='The allowed values, e.g. "a number in [0, 90)".')
    keyword: str = Field(description="The head's (pytorch-metric-learning's) name for it.")
    doc: str


class LossRead(BaseModel):
    name: str
    display: str
    short: str
    similarity: str = Field(description="dot, cosine or gaussian: how the head scores.")
    geometry: Geometry = Field(description="The clustering and retrieval default.")
    class_vectors: bool
    prediction: str = Field(description="class vectors, or nearest class mean (pair-based losses).")
    params: list[str] = Field(description="The shared spec fields it reads (lam, gamma, ...).")
    min_lam: float | None
    in_paper: bool
    stackable: bool = Field(description="Whether sweeps train its members stacked.")
    source: str
    options: list[LossOption]


@router.get("/losses", response_model=list[LossRead], summary="Every loss, its parameters and ranges")
def list_losses() -> list[dict[str, Any]]:
    return [d.describe() for d in DECLARATIONS.values()]
