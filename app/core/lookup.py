"""Finding the rows a request names: one get-or-404, the succeeded experiment, its best
checkpoint, its stored latent spaces; and storing a computed row once.

Every service reads rows through these, so a missing row is the same 404 and a run that
has not succeeded the same 409 everywhere. Services only flush; the session scope commits.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from app.core.errors import Conflict, NotFound, check_id
from app.core.models import Base, Checkpoint, Experiment, LatentSpace, Status

RowT = TypeVar("RowT", bound=Base)


def page_of(session: Session, query: Select[RowT], limit: int, offset: int) -> tuple[list[RowT], int]:
    """A page of ``query``'s rows (already ordered) and how many rows it has in all, in one
    round trip: the total rides along as a window count (``count(*) OVER ()``); only a page
    past the last row asks for it on its own. Rows with an ``owner`` (the read schemas show
    it) get their owners in one more statement for the whole page, not one per owner."""
    entity = query.column_descriptions[0]["entity"]
    if entity is not None and hasattr(entity, "owner"):
        query = query.options(selectinload(entity.owner))
    rows = session.execute(query.add_columns(func.count().over()).limit(limit).offset(offset)).all()
    if rows:
        return [row[0] for row in rows], int(rows[0][1])
    if offset == 0:
        return [], 0
    return [], int(session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0)


def get_or_404(session: Session, model: type[RowT], row_id: int, what: str) -> RowT:
    """The row, or a 404 that names it (``what``: "experiment", "sweep", "index", ...).
    An id no row can have is refused before the database sees it (:func:`check_id`)."""
    check_id(what, row_id)
    row = session.get(model, row_id)
    if row is None:
        raise NotFound(f"{what} {row_id} does not exist")
    return row


def succeeded_experiment(session: Session, experiment_id: int, needs: str) -> Experiment:
    """The experiment, or NotFound; Conflict (naming its status) unless it succeeded, or was
    cancelled after an epoch (it serves its best checkpoint, and its latent spaces were
    stored from it at the cancel, as a succeeded run's are at its end)."""
    exp = get_or_404(session, Experiment, experiment_id, "experiment")
    if exp.status == Status.CANCELLED and best_checkpoint(session, experiment_id, Checkpoint.id,
                                                          missing=None) is not None:
        return exp
    if exp.status != Status.SUCCEEDED:
        raise Conflict(
            f"experiment {experiment_id} is {exp.status}; {needs} needs a succeeded experiment "
            "(or one cancelled after its first epoch)",
            status=exp.status,
        )
    return exp


def servable_experiment(session: Session, experiment_id: int) -> Experiment:
    """The experiment, if it can embed and predict: succeeded, or cancelled or pruned with a
    best checkpoint. NotFound, or Conflict saying why not."""
    exp = get_or_404(session, Experiment, experiment_id, "experiment")
    if exp.status not in (Status.SUCCEEDED, Status.CANCELLED, Status.PRUNED):
        raise Conflict(
            f"experiment {experiment_id} is {exp.status}; only a succeeded experiment (or a "
            "cancelled or pruned one with a best checkpoint) can embed or predict"
        )
    if exp.status == Status.CANCELLED and best_checkpoint(session, experiment_id, Checkpoint.id,
                                                          missing=None) is None:
        raise Conflict(f"experiment {experiment_id} was cancelled before its first epoch ended: it has no "
                       "checkpoint to embed or predict with")
    return exp


_RAISE = object()


def best_checkpoint(session: Session, experiment_id: int, column: Any = None, missing: Any = _RAISE) -> Any:
    """A column (default: the digest of its artifact; ``Checkpoint``: the row) of the
    experiment's best checkpoint, or Conflict (``missing``, where given, instead)."""
    value = session.scalar(select(Checkpoint.sha256 if column is None else column).where(
        Checkpoint.experiment_id == experiment_id, Checkpoint.kind == "best"))
    if value is None and missing is not _RAISE:
        return missing
    if value is None:
        raise Conflict(f"experiment {experiment_id} has no stored best checkpoint")
    return value


def latent_row(session: Session, experiment_id: int, split: str) -> LatentSpace:
    """The stored latent space of one split (its artifacts' digests), or Conflict."""
    latent = session.scalars(
        select(LatentSpace).where(LatentSpace.experiment_id == experiment_id, LatentSpace.split == split)
    ).one_or_none()
    if latent is None:
        raise Conflict(f"experiment {experiment_id} has no stored {split} latent space")
    return latent


def store_once(session: Session, row: RowT, stored: Select[RowT]) -> RowT:
    """Insert ``row`` unless another request stored the same key first; return the stored one.

    Two first requests can compute the same thing at once. The insert runs in a
    SAVEPOINT, so the loser's unique-constraint violation rolls back only that
    insert (not the request's transaction), and it reads the winner's row.
    """
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        winner = session.scalars(stored).one_or_none()
        if winner is None:  # the violation was not the race this guards against
            raise
        return winner
    return row
