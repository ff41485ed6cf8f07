"""Tests for corel.clustering, in the style of sklearn's metrics/cluster/tests/test_common.py:
invariances, bounds, perfect and random clusterings, and a brute-force check of the
Hungarian accuracy against its definition."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import make_blobs
from sklearn.metrics import silhouette_score

from corel.clustering import (
    ALGORITHMS,
    cluster,
    default_metric,
    evaluate_clustering,
    hungarian_accuracy,
    score_clustering,
)
from corel.geometry import GEOMETRIES

# Scores that compare labels_pred with labels_true (silhouette only sees labels_pred).
SUPERVISED_SCORES = ("accuracy", "ari", "v_measure")
FLOAT_KEYS = ("accuracy", "ari", "v_measure", "silhouette")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def _blobs(n: int = 300, k: int = 4, h: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    x, y = make_blobs(
        n_samples=n,
        n_features=h,
        centers=k,
        cluster_std=0.5,
        center_box=(-20, 20),
        random_state=seed,
    )
    return x, y.astype(np.int64)


def _rays(
    rng: np.random.Generator, n: int = 300, k: int = 3, h: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """Classes are directions; radii span three orders of magnitude, so Euclidean
    distance is dominated by the norm and only the angle separates the classes."""
    directions = rng.normal(size=(k, h))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    y = np.repeat(np.arange(k), n // k)
    radii = np.exp(rng.uniform(np.log(0.1), np.log(100.0), size=y.size))
    x = (directions[y] + 0.05 * rng.normal(size=(y.size, h))) * radii[:, None]
    return x, y


def _brute_force_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """max over injective maps cluster -> class of the fraction of samples mapped to
    their class, by trying every map and counting sample by sample."""
    classes = list(np.unique(y_true))
    clusters = list(np.unique(y_pred))
    m = max(len(classes), len(clusters))
    targets: list[Any] = classes + [None] * (m - len(classes))  # None: cluster left unmatched
    best = 0
    for perm in itertools.permutations(range(m), len(clusters)):
        mapping = {c: targets[j] for c, j in zip(clusters, perm, strict=True)}
        hits = sum(mapping[p] == t for t, p in zip(y_true, y_pred, strict=True))
        best = max(best, hits)
    return best / len(y_true)


def _relabel(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The same partition under different, non-contiguous cluster ids."""
    ids = np.unique(y)
    new_ids = rng.permutation(ids.size) * 7 + 3
    return new_ids[np.searchsorted(ids, y)]


# --------------------------------------------------------------------------- hungarian accuracy


@pytest.mark.parametrize("n_classes", [1, 2, 3, 5])
@pytest.mark.parametrize("n_clusters", [1, 2, 4, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_hungarian_accuracy_matches_brute_force(n_classes: int, n_clusters: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 30
    y_true = rng.integers(0, n_classes, size=n)
    # Correlated with the truth so the optimum is not trivial, with some noise.
    y_pred = np.where(rng.random(n) < 0.6, y_true % n_clusters, rng.integers(0, n_clusters, n))
    assert hungarian_accuracy(y_true, y_pred) == pytest.approx(
        _brute_force_accuracy(y_true, y_pred)
    )


def test_hungarian_accuracy_is_symmetric_for_equal_counts(rng: np.random.Generator) -> None:
    for _ in range(5):
        a, b = rng.integers(0, 4, size=50), rng.integers(0, 4, size=50)
        assert hungarian_accuracy(a, b) == pytest.approx(hungarian_accuracy(b, a))


@pytest.mark.parametrize("n_classes, n_clusters", [(2, 2), (3, 5), (5, 3), (4, 4)])
def test_hungarian_accuracy_bounds(
    n_classes: int, n_clusters: int, rng: np.random.Generator
) -> None:
    # Averaged over all maps of the (padded, square) contingency matrix the hits are
    # N / max(n_classes, n_clusters), so the best map does at least that well.
    for _ in range(10):
        y_true = rng.integers(0, n_classes, size=40)
        y_pred = rng.integers(0, n_clusters, size=40)
        acc = hungarian_accuracy(y_true, y_pred)
        assert 1 / max(np.unique(y_true).size, np.unique(y_pred).size) - 1e-12 <= acc <= 1.0


# --------------------------------------------------------------------------- score_clustering


@pytest.mark.parametrize("score", [*SUPERVISED_SCORES, "silhouette"])
def test_permuting_cluster_ids_changes_nothing(score: str, rng: np.random.Generator) -> None:
    x = rng.normal(size=(120, 5))
    y_true = rng.integers(0, 4, size=120)
    y_pred = np.where(rng.random(120) < 0.7, y_true, rng.integers(0, 4, 120))
    base = score_clustering(x, y_true, y_pred)[score]
    for _ in range(3):
        relabelled = score_clustering(x, y_true, _relabel(y_pred, rng))[score]
        assert relabelled == pytest.approx(base)


@pytest.mark.parametrize("score", SUPERVISED_SCORES)
def test_perfect_clustering_scores_one(score: str, rng: np.random.Generator) -> None:
    x = rng.normal(size=(100, 3))
    y_true = rng.integers(0, 5, size=100)
    assert score_clustering(x, y_true, _relabel(y_true, rng))[score] == pytest.approx(1.0)


@pytest.mark.parametrize("k", [2, 5])
def test_random_labels_score_chance(k: int, rng: np.random.Generator) -> None:
    n = 3000
    x = rng.normal(size=(n, 2))
    y_true = rng.integers(0, k, size=n)
    y_pred = rng.integers(0, k, size=n)
    result = score_clustering(x, y_true, y_pred)
    assert abs(result["ari"]) < 0.05
    assert result["v_measure"] < 0.01
    assert 1 / k - 0.02 <= result["accuracy"] < 1 / k + 0.05


@pytest.mark.parametrize("metric", GEOMETRIES)
def test_score_bounds(metric: str, rng: np.random.Generator) -> None:
    for n, k in [(20, 2), (60, 3), (200, 6)]:
        x = rng.normal(size=(n, 4))
        y_true = rng.integers(0, k, size=n)
        y_pred = rng.integers(0, k + 1, size=n)
        result = score_clustering(x, y_true, y_pred, metric=metric)
        assert 0.0 < result["accuracy"] <= 1.0
        assert -0.5 <= result["ari"] <= 1.0
        assert 0.0 <= result["v_measure"] <= 1.0
        assert -1.0 <= result["silhouette"] <= 1.0
        assert result["metric"] == metric


def test_silhouette_is_none_when_undefined(rng: np.random.Generator) -> None:
    x = rng.normal(size=(30, 3))
    y_true = rng.integers(0, 3, size=30)
    one_cluster = score_clustering(x, y_true, np.zeros(30, dtype=int))
    assert one_cluster["silhouette"] is None
    assert one_cluster["accuracy"] == pytest.approx(np.bincount(y_true).max() / 30)
    assert score_clustering(x, y_true, np.arange(30))["silhouette"] is None


def test_silhouette_sample_with_one_cluster_is_none_not_an_error(
    rng: np.random.Generator,
) -> None:
    x = rng.normal(size=(100, 2))
    y_pred = np.zeros(100, dtype=int)
    y_pred[0] = 1  # the only point of cluster 1, which the seeded sample leaves out
    assert 0 not in np.random.RandomState(0).permutation(100)[:10]
    result = score_clustering(x, y_pred, y_pred, silhouette_sample_size=10, seed=0)
    assert result["silhouette"] is None
    assert result["silhouette_sample_size"] == 10


def test_silhouette_sample_matches_sklearn_and_is_reported(rng: np.random.Generator) -> None:
    x = rng.normal(size=(300, 4))
    y = rng.integers(0, 3, size=300)
    sampled = score_clustering(x, y, y, silhouette_sample_size=100, seed=3)
    assert sampled["silhouette_sample_size"] == 100
    assert sampled["n_samples"] == 300
    expected = silhouette_score(x, y, sample_size=100, random_state=3)
    assert sampled["silhouette"] == pytest.approx(expected)

    full = score_clustering(x, y, y, silhouette_sample_size=300)
    assert full["silhouette_sample_size"] is None
    assert full["silhouette"] == pytest.approx(silhouette_score(x, y))
    assert score_clustering(x, y, y, silhouette_sample_size=None)["silhouette_sample_size"] is None


def test_cosine_keeps_zero_rows_at_zero(rng: np.random.Generator) -> None:
    x = rng.normal(size=(40, 3))
    x[:3] = 0.0
    y = rng.integers(0, 2, size=40)
    result = score_clustering(x, y, y, metric="cosine")
    assert np.isfinite(result["silhouette"])
    assert np.isfinite(cluster(x, y, metric="cosine")["accuracy"])


# --------------------------------------------------------------------------- cluster


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_separated_blobs_are_recovered(algorithm: str) -> None:
    x, y = _blobs()
    result = cluster(x, y, algorithm=algorithm)
    assert result["accuracy"] == 1.0
    assert result["ari"] == pytest.approx(1.0)
    assert result["algorithm"] == algorithm
    assert result["n_clusters"] == 4


def test_evaluate_clustering_runs_each_algorithm() -> None:
    x, y = _blobs()
    results = evaluate_clustering(x, y)
    assert list(results) == list(ALGORITHMS)
    for algorithm, result in results.items():
        assert result["algorithm"] == algorithm
        assert result["accuracy"] == 1.0
    only_kmeans = evaluate_clustering(x, y, algorithms=["kmeans"])
    assert only_kmeans == {"kmeans": results["kmeans"]}


def test_n_clusters_overrides_number_of_classes() -> None:
    x, y = _blobs(k=4)
    result = cluster(x, y, n_clusters=6)
    assert result["n_clusters"] == 6
    # Two surplus clusters split classes; their samples count as errors.
    assert result["accuracy"] < 1.0
    assert result["v_measure"] > 0.8


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_deterministic_for_a_seed(algorithm: str, rng: np.random.Generator) -> None:
    # Overlapping data, so that the random initialisation actually matters.
    x = rng.normal(size=(200, 5))
    y = rng.integers(0, 3, size=200)
    kwargs: dict[str, Any] = {"algorithm": algorithm, "seed": 7, "silhouette_sample_size": 50}
    assert cluster(x, y, **kwargs) == cluster(x, y, **kwargs)


def test_results_are_plain_python_and_json_serialisable() -> None:
    x, y = _blobs()
    results = evaluate_clustering(x, y, silhouette_sample_size=100)
    for result in results.values():
        for key in FLOAT_KEYS:
            assert type(result[key]) is float, key
        for key in ("n_samples", "n_clusters", "silhouette_sample_size"):
            assert type(result[key]) is int, key
        assert result["silhouette_sample_size"] == 100
    assert json.loads(json.dumps(results)) == results


def test_cosine_recovers_directions_where_euclidean_fails(rng: np.random.Generator) -> None:
    x, y = _rays(rng)
    for algorithm in ALGORITHMS:
        euclidean = cluster(x, y, algorithm=algorithm, metric="euclidean")["accuracy"]
        cosine = cluster(x, y, algorithm=algorithm, metric="cosine")["accuracy"]
        assert cosine == pytest.approx(1.0)
        assert cosine > euclidean + 0.2


def test_gmm_survives_a_collapsed_low_rank_float32_space(rng: np.random.Generator) -> None:
    # Classes collapsed to near-points on a 2-D subspace of a ReLU-like space, far
    # from unit scale and in float32: full covariances fail on spaces like this.
    y = np.repeat(np.arange(4), 50)
    centres = rng.normal(size=(4, 2)) * 3
    z = centres[y] + 1e-3 * rng.normal(size=(y.size, 2))
    x = (np.maximum(z @ rng.normal(size=(2, 32)), 0) * 1000).astype(np.float32)
    assert cluster(x, y, algorithm="gmm")["accuracy"] == 1.0


def test_gmm_does_not_depend_on_the_scale_of_the_space(rng: np.random.Generator) -> None:
    x = rng.normal(size=(200, 4))
    y = rng.integers(0, 3, size=200)
    small = cluster(x, y, algorithm="gmm")
    large = cluster(x * 1e4, y, algorithm="gmm")
    for key in (*SUPERVISED_SCORES, "silhouette"):
        assert large[key] == pytest.approx(small[key], abs=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_identical_points_give_undefined_silhouette() -> None:
    y = np.repeat([0, 1], 20)
    result = cluster(np.ones((40, 3)), y)
    assert result["silhouette"] is None
    assert result["accuracy"] == pytest.approx(0.5)


# --------------------------------------------------------------------------- input types


def _as_input(x: np.ndarray, kind: str, dtype: str) -> Any:
    arr = x.astype(dtype)
    return torch.from_numpy(arr) if kind == "torch" else arr


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_numpy_and_torch_float32_and_float64_agree(kind: str, dtype: str) -> None:
    x, y = _blobs(n=120, k=3)
    x = x.astype(np.float32).astype(np.float64)  # exactly representable in both precisions
    reference = evaluate_clustering(x, y, silhouette_sample_size=50)
    labels = torch.from_numpy(y) if kind == "torch" else y
    assert evaluate_clustering(_as_input(x, kind, dtype), labels, silhouette_sample_size=50) == (
        reference
    )
    scored = score_clustering(_as_input(x, kind, dtype), labels, labels)
    assert scored["accuracy"] == 1.0


def test_torch_inputs_with_grad_and_other_label_dtypes() -> None:
    x, y = _blobs(n=90, k=3)
    x_t = torch.tensor(x, requires_grad=True)
    assert cluster(x_t, torch.from_numpy(y).to(torch.int32))["accuracy"] == 1.0
    assert cluster(x_t.to(torch.bfloat16), y)["accuracy"] == 1.0
    assert hungarian_accuracy(y.astype(np.float64), y.astype(np.uint8)) == 1.0
    assert hungarian_accuracy(list(y), tuple(y)) == 1.0


def test_default_metric() -> None:
    assert default_metric("cosine") == "cosine"
    for loss in ("gaussian", "center", "cce"):
        assert default_metric(loss) == "euclidean"


# --------------------------------------------------------------------------- bad input

_X = np.random.default_rng(0).normal(size=(20, 3))
_Y = np.repeat([0, 1], 10)


def _with(value: float, at: tuple[int, int] = (2, 1)) -> np.ndarray:
    x = _X.copy()
    x[at] = value
    return x


BAD_INPUTS: list[tuple[str, Callable[[], Any], str]] = [
    ("length", lambda: cluster(_X[:-1], _Y), "same number of samples; got 19 and 20"),
    ("length", lambda: score_clustering(_X, _Y, _Y[:-2]), "same number of samples"),
    ("length", lambda: hungarian_accuracy(_Y, _Y[:5]), "same number of samples"),
    ("dims", lambda: cluster(_X[:, 0], _Y), "must be 2-D"),
    ("dims", lambda: cluster(_X[None], _Y), "must be 2-D"),
    ("dims", lambda: cluster(_X, _Y[:, None]), "labels_true must be 1-D"),
    ("dims", lambda: score_clustering(_X, _Y, _X), "labels_pred must be 1-D"),
    ("empty", lambda: cluster(np.zeros((0, 3)), np.zeros(0, dtype=int)), "is empty"),
    ("empty", lambda: hungarian_accuracy([], []), "at least one sample"),
    ("nan", lambda: cluster(_with(np.nan), _Y), "NaN or infinite values in 1 of 20 rows"),
    ("inf", lambda: evaluate_clustering(_with(np.inf), _Y), "NaN or infinite"),
    ("inf", lambda: score_clustering(_with(-np.inf), _Y, _Y), "NaN or infinite"),
    ("labels", lambda: cluster(_X, _Y + 0.5), "integer ids"),
    ("labels", lambda: hungarian_accuracy(_Y, np.full(20, np.nan)), "NaN or infinite"),
    ("labels", lambda: hungarian_accuracy(_Y, np.array(["a"] * 20)), "integer ids"),
    ("one class", lambda: cluster(_X, np.zeros(20, dtype=int)), "at least 2 classes"),
    ("one class", lambda: evaluate_clustering(_X, np.ones(20, dtype=int)), "at least 2 classes"),
    ("k", lambda: cluster(_X, _Y, n_clusters=1), "n_clusters must be at least 2"),
    ("k", lambda: cluster(_X, _Y, n_clusters=21), "more clusters than samples"),
    ("k", lambda: cluster(_X, _Y, n_clusters=2.5), "n_clusters must be an integer"),  # type: ignore[arg-type]
    ("metric", lambda: cluster(_X, _Y, metric="manhattan"), "choose one of: euclidean, cosine"),
    ("metric", lambda: score_clustering(_X, _Y, _Y, metric="l2"), "euclidean, cosine"),
    ("metric", lambda: evaluate_clustering(_X, _Y, metric="dot"), "euclidean, cosine"),
    ("algorithm", lambda: cluster(_X, _Y, algorithm="dbscan"), "choose one of: kmeans, gmm"),
    ("algorithm", lambda: evaluate_clustering(_X, _Y, algorithms=("kmeans", "x")), "kmeans, gmm"),
    ("algorithm", lambda: evaluate_clustering(_X, _Y, algorithms=()), "algorithms is empty"),
    ("algorithm", lambda: evaluate_clustering(_X, _Y, algorithms="kmeans"), "sequence of names"),
    ("algorithm", lambda: evaluate_clustering(_X, _Y, algorithms=["gmm", "gmm"]), "twice"),
    ("sample size", lambda: cluster(_X, _Y, silhouette_sample_size=1), ">= 2 or None"),
    ("seed", lambda: cluster(_X, _Y, seed=-1), "seed must be an integer"),
    ("loss", lambda: default_metric(None), "loss_name must be a string"),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(
    "call, message",
    [(call, message) for _, call, message in BAD_INPUTS],
    ids=[f"{name}-{i}" for i, (name, _, _) in enumerate(BAD_INPUTS)],
)
def test_bad_input_raises_value_error(call: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
