"""Fixed, stratified splits: drawn with SPLIT_SEED, each class its share in every split."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from corel.data.base import SPLIT_SEED, TEST_FRACTION, VAL_FRACTION


def _check_class_sizes(y: np.ndarray, minimum: int, names: Sequence[str], where: str) -> None:
    """Every class 0..len(names)-1 must have ``minimum`` samples, so that each split gets one."""
    counts = np.bincount(y, minlength=len(names))
    small = [f"{names[c]!r} ({counts[c]})" for c in range(len(names)) if counts[c] < minimum]
    if small:
        raise ValueError(
            f"{where}: too few samples to split: every class needs at least {minimum} (one for "
            f"each split), but these have fewer: {', '.join(small)}; add samples or drop the class"
        )


def _stratified_take(
    y: np.ndarray, total: int, *, keep: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split positions 0..len(y)-1 into (rest, taken) with ``len(taken) == total``.

    Each class gives ``total`` in proportion to its size (largest remainder), at least one,
    and keeps at least ``keep``. Both parts come back shuffled.
    """
    _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    quota = counts * (total / len(y))
    alloc = np.clip(np.floor(quota).astype(np.int64), 1, counts - keep)
    order = np.argsort(-(quota - np.floor(quota)), kind="stable")
    diff = total - int(alloc.sum())
    while diff:
        changed = False
        for c in order if diff > 0 else order[::-1]:
            if diff > 0 and alloc[c] < counts[c] - keep:
                alloc[c] += 1
                diff -= 1
                changed = True
            elif diff < 0 and alloc[c] > 1:
                alloc[c] -= 1
                diff += 1
                changed = True
            if not diff:
                break
        if not changed:
            raise ValueError(
                f"cannot take {total} of {len(y)} samples while keeping every one of the "
                f"{len(counts)} classes on both sides; the dataset is too small"
            )
    groups = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    taken, rest = [], []
    for members, n in zip(groups, alloc, strict=True):
        members = rng.permutation(members)
        taken.append(members[:n])
        rest.append(members[n:])
    return rng.permutation(np.concatenate(rest)), rng.permutation(np.concatenate(taken))


def _split_three(y: np.ndarray, rng: np.random.Generator, val_fraction: float | None = None,
                 test_fraction: float | None = None) -> tuple[np.ndarray, ...]:
    """Stratified train/validation/test positions (70/15/15 unless the fractions say
    otherwise); needs 3 samples per class."""
    k = len(np.unique(y))
    n_test = max(k, round((test_fraction or TEST_FRACTION) * len(y)))
    n_val = max(k, round((val_fraction or VAL_FRACTION) * len(y)))
    rest, test = _stratified_take(y, n_test, keep=2, rng=rng)
    train_pos, val_pos = _stratified_take(y[rest], n_val, keep=1, rng=rng)
    return rest[train_pos], rest[val_pos], test


def training_rows(n: int, num_classes: int, val_fraction: float | None = None,
                  test_fraction: float | None = None, train_subset: int | None = None) -> int:
    """How many training rows an uploaded dataset of ``n`` rows and ``num_classes`` classes
    gives a run (the split of :func:`_split_three`, then ``train_subset``): what a check at
    submission compares a batch size with."""
    k = num_classes
    rows = n - max(k, round((test_fraction or TEST_FRACTION) * n)) - max(k, round((val_fraction or VAL_FRACTION) * n))
    return max(rows, 0) if train_subset is None else min(max(rows, 0), train_subset)


def _subset(train_idx: np.ndarray, n: int | None, dataset: str = "the dataset") -> np.ndarray:
    """The first ``n`` training rows (``spec.train_subset``); a ValueError when the split
    holds fewer, instead of training on fewer rows than asked without a word."""
    if n is not None and n > len(train_idx):
        raise ValueError(f"train_subset is {n}, but {dataset}'s training split holds "
                         f"{len(train_idx)} rows; ask for at most {len(train_idx)}, or leave "
                         "train_subset unset to train on all of them")
    return train_idx if n is None else train_idx[:n]


def _resolve_user_path(path: str, data_dir: Path | None) -> Path:
    """A path from the spec; a relative one that does not exist is tried under data_dir."""
    p = Path(path).expanduser()
    if not p.is_absolute() and not p.exists() and data_dir is not None:
        under = data_dir / p
        if under.exists():
            return under
    return p


SPLIT_NAMES = {"train": 0, "training": 0, "val": 1, "valid": 1, "validation": 1, "dev": 1,
               "test": 2, "testing": 2}


def split_codes(values: Sequence[object], column: str) -> np.ndarray:
    """A user's split column (train / validation / test, as words) as codes 0 / 1 / 2."""
    codes = np.empty(len(values), dtype=np.int8)
    for i, v in enumerate(values):
        code = SPLIT_NAMES.get(str(v).strip().lower()) if v is not None else None
        if code is None:
            raise ValueError(f"column {column!r}, row {i + 1}: {v!r} is not a split; use train, "
                             "validation (or val) or test")
        codes[i] = code
    return codes


def _given_splits(split: np.ndarray, y: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, ...]:
    """Positions of the user's own train / validation / test rows, checked."""
    parts = tuple(np.flatnonzero(split == code) for code in (0, 1, 2))
    for part, name in zip(parts, ("train", "validation", "test"), strict=True):
        if not len(part):
            raise ValueError(f"the split column gives no {name} row; every split needs rows")
    missing = sorted(set(range(len(names))) - set(y[parts[0]].tolist()))
    if missing:
        raise ValueError(f"the split column leaves class(es) {', '.join(repr(names[c]) for c in missing)} "
                         "without a training row")
    return parts


def split_rows(y: np.ndarray, names: Sequence[str], split: np.ndarray | None,
               val_fraction: float | None, test_fraction: float | None) -> tuple[np.ndarray, ...]:
    """An uploaded dataset's train / validation / test positions: the user's own split
    column when it has one, else stratified and seeded (SPLIT_SEED) by the fractions."""
    if split is not None:
        if val_fraction or test_fraction:
            raise ValueError("this dataset names its own splits (a split column); leave "
                             "val_fraction and test_fraction unset")
        return _given_splits(split, y, names)
    return _split_three(y, np.random.default_rng(SPLIT_SEED), val_fraction, test_fraction)
