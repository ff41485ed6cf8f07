"""Retrieval metrics of a succeeded experiment: its test split's representations as
queries against its training split's, in the loss's own geometry (the clustering
report's); computed once from the stored latent spaces (corel.retrieval), then read."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import Conflict
from app.core.lookup import store_once, succeeded_experiment
from app.core.models import Experiment, RetrievalResult, Status
from app.storage.artifacts import load_latent
from corel.clustering import default_metric
from corel.geometry import Geometry
from corel.retrieval import retrieval_metrics


def training_rows(session: Session, experiment_id: int, needs: str) -> tuple[Any, Any]:
    """The experiment's stored training split (representations, labels): the reference
    of retrieval and of /neighbors; a 409 saying what to do for a run stored without it."""
    try:
        return load_latent(session, experiment_id, "train")
    except Conflict:
        raise Conflict(no_training_rows(session, experiment_id, needs)) from None


def no_training_rows(session: Session, experiment_id: int, needs: str) -> str:
    """Why an experiment has no stored training split, in its own case, and what to do.
    A succeeded run or a solo run cancelled after an epoch stores it; a member pruned by
    its sweep, or cancelled alone out of a stacked group, keeps its best checkpoint only."""
    exp = session.get(Experiment, experiment_id)
    status = exp.status if exp is not None else None
    serves = "/embed and /predict serve its best checkpoint"
    if status == Status.PRUNED:
        why = (f"experiment {experiment_id} was pruned by its sweep, which keeps a pruned "
               f"member's best checkpoint but not its latent spaces")
    elif status == Status.CANCELLED and exp is not None and exp.sweep_id is not None:
        why = (f"experiment {experiment_id} was cancelled while it trained in a stacked group of "
               "its sweep, which keeps such a member's best checkpoint but not its latent spaces")
    elif status == Status.CANCELLED:
        why = f"experiment {experiment_id} was cancelled before its latent spaces were stored"
    else:
        return (f"experiment {experiment_id} was trained before the training split's "
                f"representations were stored, and {needs} needs them; train it again "
                "(POST /experiments with its spec)")
    return (f"{why}; {needs} needs its training split's representations ({serves}); train its "
            "spec to the end for them (POST /experiments with its spec)")


def retrieval_report(session: Session, experiment_id: int,
                     geometry: Geometry | None = None) -> dict[str, Any]:
    """precision@1, R-precision, MAP@R, geometry, n_queries, n_reference (and seconds)."""
    exp = succeeded_experiment(session, experiment_id, "retrieval")
    chosen = geometry or default_metric(exp.loss)
    stored = select(RetrievalResult).where(RetrievalResult.experiment_id == experiment_id,
                                           RetrievalResult.geometry == chosen)
    row = session.scalars(stored).one_or_none()
    if row is None:
        reference, reference_labels = training_rows(session, experiment_id, "retrieval")
        queries, query_labels = load_latent(session, experiment_id, "test")
        started = time.perf_counter()
        result = retrieval_metrics(queries, query_labels, reference, reference_labels, chosen)
        row = store_once(session, RetrievalResult(
            experiment_id=experiment_id, geometry=chosen, result=result,
            seconds=time.perf_counter() - started), stored)
    return {"experiment_id": experiment_id, **row.result, "seconds": row.seconds}
