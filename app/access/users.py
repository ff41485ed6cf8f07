"""Users and their API tokens (the API's admin routes and ``corel users`` / ``corel
tokens`` share these). Services only flush; the session scope commits."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.access import policy
from app.access.tokens import Scope, new_token, token_digest
from app.core.errors import Conflict, InvalidInput
from app.core.lookup import get_or_404
from app.core.models import ApiToken, EmbeddingJob, Experiment, NeighborIndex, User, utcnow


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
                 expires_days: float | None = None, name: str | None = None) -> tuple[ApiToken, str]:
    """A new token for the user: the row (holding only its digest) and the token itself,
    which exists nowhere else once returned."""
    user = get_or_404(session, User, user_id, "user")
    if scope == "admin" and not user.admin:
        raise InvalidInput(f"scope: user {user.name!r} is not an admin; an admin token needs one")
    token = new_token()
    now = utcnow()
    if name is not None and (not 1 <= len(name) <= 64
                             or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise InvalidInput("name: a token's name has 1 to 64 printable characters")
    row = ApiToken(user_id=user.id, token_sha256=token_digest(token), scope=scope, created_at=now,
                   expires_at=now + timedelta(days=expires_days) if expires_days else None,
                   name=name)
    session.add(row)
    session.flush()
    return row, token


def list_tokens(session: Session, user_id: int) -> list[ApiToken]:
    """A user's tokens, newest first, revoked and expired ones included (never the
    tokens themselves: only their hashes are stored)."""
    get_or_404(session, User, user_id, "user")
    return list(session.scalars(select(ApiToken).where(ApiToken.user_id == user_id)
                                .order_by(ApiToken.id.desc())))


def revoke_token(session: Session, token_id: int, user_id: int | None = None) -> ApiToken:
    """Revoked at once: every API process checks tokens on every request. ``user_id``:
    only a token of this user (another's is a 404, as one that does not exist)."""
    row = get_or_404(session, ApiToken, token_id, "token")
    if user_id is not None and row.user_id != user_id:  # another user's: as if there were none
        raise policy.Hidden(f"token {token_id} does not exist; GET /me/tokens lists yours")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return row


# What ``corel users adopt`` hands over, in this order: a sweep's members go with it, and
# an experiment's batch jobs and indexes with it.
ADOPTABLE = ("sweep", "experiment", "dataset", "embedding_job", "index")


def adopt(session: Session, user: User, kind: str | None = None,
          ids: list[int] | None = None) -> dict[str, list[int]]:
    """Hand rows without an owner (made before any user existed, or by the bootstrap
    admin) to ``user``: every such row, or those of one ``kind`` (``ids``: only these,
    with what goes with them). Rows that have an owner are never taken from it: naming one
    is an error, and nothing is handed over then. Returns the ids handed over, by kind."""
    if kind is not None and kind not in ADOPTABLE:
        raise InvalidInput(f"kind: {kind!r} is not one of {', '.join(ADOPTABLE)}")
    if ids and kind is None:
        raise InvalidInput("ids need their kind (--kind)")
    chosen: dict[str, list[int]] = {}
    for k in ADOPTABLE if kind is None else (kind,):
        model = policy.KINDS[k][0]
        if ids:
            rows = {r.id: r for r in session.scalars(select(model).where(model.id.in_(ids)))}
            for i in ids:
                if i not in rows:
                    raise InvalidInput(f"{policy.KINDS[k][1]} {i} does not exist")
                if rows[i].owner_id is not None and rows[i].owner_id != user.id:
                    raise Conflict(f"{policy.KINDS[k][1]} {i} is owned by user "
                                   f"{rows[i].owner_id}; only rows without an owner are adopted")
            chosen[k] = [i for i in ids if rows[i].owner_id is None]
        else:
            chosen[k] = list(session.scalars(select(model.id).where(model.owner_id.is_(None))
                                             .order_by(model.id)))
    if ids and kind in ("sweep", "experiment"):  # what goes with them
        if kind == "sweep":
            chosen["experiment"] = list(session.scalars(select(Experiment.id).where(
                Experiment.sweep_id.in_(chosen["sweep"]), Experiment.owner_id.is_(None))))
        made_under = chosen.get("experiment", [])
        for k, model in (("embedding_job", EmbeddingJob), ("index", NeighborIndex)):
            chosen[k] = list(session.scalars(select(model.id).where(
                model.experiment_id.in_(made_under), model.owner_id.is_(None))))
    for k, found in chosen.items():
        model = policy.KINDS[k][0]
        if found:
            session.execute(update(model).where(model.id.in_(found), model.owner_id.is_(None))
                            .values(owner_id=user.id))
    session.flush()
    return {k: v for k, v in chosen.items() if v}
