"""The one cache of frozen encoders' features.

A frozen encoder's output on a dataset never changes, so it is computed once per (encoder
digest, inputs) and kept: in this process (every run and sweep member that loads the same
data reuses it) and, given a directory (the worker's ``COREL_VAR_DIR/features``), on disk,
so that later processes reuse it too. While features are computed they report their
progress to the callback :func:`features_progress` sets (a worker shows it as the run's
phase).
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch

from corel.encoders import kept
from corel.encoders.record import EncoderRecord

__all__ = [
    "COMPUTED",
    "MEMO_SIZE",
    "FeaturesProgress",
    "cached",
    "clear",
    "features_progress",
    "of_texts",
    "progress",
    "split_progress",
    "texts_key",
]

# (digest, sha256 of the inputs) -> features, for this process: the latest MEMO_SIZE.
MEMO_SIZE = 16
_MEMO: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
_MEMO_LOCK = threading.Lock()
COMPUTED = {"texts": 0, "images": 0}
"""How many texts and images this process ran through a frozen encoder (the rest came
from a cache)."""

FeaturesProgress = Callable[[str, int, int], None]
"""``(encoder name, rows done, rows in all)``, called as a frozen encoder's features are
computed (not when they come from a cache)."""
_PROGRESS: ContextVar[FeaturesProgress | None] = ContextVar("corel_features_progress", default=None)


@contextmanager
def features_progress(callback: FeaturesProgress | None) -> Iterator[None]:
    """Within the block (this thread's context), features computed report their progress
    to ``callback`` (the engine's ``EngineOptions.on_features``)."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def progress() -> FeaturesProgress | None:
    """The callback features computed now report to, if any."""
    return _PROGRESS.get()


@contextmanager
def split_progress(split: str, before: int, total: int) -> Iterator[None]:
    """Within the block, features computed report as part of a dataset's splits: the
    encoder named with the split (``minilm (train split)``), and rows counted from ``before``
    (the splits computed before this one) of ``total`` (all of them), so that one counter
    runs over the whole dataset rather than starting again per split."""
    outer = _PROGRESS.get()
    if outer is None:
        yield
        return

    def inner(name: str, done: int, _total: int) -> None:
        outer(f"{name} ({split} split)", before + done, total)

    token = _PROGRESS.set(inner)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def texts_key(texts: Sequence[str]) -> str:
    """sha256 of a list of texts (each in order, NUL-separated)."""
    key = hashlib.sha256()
    for t in texts:
        key.update(t.encode("utf-8", "surrogatepass"))
        key.update(b"\0")
    return key.hexdigest()


def cached(key: tuple[str, str], cache_dir: str | os.PathLike[str] | None,
           compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Features under ``key`` (encoder digest, inputs' digest) from this process's memory,
    else ``cache_dir``'s file, else the shared store's (:mod:`corel.encoders.kept`), else
    ``compute()``d and kept in all three."""
    with _MEMO_LOCK:
        held = _MEMO.get(key)
        if held is not None:
            _MEMO.move_to_end(key)
            kept.heard("cached")
            return held
    digest, _, path = key[0].partition(":")
    name = f"{digest[:16]}{'-' + path if path else ''}-{key[1][:32]}.npy"
    found = kept.read(name, cache_dir)  # this host's file, else the shared store's
    if found is not None:
        features = torch.from_numpy(np.load(io.BytesIO(found), allow_pickle=False))
    else:
        features = compute()
        buffer = io.BytesIO()
        np.save(buffer, features.numpy(), allow_pickle=False)
        kept.keep(name, cache_dir, buffer.getvalue())
    with _MEMO_LOCK:
        _MEMO[key] = features
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return features


def of_texts(texts: Sequence[str], record: EncoderRecord, cache_dir: str | os.PathLike[str] | None,
             keep: bool, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """A text encoder's features of ``texts`` (the encoder a run records): from the cache,
    else ``compute()``d, and kept unless ``keep`` is False (a served request's texts are not
    a dataset)."""
    if not keep:
        return compute()
    return cached((record.cache_name, texts_key(texts)), cache_dir, compute)


def clear() -> None:
    """Forget this process's kept features (the files stay)."""
    with _MEMO_LOCK:
        _MEMO.clear()
