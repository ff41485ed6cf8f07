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


class ModelUpdate(BaseModel):
    """PATCH /models/{name}: the fields given change; an eval_dataset_id of null clears it."""

    model_config = ConfigDict(extra="forbid", strict=True)

    description: str | None = Field(default=None, max_length=2000)
    eval_dataset_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="A labelled upload you may read, of the model's inputs and classes, that "
        "promotions evaluate the candidate and the incumbent on (each embeds its rows); null: the "
        "test split the versions share.")


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


class CollectionBuildRead(BaseModel):
    build_id: int
    version: int
    status: str
    embedding_job_id: int | None
    index_id: int | None
    error: str | None = None


class CollectionRead(BaseModel):
    dataset_id: int
    builds: list[CollectionBuildRead] = Field(description="One per version that embedded it.")


class CollectionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    dataset_id: int = Field(ge=1, le=MAX_ID, description="An upload you may read, of the model's inputs.")


class ModelRead(BaseModel):
    name: str
    description: str | None
    eval_dataset_id: int | None
    contract: dict[str, Any] | None = Field(
        description="What version 1 fixed and every version keeps: the inputs (texts, images "
        "or arrays, and their shape) and the class names; null before version 1.")
    versions: list[VersionRead]
    aliases: dict[str, int] = Field(description="Each alias's version.")
    protected_aliases: list[str] = Field(description="The aliases only the owner or an admin may move.")
    collections: list[CollectionRead] = Field(description="The datasets it keeps embedded and indexed "
                                              "by each aliased version.")
    created_at: Timestamp
    public: bool
    owner: OwnerRead | None = OWNER


class PromotionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    version: int = Field(ge=1, le=MAX_ID, description="The version the alias should name.")
    expected_version: int | None = Field(
        ge=1, le=MAX_ID, description="The version the alias names now (null for a new alias): "
        "the flip happens only if it still does (compare and swap).")
    force: bool = Field(default=False, description="Skip the gate (the model's owner or an admin).")
    margin: float = Field(default=0.01, gt=0, le=1, description="How much worse than the incumbent "
                          "the candidate may be, at the lower bound of the 95 % interval of accuracy "
                          "and of MAP@R.")
    protected: bool | None = Field(default=None, description="Mark the alias protected (moved only "
                                   "by the owner or an admin) or not, at the flip (owner or admin).")


class PromotionRead(BaseModel):
    promotion_id: int
    model: str
    alias: str
    version: int
    expected_version: int | None
    force: bool
    margin: float
    status: str = Field(description="queued; gating or embedding while it runs; then succeeded, "
                        "refused (the gate said no), conflict (the alias moved meanwhile) or failed.")
    report: dict[str, Any] | None = Field(default=None, description="The gate's report: both "
                                          "versions' figures, the differences with their 95 % "
                                          "intervals, per-class recall, passed, and the reason "
                                          "when refused.")
    error: str | None = None
    created_at: Timestamp
    finished_at: Timestamp | None = None


class AliasMoveRead(BaseModel):
    alias: str
    from_version: int | None
    to_version: int
    user_id: int | None
    at: Timestamp
    promotion_id: int | None
    gate: dict[str, Any] | None


class ModelNeighborsRequest(BaseModel):
    """POST /models/{name}/neighbors: inputs as /embed takes them (the model's alias is the
    run), a collection, and how many neighbours."""

    model_config = ConfigDict(extra="allow")

    alias: str = Field(description="The alias whose version embeds the inputs and whose index is searched.")
    collection: int = Field(ge=1, le=MAX_ID, description="The collection's dataset id.")
    k: int = Field(default=10, ge=1, le=1000)
