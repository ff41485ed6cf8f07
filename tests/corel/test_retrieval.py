"""Retrieval metrics (corel.retrieval) equal pytorch-metric-learning's AccuracyCalculator on
the same arrays, to 1e-6, on three datasets and both geometries."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN
from sklearn.datasets import load_digits

from corel.data import read_idx
from corel.retrieval import retrieval_metrics
from tests.conftest import FASHION_DIR, SHARED_DATASETS, require

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels

KEYS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")


def _digits():
    d = load_digits()
    x, y = d.data.astype(np.float32), d.target
    return x[:1200], y[:1200], x[1200:], y[1200:]


def _fashion():
    require(FASHION_DIR.is_dir(), "Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    x = read_idx(FASHION_DIR / "t10k-images-idx3-ubyte.gz")[:2500].reshape(2500, -1)
    y = read_idx(FASHION_DIR / "t10k-labels-idx1-ubyte.gz")[:2500]
    x = x.astype(np.float32) / 255.0
    return x[:2000], y[:2000], x[2000:], y[2000:]


def _ag_news():
    """Mean GloVe vectors of AG News headlines: a text representation."""
    require((SHARED_DATASETS / "ag_news" / "test.csv").exists(), "AG News test split")
    from corel.data import load_word_vectors, prepare_texts
    from corel.data.text import _text_preprocessing

    with open(SHARED_DATASETS / "ag_news" / "test.csv", encoding="utf-8") as f:
        rows = list(csv.reader(f))[:1500]
    wv = load_word_vectors(None)
    pre = _text_preprocessing(wv, "ffnn", 64)
    x = prepare_texts([" ".join(r[1:]) for r in rows], pre, wv.source).numpy().reshape(1500, -1)
    y = np.array([int(r[0]) - 1 for r in rows])
    return x[:1200], y[:1200], x[1200:], y[1200:]


@pytest.mark.parametrize("geometry", ["euclidean", "cosine"])
@pytest.mark.parametrize("dataset", ["digits", "fashion-mnist", "ag-news"])
def test_the_metrics_equal_pytorch_metric_learning(dataset, geometry):
    ref, ref_y, q, q_y = {"digits": _digits, "fashion-mnist": _fashion, "ag-news": _ag_news}[dataset]()
    distance = CosineSimilarity() if geometry == "cosine" else LpDistance(normalize_embeddings=False)
    calc = AccuracyCalculator(include=KEYS, k="max_bin_count", knn_func=CustomKNN(distance))
    want = calc.get_accuracy(torch.tensor(q), torch.tensor(q_y), torch.tensor(ref), torch.tensor(ref_y),
                             ref_includes_query=False)
    got = retrieval_metrics(q, q_y, ref, ref_y, geometry, chunk=97)  # chunks that do not divide
    for key in KEYS:
        assert got[key] == pytest.approx(want[key], abs=1e-6), (key, got[key], want[key])
    assert 0.2 < got["mean_average_precision_at_r"] < 1.0  # neither trivial nor perfect
    assert got["n_queries"] == len(q) and got["n_reference"] == len(ref)


def test_bad_arrays_are_value_errors():
    x = np.zeros((4, 3), np.float32)
    with pytest.raises(ValueError, match="same D"):
        retrieval_metrics(x, [0, 1, 0, 1], np.zeros((4, 2)), [0, 1, 0, 1])
    with pytest.raises(ValueError, match=r"class\(es\) \[2\] have queries but no reference"):
        retrieval_metrics(x, [0, 1, 2, 1], x, [0, 1, 0, 1])
    with pytest.raises(ValueError, match="unknown geometry 'manhattan'"):
        retrieval_metrics(x, [0, 1, 0, 1], x, [0, 1, 0, 1], "manhattan")


def test_refined_euclidean_neighbours_have_exact_distances():
    """A row's distance to itself reads ~1e-3 through matrix products in float32; refined,
    the neighbours and their distances are those of float64 brute force."""
    from corel.retrieval import neighbours

    rng = np.random.default_rng(1)
    # Far from the origin, as unnormalised representations can be: the products cancel.
    ref = (rng.normal(size=(3000, 64)) * 5 + 300).astype(np.float32)
    q = np.concatenate([ref[:5], rng.normal(size=(5, 64)).astype(np.float32) * 5 + 300])
    coarse, _ = neighbours(torch.from_numpy(q), torch.from_numpy(ref), 5, "euclidean")
    assert float(coarse[:5, 0].max()) > 1e-3  # the cancellation this guards against
    d, idx = neighbours(torch.from_numpy(q), torch.from_numpy(ref), 5, "euclidean", refine=True)
    exact = np.sqrt(((q[:, None, :].astype(np.float64) - ref[None].astype(np.float64)) ** 2).sum(-1))
    np.testing.assert_allclose(d.numpy(), np.sort(exact, axis=1)[:, :5], atol=1e-5)
    assert idx[:5, 0].tolist() == [0, 1, 2, 3, 4]
    for i in range(len(q)):
        assert set(idx[i].tolist()) == set(np.argsort(exact[i])[:5].tolist())


def test_read_only_arrays_are_read_without_a_warning():
    """A latent space read from storage is often a read-only array (np.frombuffer, a memory
    map); torch shares such memory only with a UserWarning. The metrics copy it instead and
    give what the writable arrays give."""
    import warnings

    ref, ref_y, q, q_y = _digits()
    want = retrieval_metrics(q, q_y, ref, ref_y)
    frozen = []
    for a in (q, q_y, ref, ref_y):
        b = np.frombuffer(a.tobytes(), dtype=a.dtype).reshape(a.shape)
        assert not b.flags.writeable
        frozen.append(b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = retrieval_metrics(frozen[0], frozen[1], frozen[2], frozen[3])
    assert got == want
