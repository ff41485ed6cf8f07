"""What a principal may see and change: owners, shares, public rows.

- An admin (the open mode, the bootstrap admin, an admin token) may do anything.
- Experiments, sweeps, uploads, uploaded encoders and models (by name) are private to their owner, who (or an admin) may share
  one with another user for reading or writing, or make it readable by every user. A
  sweep's members are readable (writable) by whoever may read (write) the sweep.
- Embedding jobs and indexes belong to who created them, and are made under an
  experiment: whoever may read (write) that experiment may read (cancel) them too, so its
  owner sees what a user it shared it with for writing built from it.
- Every request that changes something needs write access to each row it names: the
  row in its path (cancel, delete, build an index or a batch job from an experiment) and an
  upload its body names (train or embed from it); sharing needs the owner. Only the POSTs
  that compute from a model (/embed, /predict, /neighbors) need no more than reading.
- Rows without an owner (created with no users, or by the bootstrap admin) are read as
  before by an admin and, with COREL_API_TOKEN_READS=false, by anonymous readers.

A row the principal may not read is a 404, as if it did not exist; one it may read but
not change is a 403.

The request's session carries its principal (``session.info["principal"]``, set by
:func:`app.api.deps.get_session`): new rows get their owner from it (:func:`own_new_rows`), and
services that follow a reference in a body (an upload's ``dataset_id``) check it with
:func:`require`. Sessions without one (workers, the CLI) are not restricted.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import ColumnElement, false, or_, select, true
from sqlalchemy.orm import Session

from app.access.tokens import Principal, is_write
from app.core.errors import Forbidden, InvalidInput, NotFound, check_id
from app.core.lookup import get_or_404
from app.core.models import (
    DatasetUpload,
    EmbeddingJob,
    EncoderUpload,
    Experiment,
    NeighborIndex,
    RegisteredModel,
    Share,
    Sweep,
    User,
)

Need = Literal["read", "write", "manage"]
Level = Literal["read", "write", "manage"]
RANK = {"read": 1, "write": 2, "manage": 3}

# The kinds of owned rows: the path parameter that names one, its model, and its words.
KINDS: dict[str, tuple[type[Any], str]] = {
    "experiment": (Experiment, "experiment"),
    "sweep": (Sweep, "sweep"),
    "dataset": (DatasetUpload, "dataset"),
    "encoder": (EncoderUpload, "encoder"),
    "embedding_job": (EmbeddingJob, "embedding job"),
    "index": (NeighborIndex, "index"),
    "model": (RegisteredModel, "model"),
}
PATH_PARAMS = {"experiment_id": "experiment", "sweep_id": "sweep", "dataset_id": "dataset",
               "encoder_id": "encoder",
               "job_id": "embedding_job", "index_id": "index"}
SHARE_COLUMNS = {"experiment": Share.experiment_id, "sweep": Share.sweep_id,
                 "dataset": Share.dataset_id, "encoder": Share.encoder_id, "model": Share.model_id}
# Rows made under an experiment (POST /experiments/{id}/embeddings, /index).
MADE_UNDER = ("embedding_job", "index")
OWNED = tuple(model for model, _ in KINDS.values())


class Hidden(NotFound):
    """A row the principal may not read: answered as one that does not exist (the audit
    log, for admins, records it as refused)."""


class Denied(Forbidden):
    """A row the principal may read but not change as asked."""


def principal_of(session: Session) -> Principal | None:
    principal: Principal | None = session.info.get("principal")
    return principal


def readable(principal: Principal | None, model: type[Any]) -> ColumnElement[bool]:
    """A WHERE clause: the rows of ``model`` that ``principal`` may read."""
    if principal is None or principal.admin:
        return true()
    kind = next(k for k, (m, _) in KINDS.items() if m is model)
    if principal.user_id is None:  # an anonymous reader: what has no owner, and what is public
        if kind in SHARE_COLUMNS:
            return or_(model.owner_id.is_(None), model.public.is_(True))
        if kind in MADE_UNDER:
            return or_(model.owner_id.is_(None), model.experiment_id.in_(
                select(Experiment.id).where(readable(principal, Experiment))))
        return model.owner_id.is_(None)
    clauses: list[ColumnElement[bool]] = [model.owner_id == principal.user_id]
    if kind in SHARE_COLUMNS:
        column = SHARE_COLUMNS[kind]
        clauses += [model.public.is_(True),
                    model.id.in_(select(column).where(Share.user_id == principal.user_id,
                                                      column.is_not(None)))]
    if model is Experiment:
        clauses.append(Experiment.sweep_id.in_(select(Sweep.id).where(readable(principal, Sweep))))
    if model in (EmbeddingJob, NeighborIndex):  # made under an experiment its reader may see
        clauses.append(model.experiment_id.in_(
            select(Experiment.id).where(readable(principal, Experiment))))
    return or_(*clauses) if clauses else false()


def level_of(session: Session, principal: Principal | None, kind: str, row: Any) -> Level | None:
    """How far ``principal`` may go with ``row``: None (not even see it), read, write, or
    manage (share it; its owner and admins)."""
    if principal is None or principal.admin:
        return "manage"
    uid = principal.user_id
    if uid is None:
        public = kind in SHARE_COLUMNS and row.public
        if row.owner_id is None or public:
            return "read"
        return _via_experiment(session, principal, row) if kind in MADE_UNDER else None
    if row.owner_id == uid:
        return "manage"
    if kind in MADE_UNDER:
        return _via_experiment(session, principal, row)
    level: Level | None = None
    if kind in SHARE_COLUMNS:
        column = SHARE_COLUMNS[kind]
        shared = session.scalar(select(Share.access).where(column == row.id, Share.user_id == uid))
        level = "write" if shared == "write" else "read" if shared == "read" or row.public else None
    if kind == "experiment" and row.sweep_id is not None and level != "write":
        sweep = session.get(Sweep, row.sweep_id)
        via = level_of(session, principal, "sweep", sweep) if sweep is not None else None
        if via is not None:
            level = "write" if RANK[via] >= RANK["write"] else level or "read"
    return level


def _via_experiment(session: Session, principal: Principal, row: Any) -> Level | None:
    """A batch job's or an index's level for one who did not make it: read or write as
    its experiment allows (managing it stays its maker's)."""
    experiment = session.get(Experiment, row.experiment_id)
    level = level_of(session, principal, "experiment", experiment) if experiment else None
    return None if level is None else "write" if RANK[level] >= RANK["write"] else "read"


def check(session: Session, principal: Principal | None, kind: str, row_id: int,
          need: Need = "read") -> Any:
    """The row, if ``principal`` may do what ``need`` says with it: NotFound when it may
    not read it (or it does not exist), Forbidden when it may read but not change it."""
    model, what = KINDS[kind]
    row = get_or_404(session, model, row_id, what)
    level = level_of(session, principal, kind, row)
    if level is None:
        raise Hidden(f"{what} {row_id} does not exist")
    if RANK[level] < RANK[need]:
        if need == "manage":
            raise Denied(f"only the owner of {what} {row_id} or an admin may share it")
        raise Denied(f"{what} {row_id} is shared with you for reading only, and this request "
                     "changes something with it: it needs write access (its owner may share "
                     "it with you for writing)")
    if need != "read" and principal is not None and not principal.can_write:
        raise Denied("this token may only read (scope read)")
    return row


def require(session: Session, kind: str, row_id: int, need: Need = "read") -> Any:
    """:func:`check` for the principal of the request this session serves."""
    return check(session, principal_of(session), kind, row_id, need)


def need_of(method: str, path: str) -> Need:
    """What a request needs of the rows its path names: reading them (or who they are
    shared with) and the POSTs that only compute from a model (/embed, /predict,
    /neighbors) read access; sharing one its owner (or an admin); every other request that
    changes something (cancel, delete, build an index or a batch embedding job from an
    experiment) write access."""
    if not is_write(method, path):
        return "read"
    if path.endswith("/shares") or "/shares/" in path:
        return "manage"
    return "write"


def check_path(session: Session, principal: Principal, method: str, path: str,
               params: dict[str, Any]) -> None:
    """Every row the request's path names, checked for :func:`need_of` the request."""
    need = need_of(method, path)
    for name, kind in PATH_PARAMS.items():
        if isinstance(params.get(name), int):
            check(session, principal, kind, params[name], need)


def own_new_rows(session: Session) -> None:
    """Give the rows this session is about to insert their owner: the request's user."""
    principal = principal_of(session)
    if principal is None or principal.user_id is None:
        return
    for row in session.new:
        if isinstance(row, OWNED) and row.owner_id is None:
            row.owner_id = principal.user_id


def share(session: Session, kind: str, row_id: int, user_id: int | None,
          access: Literal["read", "write"] | None, public: bool | None) -> Any:
    """Share a row with a user (``access``), or make it readable by every user or not
    (``public``). Idempotent: sharing again changes the access."""
    row = require(session, kind, row_id, "manage")
    if public is not None:
        row.public = public
    if user_id is not None:
        if session.get(User, user_id) is None:
            raise InvalidInput(f"user_id: user {user_id} does not exist")
        column = SHARE_COLUMNS[kind]
        existing = session.scalar(select(Share).where(column == row_id, Share.user_id == user_id))
        if existing is None:
            session.add(Share(user_id=user_id, access=access or "read",
                              **{column.key: row_id}))
        else:
            existing.access = access or "read"
    session.flush()
    return row


def unshare(session: Session, kind: str, row_id: int, share_id: int) -> Any:
    """Remove one share of a row (its owner or an admin): that user's access ends with the
    next request. A share of another row is a 404, as one that does not exist."""
    row = require(session, kind, row_id, "manage")
    check_id("share", share_id)  # an id past PostgreSQL's integer: a 404, not a database error
    column = SHARE_COLUMNS[kind]
    found = session.scalar(select(Share).where(Share.id == share_id, column == row_id))
    if found is None:
        raise NotFound(f"share {share_id} of {KINDS[kind][1]} {row_id} does not exist")
    session.delete(found)
    session.flush()
    return row


def shares_of(session: Session, kind: str, row_id: int) -> list[Share]:
    column = SHARE_COLUMNS[kind]
    return list(session.scalars(select(Share).where(column == row_id).order_by(Share.id)))
