"""Nearest-neighbour indexes: requested here, built on a worker (worker/indexing.py), read
back by any API process from the artifact store and kept in memory once per process.

An index covers an experiment's training split or the rows of one of its finished batch
embedding jobs, in the loss's own geometry (the clustering report's). Its file
(``corel.index.VectorIndex``) is an artifact, written before the transaction that marks it
succeeded names it: an index that is not succeeded has no file, and nothing half-built is
ever served.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.access import policy
from app.core.errors import Conflict, InvalidInput
from app.core.lookup import get_or_404, succeeded_experiment
from app.core.models import CollectionBuild, LatentSpace, NeighborIndex, Status, utcnow
from app.core.schemas.indexes import IndexCreate
from app.core.settings import Settings
from app.jobs.lifecycle import cancel
from app.services.retrieval import no_training_rows
from app.storage import read_parsed
from corel.clustering import default_metric
from corel.index import VectorIndex


def create_index(session: Session, experiment_id: int, body: IndexCreate, settings: Settings) -> NeighborIndex:
    exp = succeeded_experiment(session, experiment_id, "an index")
    if body.embedding_job_id is not None:
        job = policy.require(session, "embedding_job", body.embedding_job_id)
        if job.experiment_id != experiment_id:
            raise InvalidInput(f"embedding job {job.id} embedded experiment {job.experiment_id}'s "
                               f"representations, not experiment {experiment_id}'s; index it with "
                               f"POST /experiments/{job.experiment_id}/index")
        if job.status != Status.SUCCEEDED:
            raise Conflict(f"embedding job {job.id} is {job.status}; an index needs a succeeded "
                           "embedding job", status=job.status)
        source, n = "embedding_job", job.n_total
    else:
        stored = session.scalar(select(LatentSpace.n).where(
            LatentSpace.experiment_id == experiment_id, LatentSpace.split == "train"))
        if stored is None:
            raise Conflict(no_training_rows(session, experiment_id, "an index")
                           + "; or index a batch embedding job's rows ({\"embedding_job_id\": N})")
        source, n = "train", int(stored)
    if n == 0:
        raise Conflict(f"there are no rows to index in {source.replace('_', ' ')}")
    if body.kind == "exact" and n > settings.exact_search_max_rows:
        raise InvalidInput(f"an exact index takes at most {settings.exact_search_max_rows} rows "
                           f"(COREL_EXACT_SEARCH_MAX_ROWS); this source has {n}: ask for kind hnsw or auto")
    now = utcnow()
    # The route sends the task right after the commit.
    row = NeighborIndex(
        experiment_id=experiment_id, source=source, embedding_job_id=body.embedding_job_id,
        requested_kind=body.kind, geometry=default_metric(exp.loss), status=Status.QUEUED, n_total=n,
        n_done=0, cancel_requested=False, created_at=now, attempts=0, enqueued_at=now, enqueues=1)
    session.add(row)
    session.flush()
    return row


def get_index(session: Session, index_id: int) -> NeighborIndex:
    return get_or_404(session, NeighborIndex, index_id, "index")


def list_indexes(session: Session, experiment_id: int) -> list[NeighborIndex]:
    succeeded_experiment(session, experiment_id, "listing indexes")
    visible = policy.readable(policy.principal_of(session), NeighborIndex)
    return list(session.scalars(select(NeighborIndex).where(NeighborIndex.experiment_id == experiment_id, visible)
                                .order_by(NeighborIndex.id.desc())))


def cancel_index(session: Session, index_id: int) -> NeighborIndex:
    """Queued: cancelled at once. Running: flagged; the worker stops between chunks."""
    return cancel(session, get_index(session, index_id), f"index {index_id}")


def index_to_search(session: Session, experiment_id: int, index_id: int | None) -> NeighborIndex | None:
    """The index /neighbors searches: ``index_id`` (which must be this experiment's and
    succeeded), else the experiment's latest succeeded index of its own, else None. A model's
    collection index (a collection build's, made under the version's run) is searched by
    alias (/models/{name}/neighbors), never by default here."""
    if index_id is None:
        collections = select(CollectionBuild.index_id).where(CollectionBuild.index_id.is_not(None))
        return session.scalars(select(NeighborIndex).where(
            NeighborIndex.experiment_id == experiment_id, NeighborIndex.status == Status.SUCCEEDED,
            NeighborIndex.id.not_in(collections))
            .order_by(NeighborIndex.id.desc()).limit(1)).one_or_none()
    row = get_index(session, index_id)
    if row.experiment_id != experiment_id:
        raise InvalidInput(f"index {index_id} belongs to experiment {row.experiment_id}, not "
                           f"experiment {experiment_id}; search it with "
                           f"POST /experiments/{row.experiment_id}/neighbors")
    if row.status != Status.SUCCEEDED:
        what = "still being built" if row.status in (Status.QUEUED, Status.RUNNING) else "never finished"
        raise Conflict(f"index {index_id} is {row.status} ({what}); /neighbors searches a "
                       "succeeded index only (GET /indexes/{id} shows its progress)", status=row.status)
    return row


def load_index(session: Session, index_id: int) -> VectorIndex:
    """A succeeded index's file, read from the artifact store (verified), as a searchable
    index."""
    row = session.get(NeighborIndex, index_id)
    if row is None or row.sha256 is None:
        raise Conflict(f"index {index_id} has no stored file")
    return read_parsed(session, row.sha256, lambda view, file: VectorIndex.from_bytes(view, file=file))
