"""Clustering reports of stored latent spaces: computed once, then read.

A report runs every algorithm of :data:`corel.clustering.ALGORITHMS` (K-Means and
a Gaussian mixture) on one split's stored representations and scores it. Each
(experiment, split, metric, algorithm) is computed at most once and kept in
``clustering_results``; later requests read the stored rows, so they return
exactly what the first one did. Services only flush; the session scope commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.errors import Conflict, InvalidInput
from app.models import Base, Checkpoint, ClusteringResult, Experiment, LatentSpace, Status
from app.services.experiments import get_experiment
from corel.checkpoints import checkpoint_from_bytes
from corel.clustering import ALGORITHMS, METRICS, cluster, default_metric

SPLITS: tuple[str, ...] = ("test", "validation")

RowT = TypeVar("RowT", bound=Base)


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


def succeeded_experiment(session: Session, experiment_id: int, needs: str) -> Experiment:
    """The experiment, or NotFound; Conflict (naming its status) unless it succeeded."""
    exp = get_experiment(session, experiment_id)
    if exp.status != Status.SUCCEEDED:
        raise Conflict(
            f"experiment {experiment_id} is {exp.status}; {needs} needs a succeeded experiment",
            status=exp.status,
        )
    return exp


def best_checkpoint(session: Session, experiment_id: int, column: Any = None) -> Any:
    """A column (default: the bytes) of the experiment's best checkpoint, or Conflict."""
    value = session.scalar(select(Checkpoint.data if column is None else column).where(
        Checkpoint.experiment_id == experiment_id, Checkpoint.kind == "best"))
    if value is None:
        raise Conflict(f"experiment {experiment_id} has no stored best checkpoint")
    return value


def class_names(session: Session, experiment_id: int) -> list[str]:
    """The class names the experiment was trained with (its best checkpoint's)."""
    ckpt = checkpoint_from_bytes(best_checkpoint(session, experiment_id))
    return [str(c) for c in ckpt["class_names"]]


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidInput(f"unknown {name} {value!r}; allowed: {', '.join(allowed)}")


def load_latent(session: Session, experiment_id: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(representations n x dim float32, labels int64) of one stored split."""
    latent = session.scalars(
        select(LatentSpace).where(LatentSpace.experiment_id == experiment_id, LatentSpace.split == split)
    ).one_or_none()
    if latent is None:
        raise Conflict(f"experiment {experiment_id} has no stored {split} latent space")
    reps = np.frombuffer(latent.representations, dtype=np.float32).reshape(latent.n, latent.dim)
    labels = np.frombuffer(latent.labels, dtype=np.int64)
    return reps, labels


def _stored(experiment_id: int, split: str, metric: str, algorithm: str) -> Select[ClusteringResult]:
    return select(ClusteringResult).where(
        ClusteringResult.experiment_id == experiment_id,
        ClusteringResult.split == split,
        ClusteringResult.metric == metric,
        ClusteringResult.algorithm == algorithm,
    )


def clustering_report(
    session: Session, experiment_id: int, *, split: str = "test", metric: str | None = None
) -> dict[str, Any]:
    """K-Means and GMM scores of a succeeded experiment's latent space of ``split``.

    ``metric`` None means the loss's own geometry (:func:`corel.clustering.default_metric`:
    cosine for Cosine-COREL, else euclidean). The seed is the experiment's.
    """
    check_choice("on", split, SPLITS)
    if metric is not None:
        check_choice("metric", metric, METRICS)
    exp = succeeded_experiment(session, experiment_id, "clustering")
    chosen = metric if metric is not None else default_metric(exp.loss)

    latent: tuple[np.ndarray, np.ndarray] | None = None

    def latent_space() -> tuple[np.ndarray, np.ndarray]:
        nonlocal latent
        if latent is None:  # read the blob only when something must be computed
            latent = load_latent(session, experiment_id, split)
        return latent

    results: dict[str, dict[str, Any]] = {}
    for algorithm in ALGORITHMS:
        row = _result_row(session, exp, split, chosen, algorithm, latent_space)
        results[algorithm] = {**row.result, "seconds": row.seconds}
    return {
        "experiment_id": experiment_id,
        "split": split,
        "metric": chosen,
        "metric_source": "default" if metric is None else "query",
        "n_samples": results[ALGORITHMS[0]]["n_samples"],
        "results": results,
    }


def _result_row(
    session: Session,
    exp: Experiment,
    split: str,
    metric: str,
    algorithm: str,
    latent_space: Callable[[], tuple[np.ndarray, np.ndarray]],
) -> ClusteringResult:
    stored = _stored(exp.id, split, metric, algorithm)
    row = session.scalars(stored).one_or_none()
    if row is not None:
        return row
    reps, labels = latent_space()
    started = time.perf_counter()
    result = cluster(reps, labels, algorithm=algorithm, metric=metric, seed=int(exp.spec["seed"]))
    seconds = time.perf_counter() - started
    return store_once(
        session,
        ClusteringResult(
            experiment_id=exp.id, split=split, metric=metric, algorithm=algorithm,
            result=result, seconds=seconds,
        ),
        stored,
    )
