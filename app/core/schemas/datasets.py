"""Datasets: the built-in ones and uploads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.core.schemas.common import OWNER, OwnerRead, Timestamp


class BuiltinDatasetRead(BaseModel):
    """A built-in dataset on this server: ``present`` (with the folder or file training
    reads, if any), ``downloadable`` (a worker downloads it when a run first needs it), or
    ``unavailable`` (with why, and the setting to change)."""

    model_config = ConfigDict(from_attributes=True)

    dataset: Literal["mnist", "fashion-mnist", "ag-news", "digits"]
    status: Literal["present", "downloadable", "unavailable"]
    where: str | None
    why: str | None


class BuiltinDatasets(BaseModel):
    items: list[BuiltinDatasetRead]


class DatasetRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    filename: str
    size: int = Field(description="Bytes of the file as uploaded.")
    sha256: str = Field(description="sha256 of the file as uploaded (a table or an image "
                        "folder is stored converted; this is of the user's own file).")
    summary: dict[str, Any]
    created_at: Timestamp
    owner: OwnerRead | None = OWNER
