"""Models with names (POST /models): their numbered versions, and how /embed and /predict
name one (``"news:3"``)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.core.errors import MAX_ID
from app.core.schemas.common import OWNER, OwnerRead, Timestamp

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
NAME = re.compile(NAME_PATTERN)


class ModelCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(pattern=NAME_PATTERN, description="Lowercase letters, digits, '.', '_' and "
                      "'-', starting with a letter or digit; at most 64 characters; unique.")
    description: str | None = Field(default=None, max_length=2000)
    eval_dataset_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="A labelled upload that promotions evaluate candidates on (default: the test "
        "split the versions share).")


class VersionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    experiment_id: int = Field(ge=1, le=MAX_ID, description="A servable run the caller may read: "
                               "succeeded, or cancelled or pruned with a best checkpoint.")


class VersionRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    model: str = Field(description="The model's name.")
    version: int
    experiment_id: int
    created_at: Timestamp
    created_by: int | None = Field(default=None, description="The user who added it.")


class ModelRead(BaseModel):
    name: str
    description: str | None
    eval_dataset_id: int | None
    contract: dict[str, Any] | None = Field(
        description="What version 1 fixed and every version keeps: the inputs (texts, images "
        "or arrays, and their shape) and the class names; null before version 1.")
    versions: list[VersionRead]
    created_at: Timestamp
    public: bool
    owner: OwnerRead | None = OWNER
