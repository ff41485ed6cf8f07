"""The rows of a few-shot protocol (corel.fewshot): a labelled table's rows cut once, per
class, into evaluation rows and a pool (:func:`draw_splits`), seeded draws of N pool rows per
class, and a dataset as one member of the protocol sees it (:func:`as_fewshot`, what
``spec.fewshot`` loads)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data.ag_news import ag_news_texts
from corel.data.base import Dataset
from corel.data.npz import stored_split
from corel.data.splits import _resolve_user_path, split_rows
from corel.data.text import _read_text_npz
from corel.spec import ExperimentSpec, FewShotDraw

__all__ = ["MAX_SPLITS", "SHOTS", "SPLITS", "Splits", "as_fewshot", "draw_splits", "text_labels"]

SHOTS = (8, 16, 64)
"""Shots per class by default."""
SPLITS = 10
"""Seeded draws of them by default."""
MAX_SPLITS = 100


@dataclass(frozen=True)
class Splits:
    """Row indices: ``evaluation`` (every method is scored on them), ``pool`` (the shots are
    drawn from it; disjoint from the evaluation rows) and ``draws`` (for each N, one array
    per draw of N pool rows per class, sorted)."""

    evaluation: np.ndarray
    pool: np.ndarray
    draws: dict[int, list[np.ndarray]]
    seed: int


def _names(y: np.ndarray, class_names: Sequence[str] | None) -> Callable[[int], str]:
    return (lambda k: str(class_names[k])) if class_names is not None else (lambda k: str(k))


def draw_splits(y: Any, shots: Sequence[int] = SHOTS, splits: int = SPLITS, seed: int = 0,
                class_names: Sequence[str] | None = None, eval_fraction: float = 0.5) -> Splits:
    """The protocol's rows for labels ``y``: per class, ``eval_fraction`` of its rows (rounded
    down) for evaluation and the rest for the pool, then ``splits`` draws of N pool rows per
    class for each N of ``shots``. The same seed gives the same rows; the draws of one N do
    not depend on which other Ns are asked. ValueError says what is wrong: an N larger than
    some class's pool (naming the class and its size), fewer than two classes, ``splits``
    outside 1..100."""
    labels = np.asarray(y)
    if labels.ndim != 1 or labels.size == 0 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be a non-empty 1-d integer array; got shape {labels.shape}, "
                         f"dtype {labels.dtype}")
    name = _names(labels, class_names)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise ValueError(f"few-shot needs at least two classes; the data has one ({name(int(classes[0]))})")
    if isinstance(splits, bool) or not isinstance(splits, int | np.integer) or not 1 <= splits <= MAX_SPLITS:
        raise ValueError(f"splits must be an integer from 1 to {MAX_SPLITS}; got {splits!r}")
    wanted = list(shots)
    if not wanted or any(isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1 for n in wanted):
        raise ValueError(f"shots must be a non-empty list of positive integers (examples per class); "
                         f"got {wanted!r}")
    if len(set(wanted)) != len(wanted):
        raise ValueError(f"shots must not repeat a number; got {wanted!r}")
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must lie strictly between 0 and 1; got {eval_fraction}")
    rng = np.random.default_rng([seed, 0])
    evaluation, pools = [], {}
    for k in classes:
        rows = rng.permutation(np.flatnonzero(labels == k))
        cut = int(len(rows) * eval_fraction)
        evaluation.append(rows[:cut])
        pools[int(k)] = np.sort(rows[cut:])
    smallest = min(pools, key=lambda k: len(pools[k]))
    size, total = len(pools[smallest]), int((labels == smallest).sum())
    too_many = [n for n in wanted if n > size]
    if too_many:
        raise ValueError(
            f"{max(too_many)} shots per class: class {name(smallest)!r} has {size} rows in the pool "
            f"({total} in all, {total - size} held out for evaluation); allowed: at most {size} shots")
    draws: dict[int, list[np.ndarray]] = {}
    for n in wanted:
        draws[int(n)] = []
        for s in range(splits):
            r = np.random.default_rng([seed, int(n), s + 1])
            draws[int(n)].append(np.sort(np.concatenate([r.choice(pools[k], int(n), replace=False)
                                                         for k in sorted(pools)])))
    return Splits(evaluation=np.sort(np.concatenate(evaluation)),
                  pool=np.sort(np.concatenate(list(pools.values()))), draws=draws, seed=seed)


def as_fewshot(data: Dataset, draw: FewShotDraw) -> Dataset:
    """A dataset as one few-shot member (``spec.fewshot``) sees it: its training and
    validation rows cut by :func:`draw_splits` (``draw.seed``); the draw's shots to train on
    (and to validate on: a few-shot run has no other labelled rows), the evaluation rows to
    test on. The test split is left out. ValueError as :func:`draw_splits` says."""
    x = torch.cat([data.x_train, data.x_val])
    y = torch.cat([data.y_train, data.y_val])
    cut = draw_splits(y.numpy(), [draw.shots], draw.split + 1, draw.seed, data.class_names)
    shots, evaluation = cut.draws[draw.shots][draw.split], cut.evaluation
    rows = None
    if data.rows is not None and "train" in data.rows and "val" in data.rows:
        positions = np.concatenate([np.asarray(data.rows["train"]), np.asarray(data.rows["val"])])
        rows = {"train": positions[shots], "val": positions[shots], "test": positions[evaluation]}
    taken, held = torch.from_numpy(shots), torch.from_numpy(evaluation)
    return dataclasses.replace(data, x_train=x[taken], y_train=y[taken], x_val=x[taken], y_val=y[taken],
                               x_test=x[held], y_test=y[held], rows=rows)


def text_labels(spec: ExperimentSpec, data_dir: Path | None) -> tuple[np.ndarray, list[str]] | None:
    """For a text dataset (AG News, an uploaded text table): the labels of its training and
    validation rows, in that order, and its class names, read without embedding a text (no
    encoder, no word vectors); None for a dataset of another kind."""
    if spec.dataset == "ag-news":
        texts = ag_news_texts(spec, data_dir)
        return np.concatenate([texts.train[1], texts.val[1]]), list(texts.class_names)
    if spec.dataset == "text":
        path = _resolve_user_path(str(spec.dataset_path), data_dir)
        _, y, names = _read_text_npz(path)
        train, val, _ = split_rows(y, names, stored_split(path), spec.val_fraction, spec.test_fraction)
        return np.concatenate([y[train], y[val]]), list(names)
    return None
