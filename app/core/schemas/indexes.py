"""Indexes that /neighbors searches (POST /experiments/{id}/indexes)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.errors import MAX_ID
from app.core.schemas.common import Status, Timestamp
from corel.geometry import Geometry

IndexKind = Literal["auto", "exact", "hnsw"]


class IndexCreate(BaseModel):
    """What to index: the run's training split (the default) or a finished batch
    embedding job's rows; and how (``auto``: exact below COREL_INDEX_EXACT_BELOW_ROWS
    rows, HNSW from there)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "not": {"required": ["source", "embedding_job_id"]}})

    source: Literal["train"] | None = Field(
        default=None, description="The experiment's training split (the default when no "
        "embedding_job_id is given).")
    embedding_job_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="A succeeded batch embedding job of this experiment: its rows, in order.")
    kind: IndexKind = Field(default="auto", description="exact, hnsw, or auto (by size).")

    @model_validator(mode="after")
    def _one_source(self) -> IndexCreate:
        if self.source is not None and self.embedding_job_id is not None:
            raise ValueError('give either "source": "train" or "embedding_job_id", not both')
        return self


class IndexRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int
    source: Literal["train", "embedding_job"]
    embedding_job_id: int | None
    requested_kind: IndexKind
    kind: Literal["exact", "hnsw"] | None = Field(description="Decided when built.")
    geometry: Geometry
    status: Status
    n_total: int = Field(description="Rows to index.")
    n_done: int = Field(description="Rows indexed so far.")
    dim: int | None
    size_bytes: int | None = Field(description="The stored index's size.")
    build_seconds: float | None
    ef_search: int | None = Field(description="HNSW: the efSearch chosen at build time.")
    recall: float | None = Field(
        description="HNSW: recall@10 against exact search measured at build time on held-out rows.")
    params: dict[str, Any] | None
    error: str | None
    cancel_requested: bool
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
