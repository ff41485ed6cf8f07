"""A promotion's gate: is a candidate model no worse than the incumbent on the same rows?

Both models are evaluated on the same labelled rows: each row's prediction (right or not)
and its average precision at R among the reference rows (corel.retrieval). The gate passes
when, for accuracy and for MAP@R, the lower bound of the 95 % interval of candidate minus
incumbent is at least ``-margin``, and no class's recall falls by more than
``recall_drop``. The intervals come from a paired bootstrap over the rows: ``resamples``
resamples of the row indices (a fixed ``seed``), each model's mean on the same resample.

It refuses, saying why:

* ``worse``: the whole interval of a figure lies below ``-margin``;
* ``too few rows``: an interval is wider than ``margin`` on either side of its difference,
  so these rows cannot show a difference of the margin's size (the report gives their
  number and the interval);
* ``may be worse``: a lower bound under ``-margin``;
* ``class recall``: a class whose recall falls by more than ``recall_drop``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

RESAMPLES = 1000
SEED = 0
RECALL_DROP = 0.05
MARGIN = 0.01
FIGURES = ("accuracy", "map_at_r")


@dataclass(frozen=True)
class Evaluated:
    """One model on the evaluation rows: each row's ``correct`` (0 or 1) and
    ``ap_at_r``, the rows' ``labels`` (the same for both models)."""

    correct: np.ndarray
    ap_at_r: np.ndarray
    labels: np.ndarray

    def figure(self, name: str) -> np.ndarray:
        return self.correct if name == "accuracy" else self.ap_at_r


def paired_interval(candidate: np.ndarray, incumbent: np.ndarray, resamples: int = RESAMPLES,
                    seed: int = SEED) -> tuple[float, float, float]:
    """(mean difference, 2.5th and 97.5th percentiles of the resampled mean differences)
    of per-row values, resampling rows with replacement, both models on the same rows."""
    diff = np.asarray(candidate, np.float64) - np.asarray(incumbent, np.float64)
    if diff.ndim != 1 or len(diff) == 0:
        raise ValueError("the gate needs per-row values of both models on the same, non-empty rows")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        means[i] = diff[rng.integers(0, len(diff), len(diff))].mean()
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(diff.mean()), float(lo), float(hi)


def class_recall(correct: np.ndarray, labels: np.ndarray, classes: int) -> list[float | None]:
    """Each class's share of rows predicted right (None for a class with no row)."""
    out: list[float | None] = []
    for k in range(classes):
        rows = labels == k
        out.append(float(correct[rows].mean()) if rows.any() else None)
    return out


def compare(candidate: Evaluated, incumbent: Evaluated, class_names: list[str], margin: float = MARGIN,
            recall_drop: float = RECALL_DROP, resamples: int = RESAMPLES, seed: int = SEED) -> dict[str, Any]:
    """The gate's report: both models' figures, the differences with their intervals,
    per-class recall, ``passed`` and, when refused, ``reason``."""
    if margin <= 0:
        raise ValueError(f"margin must be positive, got {margin}")
    if not np.array_equal(candidate.labels, incumbent.labels):
        raise ValueError("the candidate and the incumbent must be evaluated on the same rows")
    n = len(candidate.labels)
    figures: dict[str, Any] = {}
    for name in FIGURES:
        delta, lo, hi = paired_interval(candidate.figure(name), incumbent.figure(name), resamples, seed)
        figures[name] = {"candidate": float(candidate.figure(name).mean()),
                         "incumbent": float(incumbent.figure(name).mean()),
                         "delta": delta, "interval": [lo, hi]}
    recall_c = class_recall(candidate.correct, candidate.labels, len(class_names))
    recall_i = class_recall(incumbent.correct, incumbent.labels, len(class_names))
    per_class: list[dict[str, Any]] = [{"class_name": name, "candidate": c, "incumbent": i,
                                        "delta": None if c is None or i is None else c - i}
                                       for name, c, i in zip(class_names, recall_c, recall_i, strict=True)]
    report: dict[str, Any] = {"rows": n, "margin": margin, "recall_drop": recall_drop,
                              "resamples": resamples, "seed": seed, "figures": figures,
                              "class_recall": per_class}
    words = {"accuracy": "accuracy", "map_at_r": "MAP@R"}
    reason = None
    for name in FIGURES:
        lo, hi = figures[name]["interval"]
        if hi < -margin:
            reason = (f"worse: the candidate's {words[name]} is lower by {-figures[name]['delta']:.4f} "
                      f"(95 % interval [{lo:.4f}, {hi:.4f}], all below -{margin:g})")
            break
    if reason is None:
        for name in FIGURES:
            lo, hi = figures[name]["interval"]
            delta = figures[name]["delta"]
            if delta - lo > margin or hi - delta > margin:
                reason = (f"too few rows: on {n} rows the 95 % interval of {words[name]}'s difference is "
                          f"[{lo:.4f}, {hi:.4f}], wider than the margin {margin:g} on a side; evaluate on "
                          "more rows (the model's eval_dataset_id) or promote with a larger margin")
                break
    if reason is None:
        for name in FIGURES:
            lo, hi = figures[name]["interval"]
            if lo < -margin:
                reason = (f"may be worse: the lower bound of {words[name]}'s difference is {lo:.4f}, "
                          f"under -{margin:g}")
                break
    if reason is None:
        fallen = [c for c in per_class if c["delta"] is not None and c["delta"] < -recall_drop]
        if fallen:
            worst = min(fallen, key=lambda c: c["delta"])
            reason = (f"class recall: {len(fallen)} class(es) fall by more than {recall_drop:g}, "
                      f"{worst['class_name']!r} the most ({worst['incumbent']:.3f} to {worst['candidate']:.3f})")
    report["passed"] = reason is None
    if reason is not None:
        report["reason"] = reason
    return report
