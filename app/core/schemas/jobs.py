"""Batch embedding jobs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from app.core.schemas.common import Status, Timestamp


class EmbeddingJobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    dataset_id: int = Field(description="An uploaded dataset (POST /datasets): every row is embedded.")


class EmbeddingJobRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int
    dataset_id: int
    status: Status
    n_total: int
    n_done: int
    dim: int | None
    error: str | None
    cancel_requested: bool
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
