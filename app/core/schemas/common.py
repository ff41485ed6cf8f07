"""What every domain's bodies share: statuses, timestamps, owners, pages, errors."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.core.models import STATUSES, as_utc

T = TypeVar("T")

Status = Literal["queued", "running", "succeeded", "failed", "cancelled", "pruned"]
"""app.core.models.Status, as the OpenAPI document states it."""
if set(get_args(Status)) != set(STATUSES):
    raise ImportError("app.core.schemas.Status differs from app.core.models.Status")

# Query and answer types of the reports: FastAPI refuses another value with a 422 that
# names the allowed ones and what was sent (app.core.errors.describe_error).
Split = Literal["test", "validation"]
"""The stored latent spaces a clustering report reads."""


# A timestamp as the API shows it: always with its UTC offset, whatever the database.
Timestamp = Annotated[datetime, AfterValidator(as_utc)]


class OwnerRead(BaseModel):
    """Who owns a row: a user's id and name; null for rows made with no users (the open
    mode) or by the bootstrap admin (COREL_API_TOKEN)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str


OWNER = Field(default=None, description="Its owner (id and name); null: made with no users "
              "or by the bootstrap admin (COREL_API_TOKEN).")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class ErrorBody(BaseModel):
    error: str
    detail: Any
