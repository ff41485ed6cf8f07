"""Users, tokens, shares, the audit log and /me."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.errors import MAX_ID
from app.core.schemas.common import Timestamp

# --- users, tokens, shares and the audit log (issue 25) --------------------------------

class UserCreate(BaseModel):
    # strict: a JSON boolean is not 0, nor "5" the integer 5 (as the schema says).
    model_config = ConfigDict(strict=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    admin: bool = False


class UserRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    admin: bool
    created_at: Timestamp


class TokenCreate(BaseModel):
    model_config = ConfigDict(strict=True)

    scope: Literal["read", "write", "admin"] = "write"
    expires_days: float | None = Field(default=None, gt=0, le=3650,
                                       description="days until the token stops working; none: never")
    name: str | None = Field(default=None, min_length=1, max_length=64,
                             pattern=r"^[^\x00-\x1f\x7f]+$",
                             description="what the token is for (a laptop, a CI job), to tell it "
                             "apart in the list; printable characters")


class TokenRead(BaseModel):
    """A token as listed: never the token itself (only its hash is stored)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    user_id: int
    name: str | None
    scope: str
    created_at: Timestamp
    expires_at: Timestamp | None
    revoked_at: Timestamp | None
    last_used_at: Timestamp | None = Field(
        description="the last request it authenticated, to the minute (written at most once a minute)")


class TokenCreated(TokenRead):
    token: str = Field(description="The token itself: shown this once, stored only as a hash.")


class ShareCreate(BaseModel):
    """Share with a user (``user_id`` and ``access``), or make readable by every user or
    not (``public``)."""

    model_config = ConfigDict(strict=True)

    user_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    access: Literal["read", "write"] = "read"
    public: bool | None = None

    @model_validator(mode="after")
    def _one_of(self) -> ShareCreate:
        if (self.user_id is None) == (self.public is None):
            raise ValueError('give either "user_id" (with "access") or "public"')
        return self


class ShareRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="The share's id: DELETE .../shares/{share_id} removes it.")
    user_id: int
    access: str


class SharesRead(BaseModel):
    resource: str
    id: int
    owner_id: int | None
    public: bool
    shares: list[ShareRead]


class AuditRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: Timestamp
    user_id: int | None
    token_id: int | None
    client: str | None
    action: str
    resource: str | None
    resource_id: int | None
    outcome: str
    status: int | None
    detail: str | None


class MeRead(BaseModel):
    """Who the caller is, as its token says (the dashboard shows the admin pages by it)."""

    user_id: int | None = Field(description="The user; null for the open mode (no token and no "
                                "users), the bootstrap admin (COREL_API_TOKEN) and anonymous readers.")
    name: str
    scope: Literal["read", "write", "admin"]
    admin: bool
