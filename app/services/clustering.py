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
from typing import Any

import numpy as np
from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.core.lookup import store_once, succeeded_experiment
from app.core.models import ClusteringResult, Experiment
from app.core.schemas.common import Split
from app.storage.artifacts import load_latent
from corel.clustering import ALGORITHMS, cluster, default_metric
from corel.geometry import Geometry


def _stored(experiment_id: int, split: str, metric: str, algorithm: str) -> Select[ClusteringResult]:
    return select(ClusteringResult).where(
        ClusteringResult.experiment_id == experiment_id,
        ClusteringResult.split == split,
        ClusteringResult.metric == metric,
        ClusteringResult.algorithm == algorithm,
    )


def clustering_report(
    session: Session, experiment_id: int, *, split: Split = "test", metric: Geometry | None = None
) -> dict[str, Any]:
    """K-Means and GMM scores of a succeeded experiment's latent space of ``split``.

    ``metric`` None means the loss's own geometry (:func:`corel.clustering.default_metric`:
    its declaration's). The seed is the experiment's.
    """
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
    metric: Geometry,
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
