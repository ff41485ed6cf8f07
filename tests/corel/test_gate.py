"""corel.gate: the promotion gate's paired bootstrap and its verdicts; corel.retrieval's
per-query figures, whose means are retrieval_metrics'."""

from __future__ import annotations

import numpy as np
import pytest

from corel.gate import Evaluated, compare, paired_interval
from corel.retrieval import per_query, retrieval_metrics

# The per-query figures' neighbours come out of torch's matrix products.
pytestmark = pytest.mark.kernels

NAMES = [f"c{k}" for k in range(4)]


def _model(rng, labels, p_right, ap_mean=0.7):
    correct = (rng.random(len(labels)) < p_right).astype(np.float64)
    ap = np.clip(rng.normal(ap_mean, 0.1, len(labels)), 0, 1)
    return Evaluated(correct, ap, labels)


def test_the_interval_is_a_paired_bootstrap_with_a_fixed_seed():
    rng = np.random.default_rng(3)
    a, b = rng.random(500), rng.random(500)
    delta, lo, hi = paired_interval(a, b)
    assert delta == pytest.approx(float((a - b).mean()))
    assert lo < delta < hi
    assert paired_interval(a, b) == (delta, lo, hi)  # the same seed, the same interval
    diff = a - b  # by hand: the same resamples of row indices
    draws = np.random.default_rng(0)
    means = [diff[draws.integers(0, 500, 500)].mean() for _ in range(1000)]
    assert (lo, hi) == tuple(np.percentile(means, [2.5, 97.5]))
    assert paired_interval(a, a) == (0.0, 0.0, 0.0)


def test_the_same_model_passes_and_a_clearly_worse_one_is_refused():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 2500)
    incumbent = _model(rng, labels, 0.9)
    same = compare(incumbent, incumbent, NAMES)
    assert same["passed"] and same["figures"]["accuracy"]["interval"] == [0.0, 0.0]
    worse = compare(_model(rng, labels, 0.6), incumbent, NAMES)
    assert not worse["passed"] and worse["reason"].startswith("worse: the candidate's accuracy")
    assert worse["figures"]["accuracy"]["candidate"] < 0.65 < 0.85 < worse["figures"]["accuracy"]["incumbent"]
    assert [c["class_name"] for c in worse["class_recall"]] == NAMES


def test_too_few_rows_and_a_fallen_class_are_refused_with_their_reason():
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 25)  # 100 rows: an interval some 0.1 wide
    small = compare(_model(rng, labels, 0.85), _model(rng, labels, 0.85), NAMES)
    assert not small["passed"] and small["reason"].startswith("too few rows: on 100 rows")
    wide = compare(_model(rng, labels, 0.85), _model(rng, labels, 0.85), NAMES, margin=0.5)
    assert "too few rows" not in wide.get("reason", "")  # at a margin these rows can show
    # Every class as good but the last, which falls from all right to 80 % right.
    labels = np.repeat(np.arange(4), 5000)
    incumbent = Evaluated(np.ones(len(labels)), np.full(len(labels), 0.8), labels)
    correct = np.ones(len(labels))
    correct[labels == 3] = (np.arange(5000) % 5 != 0)
    fallen = compare(Evaluated(correct, incumbent.ap_at_r, labels), incumbent, NAMES, margin=0.06)
    assert not fallen["passed"] and fallen["reason"].startswith("class recall: 1 class(es)")
    assert "'c3' the most (1.000 to 0.800)" in fallen["reason"]
    with pytest.raises(ValueError, match="same rows"):
        compare(incumbent, Evaluated(correct, incumbent.ap_at_r, labels[::-1]), NAMES)


def test_per_query_figures_average_to_retrieval_metrics():
    rng = np.random.default_rng(2)
    ref, ref_y = rng.normal(size=(300, 8)), rng.integers(0, 5, 300)
    q, q_y = rng.normal(size=(70, 8)), rng.integers(0, 5, 70)
    for geometry in ("euclidean", "cosine"):
        each = per_query(q, q_y, ref, ref_y, geometry, chunk=16)
        whole = retrieval_metrics(q, q_y, ref, ref_y, geometry)
        assert len(each["average_precision_at_r"]) == 70
        assert each["average_precision_at_r"].mean() == pytest.approx(whole["mean_average_precision_at_r"], abs=1e-12)
        assert each["hit_at_1"].mean() == pytest.approx(whole["precision_at_1"], abs=1e-12)
        assert each["r_precision"].mean() == pytest.approx(whole["r_precision"], abs=1e-12)
