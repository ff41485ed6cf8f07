"""Clustering evaluation of a learned representation space.

A COREL encoder is judged by how well an off-the-shelf clustering algorithm,
run on its representations ``h`` without seeing the labels, recovers the
classes (Kenyon-Dean et al. 2019, Section 5). This module runs K-Means or a
Gaussian mixture with ``k`` = number of classes and scores the result with

* clustering accuracy under the best one-to-one cluster-to-class mapping
  (Hungarian algorithm), :func:`hungarian_accuracy`;
* the adjusted Rand index and the V-measure (label-permutation invariant);
* the silhouette coefficient of the predicted clusters in the space that was
  clustered (a label-free measure of how compact and separated they are).

Geometry matters. Cosine-COREL trains with a cosine similarity, so only the
direction of ``h`` carries class information and norms vary freely; measured
on a Fashion-MNIST FFNN, K-Means accuracy of a Cosine-COREL latent space is
about 0.69 in the raw space and 0.89 after L2-normalising the rows. Hence
``metric="cosine"`` (cluster the normalised rows, cosine silhouette) is the
default for Cosine-COREL (:func:`default_metric`) and ``"euclidean"`` for the
other losses.

All results are plain Python ``float``/``int``/``str``/``None`` so that they
can be stored as JSON as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

# scikit-learn and SciPy's optimize are imported where a clustering is computed, not with
# this module: corel.train, every worker and the API import it, and the two took 1.6 s of
# each process's start (app.main 4.4 s -> 2.9 s on a 2-core AMD EPYC), in processes that
# may never cluster (an API process, a worker until its first run ends).
from corel.geometry import GEOMETRIES, Geometry
from corel.loss_catalog import DECLARATIONS

ALGORITHMS: tuple[str, ...] = ("kmeans", "gmm")

# Gaussian mixture: diagonal covariances with a variance floor proportional to
# the data's scale. Measured on 10,000 x 128 float32 inputs with 10 components
# (2 shared CPU cores): "full" took 1 s on separated clusters and 8-17 s on
# overlapping ones, and failed outright (ill-defined covariance) on collapsed,
# low-rank spaces at scale >= 100 in float32, even in float64 at scale 1e6 with
# the default reg_covar; "diag" took 0.1-1.4 s and never failed. An absolute
# reg_covar (sklearn's 1e-6) means something different for a unit-norm cosine
# space and a Gaussian-COREL space with norms in the hundreds, so the floor is
# relative: 1e-3 of the mean per-feature variance, never below sklearn's 1e-6.
_GMM_COVARIANCE_TYPE = "diag"
_GMM_RELATIVE_REG_COVAR = 1e-3
_GMM_MIN_REG_COVAR = 1e-6
_KMEANS_N_INIT = 10

ArrayLike = npt.ArrayLike | torch.Tensor


# --------------------------------------------------------------------------- public API


def default_metric(loss_name: str) -> Geometry:
    """The clustering geometry matching a loss: its declaration's (``"cosine"`` for
    Cosine-COREL and the losses that score by cosine), ``"euclidean"`` for an unknown one.

    Cosine-COREL (``loss_name == "cosine"``) only constrains directions, so its
    latent space is clustered after L2 normalisation (K-Means accuracy on a
    Fashion-MNIST FFNN: about 0.69 raw, 0.89 normalised). Gaussian-COREL,
    centre loss and cross-entropy use the raw Euclidean space.
    """
    if not isinstance(loss_name, str):
        raise ValueError(f"loss_name must be a string such as 'cosine'; got {loss_name!r}.")
    decl = DECLARATIONS.get(loss_name)  # each loss's geometry is declared with it
    return decl.geometry if decl is not None else "euclidean"


def hungarian_accuracy(labels_true: ArrayLike, labels_pred: ArrayLike) -> float:
    """Clustering accuracy under the best one-to-one mapping of clusters to classes.

    ``ACC = max_m (1/N) sum_i 1[y_i = m(c_i)]`` where ``m`` ranges over
    injective maps from cluster ids to class ids. The maximum is found with the
    Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) on the
    class-by-cluster contingency matrix, which may be rectangular: with more
    clusters than classes the surplus clusters are left unmatched and count as
    errors; with fewer, some classes get no cluster.

    Args:
        labels_true: (N,) integer class ids.
        labels_pred: (N,) integer cluster ids; their values are arbitrary.

    Returns:
        Accuracy in [0, 1] as a Python float.
    """
    y_true = _as_labels(labels_true, "labels_true")
    y_pred = _as_labels(labels_pred, "labels_pred")
    _check_same_length(y_true, "labels_true", y_pred, "labels_pred")
    return _hungarian_accuracy(y_true, y_pred)


def score_clustering(
    representations: ArrayLike,
    labels_true: ArrayLike,
    labels_pred: ArrayLike,
    *,
    metric: Geometry = "euclidean",
    silhouette_sample_size: int | None = 5000,
    seed: int = 0,
) -> dict[str, Any]:
    """Score a given clustering of ``representations`` against the true classes.

    Args:
        representations: (N, H) float array or tensor, the space that was clustered.
        labels_true: (N,) integer class ids.
        labels_pred: (N,) integer cluster ids.
        metric: ``"euclidean"`` (raw space, Euclidean silhouette) or ``"cosine"``
            (rows L2-normalised, zero rows kept at zero; cosine silhouette).
        silhouette_sample_size: when N exceeds this, the silhouette is computed on
            this many samples drawn without replacement with ``seed`` (the same
            sample sklearn's ``silhouette_score(sample_size=..., random_state=seed)``
            draws), since it costs O(N^2). ``None`` always uses every sample.
        seed: seed of the silhouette subsample.

    Returns:
        ``{"accuracy", "ari", "v_measure", "silhouette", "n_samples",
        "silhouette_sample_size", "metric"}``. ``accuracy`` is
        :func:`hungarian_accuracy`, ``ari`` the adjusted Rand index, ``v_measure``
        the V-measure. ``silhouette`` is in [-1, 1], or ``None`` when it is
        undefined: all (sampled) points in one cluster, or every point its own
        cluster. ``silhouette_sample_size`` is the number of samples the
        silhouette used, or ``None`` when it used all ``n_samples``.
    """
    _check_choice(metric, "metric", GEOMETRIES)
    sample_size = _check_sample_size(silhouette_sample_size)
    _check_seed(seed)
    x = _as_representations(representations)
    y_true = _as_labels(labels_true, "labels_true")
    y_pred = _as_labels(labels_pred, "labels_pred")
    _check_same_length(x, "representations", y_true, "labels_true")
    _check_same_length(y_true, "labels_true", y_pred, "labels_pred")
    return _score(_to_space(x, metric), y_true, y_pred, metric, sample_size, seed)


def cluster(
    representations: ArrayLike,
    labels_true: ArrayLike,
    *,
    algorithm: str = "kmeans",
    metric: Geometry = "euclidean",
    n_clusters: int | None = None,
    seed: int = 0,
    silhouette_sample_size: int | None = 5000,
) -> dict[str, Any]:
    """Cluster ``representations`` with one algorithm and score it against ``labels_true``.

    The labels are used only for scoring. ``k`` is the number of distinct
    classes in ``labels_true`` unless ``n_clusters`` is given.

    Algorithms:
        ``"kmeans"``: ``KMeans(n_clusters=k, n_init=10, random_state=seed)``.
        ``"gmm"``: ``GaussianMixture(n_components=k, covariance_type="diag",
        random_state=seed)`` with ``reg_covar`` = 1e-3 x the mean per-feature
        variance (at least 1e-6). Diagonal, not full, covariances: on 10,000 x 128
        samples "full" took 1-17 s against 0.1-1.4 s for "diag", and failed on
        collapsed low-rank latent spaces where "diag" did not. The scale-relative
        variance floor makes the result independent of the overall scale of ``h``.

    Both run in float64 whatever the input precision, so float32 and float64
    copies of the same representations give the same result.

    Args:
        representations: (N, H) float array or tensor.
        labels_true: (N,) integer class ids, at least two distinct.
        algorithm: one of :data:`ALGORITHMS`.
        metric: one of :data:`corel.geometry.GEOMETRIES`; ``"cosine"`` clusters the L2-normalised rows.
        n_clusters: number of clusters, 2 <= k <= N; default: number of classes.
        seed: random state of the algorithm and of the silhouette subsample.
        silhouette_sample_size: see :func:`score_clustering`.

    Returns:
        :func:`score_clustering`'s dict plus ``"algorithm"`` and ``"n_clusters"``.
    """
    _check_choice(algorithm, "algorithm", ALGORITHMS)
    _check_choice(metric, "metric", GEOMETRIES)
    sample_size = _check_sample_size(silhouette_sample_size)
    _check_seed(seed)
    x, y_true = _check_inputs(representations, labels_true)
    k = _resolve_n_clusters(n_clusters, y_true)
    return _cluster(_to_space(x, metric), y_true, algorithm, metric, k, seed, sample_size)


def evaluate_clustering(
    representations: ArrayLike,
    labels_true: ArrayLike,
    *,
    metric: Geometry = "euclidean",
    algorithms: Sequence[str] = ALGORITHMS,
    seed: int = 0,
    silhouette_sample_size: int | None = 5000,
) -> dict[str, dict[str, Any]]:
    """Run :func:`cluster` for each algorithm with ``k`` = number of classes.

    Returns:
        ``{algorithm: cluster(...) result}`` in the order of ``algorithms``.
    """
    if isinstance(algorithms, str) or not isinstance(algorithms, Sequence):
        raise ValueError(
            f"algorithms must be a sequence of names such as ('kmeans',); got {algorithms!r}."
        )
    if len(algorithms) == 0:
        raise ValueError(
            "algorithms is empty; pass at least one of: " + ", ".join(ALGORITHMS) + "."
        )
    for algorithm in algorithms:
        _check_choice(algorithm, "algorithm", ALGORITHMS)
    if len(set(algorithms)) != len(algorithms):
        raise ValueError(f"algorithms lists a name twice: {list(algorithms)}; list each once.")
    _check_choice(metric, "metric", GEOMETRIES)
    sample_size = _check_sample_size(silhouette_sample_size)
    _check_seed(seed)
    x, y_true = _check_inputs(representations, labels_true)
    k = _resolve_n_clusters(None, y_true)
    space = _to_space(x, metric)
    return {
        algorithm: _cluster(space, y_true, algorithm, metric, k, seed, sample_size)
        for algorithm in algorithms
    }


def evaluate(
    embeddings: ArrayLike, labels: ArrayLike, *, metric: Geometry = "euclidean", seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """How well ``embeddings`` cluster by ``labels``: K-Means and a Gaussian mixture with
    k = the number of classes, each scored by Hungarian accuracy, ARI, V-measure and
    silhouette (:func:`evaluate_clustering` with its defaults). Takes numpy arrays or
    torch tensors, as a training loop has them; ``metric="cosine"`` clusters directions
    (Cosine-COREL's geometry)."""
    return evaluate_clustering(embeddings, labels, metric=metric, seed=seed)


# --------------------------------------------------------------------------- computation


def _hungarian_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    from scipy.optimize import linear_sum_assignment
    from sklearn.metrics.cluster import contingency_matrix

    if y_true.size == 0:
        raise ValueError("labels are empty; clustering accuracy needs at least one sample.")
    counts = contingency_matrix(y_true, y_pred)  # (n_classes, n_clusters)
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return float(counts[rows, cols].sum()) / float(y_true.size)


def _score(
    space: np.ndarray,
    y_true: np.ndarray,
    y_pred: np.ndarray,
    metric: Geometry,
    sample_size: int | None,
    seed: int,
) -> dict[str, Any]:
    from sklearn.metrics import adjusted_rand_score, v_measure_score

    n = int(space.shape[0])
    silhouette, used = _silhouette(space, y_pred, metric, sample_size, seed)
    return {
        "accuracy": _hungarian_accuracy(y_true, y_pred),
        "ari": float(adjusted_rand_score(y_true, y_pred)),
        "v_measure": float(v_measure_score(y_true, y_pred)),
        "silhouette": silhouette,
        "n_samples": n,
        "silhouette_sample_size": used,
        "metric": metric,
    }


def _silhouette(
    space: np.ndarray, y_pred: np.ndarray, metric: Geometry, sample_size: int | None, seed: int
) -> tuple[float | None, int | None]:
    from sklearn.metrics import silhouette_score

    n = space.shape[0]
    used: int | None = None
    if sample_size is not None and n > sample_size:
        # Same draw as sklearn's silhouette_score(sample_size=..., random_state=seed),
        # done here so that a sample holding a single cluster yields None, not an error.
        idx = np.random.RandomState(seed).permutation(n)[:sample_size]
        space, y_pred = space[idx], y_pred[idx]
        used = int(sample_size)
    n_labels = np.unique(y_pred).size
    if not 2 <= n_labels <= space.shape[0] - 1:
        return None, used
    return float(silhouette_score(space, y_pred, metric=metric)), used


def _cluster(
    space: np.ndarray,
    y_true: np.ndarray,
    algorithm: str,
    metric: Geometry,
    k: int,
    seed: int,
    sample_size: int | None,
) -> dict[str, Any]:
    y_pred = _fit_predict(space, algorithm, k, seed)
    result = _score(space, y_true, y_pred, metric, sample_size, seed)
    result["algorithm"] = algorithm
    result["n_clusters"] = int(k)
    return result


def _fit_predict(space: np.ndarray, algorithm: str, k: int, seed: int) -> np.ndarray:
    from sklearn.cluster import KMeans
    from sklearn.mixture import GaussianMixture

    if algorithm == "kmeans":
        kmeans = KMeans(n_clusters=k, n_init=_KMEANS_N_INIT, random_state=seed)
        return np.asarray(kmeans.fit_predict(space))
    reg_covar = max(_GMM_MIN_REG_COVAR, _GMM_RELATIVE_REG_COVAR * float(space.var(axis=0).mean()))
    gmm = GaussianMixture(
        n_components=k,
        covariance_type=_GMM_COVARIANCE_TYPE,
        reg_covar=reg_covar,
        random_state=seed,
    )
    return np.asarray(gmm.fit_predict(space))


def _to_space(x: np.ndarray, metric: Geometry) -> np.ndarray:
    """The space that is clustered: raw rows, or unit rows for ``"cosine"`` (zero rows stay 0)."""
    if metric == "euclidean":
        return x
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


# --------------------------------------------------------------------------- validation


def _to_numpy(value: ArrayLike, name: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        if tensor.is_complex():
            raise ValueError(f"{name} must be real-valued; got a {tensor.dtype} tensor.")
        if tensor.is_floating_point() and tensor.dtype not in (torch.float32, torch.float64):
            tensor = tensor.double()  # float16/bfloat16 have no (or a lossy) numpy view
        return tensor.numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} could not be read as an array: {exc}") from exc


def _as_representations(value: ArrayLike) -> np.ndarray:
    x = _to_numpy(value, "representations")
    if x.dtype.kind not in "fiub":
        raise ValueError(
            f"representations must be a real-valued numeric array; got dtype {x.dtype}."
        )
    if x.ndim != 2:
        raise ValueError(
            f"representations must be 2-D (n_samples, n_features); got shape {x.shape}. "
            "Reshape a single sample with .reshape(1, -1) or flatten extra dimensions."
        )
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"representations is empty (shape {x.shape}); pass at least one sample.")
    x = x.astype(np.float64, copy=False)
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).any(axis=1).sum())
        raise ValueError(
            f"representations contain NaN or infinite values in {bad} of {x.shape[0]} rows; "
            "a diverged encoder produces these, so check the training run."
        )
    return x


def _as_labels(value: ArrayLike, name: str) -> np.ndarray:
    y = _to_numpy(value, name)
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D (n_samples,); got shape {y.shape}.")
    if y.dtype.kind in "iub":
        return y.astype(np.int64, copy=False)
    if y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise ValueError(f"{name} contain NaN or infinite values; pass integer ids.")
        if (y == np.round(y)).all():
            return y.astype(np.int64)
    raise ValueError(
        f"{name} must hold integer ids; got dtype {y.dtype}. "
        "Map class names to integers first (e.g. with np.unique(..., return_inverse=True))."
    )


def _check_same_length(a: np.ndarray, a_name: str, b: np.ndarray, b_name: str) -> None:
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"{a_name} and {b_name} must have the same number of samples; "
            f"got {a.shape[0]} and {b.shape[0]}."
        )


def _check_inputs(
    representations: ArrayLike, labels_true: ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    x = _as_representations(representations)
    y_true = _as_labels(labels_true, "labels_true")
    _check_same_length(x, "representations", y_true, "labels_true")
    n_classes = np.unique(y_true).size
    if n_classes < 2:
        raise ValueError(
            f"labels_true holds {n_classes} distinct class; clustering accuracy needs at "
            "least 2 classes. Evaluate on a split that contains several classes."
        )
    return x, y_true


def _resolve_n_clusters(n_clusters: int | None, y_true: np.ndarray) -> int:
    n = int(y_true.shape[0])
    if n_clusters is None:
        return int(np.unique(y_true).size)
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, int | np.integer):
        raise ValueError(f"n_clusters must be an integer or None; got {n_clusters!r}.")
    k = int(n_clusters)
    if k < 2:
        raise ValueError(f"n_clusters must be at least 2; got {k}.")
    if k > n:
        raise ValueError(
            f"n_clusters={k} is more clusters than samples ({n}); "
            "use at most as many clusters as samples."
        )
    return k


def _check_choice(value: str, name: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"Unknown {name} {value!r}; choose one of: " + ", ".join(allowed) + ".")


def _check_sample_size(value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 2:
        raise ValueError(
            f"silhouette_sample_size must be an integer >= 2 or None (use all samples); "
            f"got {value!r}."
        )
    return int(value)


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an integer in [0, 2**32); got {seed!r}.")
