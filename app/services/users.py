"""Users and their API tokens (the API's admin routes and ``corel users`` / ``corel
tokens`` share these). Services only flush; the session scope commits."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.auth import Scope, new_token, token_digest
from app.errors import Conflict, InvalidInput
from app.models import ApiToken, User, utcnow
from app.services.lookup import get_or_404


def create_user(session: Session, name: str, admin: bool = False) -> User:
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"a user named {name!r} exists already")
    user = User(name=name, admin=admin, created_at=utcnow())
    session.add(user)
    session.flush()
    return user


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.id)))


def user_named(session: Session, name: str) -> User:
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        raise InvalidInput(f"there is no user named {name!r}")
    return user


def create_token(session: Session, user_id: int, scope: Scope = "write",
                 expires_days: float | None = None) -> tuple[ApiToken, str]:
    """A new token for the user: the row (holding only its digest) and the token itself,
    which exists nowhere else once returned."""
    user = get_or_404(session, User, user_id, "user")
    if scope == "admin" and not user.admin:
        raise InvalidInput(f"scope: user {user.name!r} is not an admin; an admin token needs one")
    token = new_token()
    now = utcnow()
    row = ApiToken(user_id=user.id, token_sha256=token_digest(token), scope=scope, created_at=now,
                   expires_at=now + timedelta(days=expires_days) if expires_days else None)
    session.add(row)
    session.flush()
    return row, token


def revoke_token(session: Session, token_id: int) -> ApiToken:
    """Revoked at once: every API process checks tokens on every request."""
    row = get_or_404(session, ApiToken, token_id, "token")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return row
