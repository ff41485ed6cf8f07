"""Pretrained encoders fine-tuned end to end with the head (``"encoder_mode": "finetune"``).

The model is the pretrained encoder (its "tower"), then the paper's two hidden layers, then
the loss's head, trained together: the tower's trainable parameters at the spec's
``encoder_lr`` (default: a tenth of ``lr``), reached by a linear warm-up over the spec's
``warmup`` share of the steps (default a tenth), the rest at ``lr`` from the first step. ``trainable_blocks``: only
the tower's last N blocks (a text transformer's layers, an image network's stages) train,
with what follows them; the rest stays as pretrained (its BatchNorm statistics too).

Inputs are what comes before the encoder, as one float tensor per row so that the engine's
batching, shuffling and checkpoints apply unchanged:

* text: ``(2, L)``, the token ids and the attention mask from the encoder's own tokenizer,
  padded to the encoder's maximum length ``L`` (the tower trims each batch to its longest
  text; ids are exact in float32);
* images: the pixels as the dataset's loader prepares them; the tower repeats grey to three
  channels, resizes to the encoder's image size and normalises, as :mod:`corel.pretrained`.

A checkpoint holds the fine-tuned weights (the whole tower). Not stackable.

The frozen lower part's outputs are computed once (:class:`FrozenOutputs`). With
``trainable_blocks`` below the tower's count, the embeddings (or the stem) and the blocks
below the trainable ones never change, so while the engine trains and validates
(:func:`frozen_outputs_kept`) each row's output of that lower part is computed once, a text
alone (no padding), images in chunks of a fixed size (:data:`KEEP_CHUNK`): the same numbers
whatever batch or run the row later appears in, and kept in this process; the steps then run only the trainable
upper part. Every run and sweep member on the same encoder with the same frozen part reuses
them. The result equals the uncached computation to float rounding (the lower part's
matrix products over other shapes than a training batch's), and is itself deterministic: a run
resumed from its checkpoint ends bit for bit as the whole run in float64.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from corel.encoder_catalog import pretrained
from corel.models import FFNN

__all__ = ["FROZEN_OUTPUTS", "WARMUP", "FineTuned", "FrozenOutputs", "ImageTower", "TextTower", "build", "encoder_lr",
           "frozen_outputs_kept", "image_stages", "text_layers", "text_preprocessing", "tokens",
           "warmed_up_lr"]


WARMUP = 0.1
"""The default share of a fine-tuned run's steps over which the encoder's rate warms up."""


def encoder_lr(spec: Any) -> float:
    """The tower's learning rate: the spec's ``encoder_lr``, else a tenth of its ``lr``."""
    return float(spec.encoder_lr) if spec.encoder_lr is not None else float(spec.lr) / 10


def warmed_up_lr(spec: Any, step: int, steps_per_epoch: int) -> float:
    """The tower's learning rate at the run's ``step`` (counted from 0 over all epochs): it
    rises linearly to :func:`encoder_lr` over the spec's ``warmup`` share of the steps."""
    share = WARMUP if spec.warmup is None else float(spec.warmup)
    ramp = share * spec.epochs * steps_per_epoch
    full = encoder_lr(spec)
    return full if step + 1 >= ramp else full * (step + 1) / ramp


class FrozenOutputs:
    """Each row's output of a tower's frozen lower part, kept in this process: one table per
    (encoder, frozen part, dtype, device), a row's entry keyed by its input's bytes. At most
    ``limit`` bytes in all: past it, the tables used longest ago go (their rows are computed
    again when next needed)."""

    def __init__(self, limit: int = 4 << 30) -> None:
        self.limit = limit
        self.tables: OrderedDict[tuple[Any, ...], dict[bytes, torch.Tensor]] = OrderedDict()
        self.sizes: dict[tuple[Any, ...], int] = {}
        self.computed = 0  # rows computed (not found): what the tests count
        self.lock = threading.Lock()

    def rows(self, key: tuple[Any, ...], inputs: Sequence[bytes],
             compute: Any) -> list[torch.Tensor]:
        """The outputs of the rows ``inputs`` (their bytes) under ``key``; ``compute(missing)``
        gives the outputs of the rows at the positions ``missing`` where none is kept."""
        with self.lock:
            table = self.tables.setdefault(key, {})
            self.tables.move_to_end(key)
        first: dict[bytes, int] = {}
        for i, raw in enumerate(inputs):
            if raw not in table:
                first.setdefault(raw, i)
        if first:
            computed = compute(list(first.values()))
            with self.lock:
                for raw, row in zip(first, computed, strict=True):
                    table[raw] = row  # kept, or (its table dropped meanwhile) only for this call
                    if key in self.tables:
                        self.sizes[key] = self.sizes.get(key, 0) + row.numel() * row.element_size()
                self.computed += len(first)
                self._trim()
        return [table[raw] for raw in inputs]

    def _trim(self) -> None:
        while len(self.tables) > 1 and sum(self.sizes.values()) > self.limit:
            old, _ = self.tables.popitem(last=False)
            self.sizes.pop(old, None)

    def clear(self) -> None:
        with self.lock:
            self.tables.clear()
            self.sizes.clear()


FROZEN_OUTPUTS = FrozenOutputs()

KEEP_CHUNK = 32
"""Images per forward pass of a frozen lower part's rows (texts go one at a time: each its
own length, no padding)."""
"""This process's frozen lower parts' outputs (every run and sweep member shares them)."""


class _KeepFrozenInEval(nn.Module):
    """A tower whose frozen modules stay in eval mode while it trains (a frozen BatchNorm's
    statistics, a frozen dropout's identity); with a frozen lower part (``lower`` > 0
    blocks), its outputs come from ``kept`` while the engine sets it."""

    frozen: list[nn.Module]
    lower = 0
    identity = ""
    kept: FrozenOutputs | None = None

    def train(self, mode: bool = True) -> _KeepFrozenInEval:
        super().train(mode)
        for module in getattr(self, "frozen", []):
            module.eval()
        return self

    def _key(self, x: torch.Tensor) -> tuple[Any, ...]:
        return (type(self).__name__, self.identity, self.lower, x.dtype, str(x.device))


def text_layers(st_model: Any) -> list[nn.Module]:
    """A sentence-transformers model's transformer layers, what ``trainable_blocks`` counts
    (a BERT-like ``encoder.layer``); empty where it has none such."""
    transformer = getattr(st_model[0], "auto_model", None)
    return list(getattr(getattr(transformer, "encoder", None), "layer", None) or [])


def image_stages(model: nn.Module) -> list[nn.Module]:
    """A timm network's blocks or stages, what ``trainable_blocks`` counts; empty where it has
    none such."""
    return list(getattr(model, "blocks", None) or getattr(model, "stages", None) or [])


def _freeze(modules: Sequence[nn.Module]) -> list[nn.Module]:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)
    return list(modules)


class _Given(nn.Module):
    """In place of a transformer's embeddings: the hidden states given (a frozen lower
    part's kept outputs)."""

    def __init__(self, hidden: torch.Tensor) -> None:
        super().__init__()
        self.hidden = hidden

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.hidden


@contextmanager
def _only_layers(transformer: Any, layers: slice, given: torch.Tensor | None = None) -> Iterator[None]:
    """The transformer with only its layers ``layers`` (and the hidden states ``given`` in
    place of its embeddings' output) for the block."""
    embeddings, stack = transformer.embeddings, transformer.encoder.layer
    try:
        if given is not None:
            transformer.embeddings = _Given(given)
        transformer.encoder.layer = nn.ModuleList(list(stack)[layers])
        yield
    finally:
        transformer.embeddings = embeddings
        transformer.encoder.layer = stack


class TextTower(_KeepFrozenInEval):
    """A sentence-transformers model's modules, from (ids, mask) rows."""

    def __init__(self, st_model: Any, trainable_blocks: int | None, identity: str = "") -> None:
        super().__init__()
        self.identity = identity
        self.steps = nn.ModuleList(copy.deepcopy(list(st_model)))
        transformer: Any = self.steps[0].auto_model
        self.token_type_ids = "token_type_ids" in getattr(self.steps[0].tokenizer, "model_input_names", ())
        layers = text_layers(self.steps)
        self.blocks = len(layers)
        frozen: list[nn.Module] = []
        if trainable_blocks is not None:
            if not layers:
                raise ValueError("trainable_blocks: this encoder has no transformer layers to count "
                                 "(encoder.layer); leave it out to fine-tune all of it")
            if trainable_blocks > len(layers):
                raise ValueError(f"trainable_blocks is {trainable_blocks}; this encoder has {len(layers)} blocks")
            frozen = [transformer.embeddings, *layers[: len(layers) - trainable_blocks]]
            self.lower = len(layers) - trainable_blocks
        for p in self.parameters():
            p.requires_grad_(True)
        self.frozen = _freeze(frozen)

    EVAL_ROWS = 64
    """Rows a forward pass in eval mode, in order of length: a large batch of texts (an
    evaluation's, a latent space's) is not padded to its longest text."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and len(x) > self.EVAL_ROWS:
            # Evaluation: texts of like length together, each group padded to its own longest
            # (over AG News the padding to a whole split's longest was most of the work).
            order = torch.argsort(x[:, 1].long().sum(1), stable=True)
            parts = [self.forward(x[order[i:i + self.EVAL_ROWS]])
                     for i in range(0, len(x), self.EVAL_ROWS)]
            out = torch.empty((len(x), *parts[0].shape[1:]), dtype=parts[0].dtype, device=parts[0].device)
            out[order] = torch.cat(parts)
            return out
        ids, mask = x[:, 0].long(), x[:, 1].long()
        keep = max(int(mask.sum(1).max()), 1) if len(mask) else 1  # this batch's longest text
        features: dict[str, Any] = {"input_ids": ids[:, :keep], "attention_mask": mask[:, :keep]}
        if self.token_type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        if self.kept is not None and self.lower:
            with _only_layers(self.steps[0].auto_model, slice(self.lower, None), self._lower_part(features, x)):
                return self._steps(features, x)
        return self._steps(features, x)

    def _steps(self, features: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        for step in self.steps:
            features = step(features)
        out: torch.Tensor = features["sentence_embedding"]
        return out.to(x.dtype)

    def _lower_part(self, features: dict[str, Any], x: torch.Tensor) -> torch.Tensor:
        """The frozen lower part's output of the batch, (B, longest, width): each row's
        kept output (computed alone where none is kept), zeros past its length (the
        attention mask hides them)."""
        assert self.kept is not None
        transformer: Any = self.steps[0].auto_model
        lengths = [int(n) for n in features["attention_mask"].sum(1).tolist()]
        ids = features["input_ids"]

        def alone(missing: list[int]) -> list[torch.Tensor]:
            out = []
            for i in missing:  # each row alone: no padding, no batch around it
                one = {k: v[i : i + 1, : lengths[i]] for k, v in features.items()}
                with torch.no_grad(), _only_layers(transformer, slice(0, self.lower)):
                    hidden: torch.Tensor = transformer(**one).last_hidden_state[0]
                out.append(hidden.to(x.dtype))  # as kept whether or not autocast ran then
            return out

        rows = self.kept.rows(self._key(x), [ids[i, : lengths[i]].cpu().numpy().tobytes()
                                             for i in range(len(ids))], alone)
        return nn.utils.rnn.pad_sequence(rows, batch_first=True)


class ImageTower(_KeepFrozenInEval):
    """A timm image encoder after corel.pretrained's resize and normalisation."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model: nn.Module, meta: dict[str, Any], trainable_blocks: int | None,
                 identity: str = "") -> None:
        super().__init__()
        self.identity = identity
        self.model = copy.deepcopy(model)
        self.size = int(meta["image_size"])
        self.register_buffer("mean", torch.tensor(meta["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(meta["std"]).view(1, 3, 1, 1), persistent=False)
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
        self.frozen = _freeze(frozen)

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
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = nn.functional.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False,
                                      antialias=x.shape[-1] > self.size)
        return (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kept is not None and self.lower:
            lower, upper = self.parts

            def chunks(missing: list[int]) -> list[torch.Tensor]:
                """The rows in chunks of KEEP_CHUNK images, the last filled up with copies of
                its last row: the same shape every time, so that a row's output does not depend
                on the others beside it (tests/corel/test_finetune.py checks it)."""
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


class FineTuned(nn.Module):
    """The tower, then the paper's FFNN over its output: the model's encoder, h = F(x)."""

    def __init__(self, tower: nn.Module, head_layers: nn.Module) -> None:
        super().__init__()
        self.tower = tower
        self.layers = head_layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(self.tower(x))
        return out


@contextmanager
def frozen_outputs_kept(model: nn.Module, kept: FrozenOutputs | None = FROZEN_OUTPUTS) -> Iterator[None]:
    """For the block, a fine-tuned model's frozen lower part (if it has one) takes its
    outputs from ``kept`` (see the module); any other model is left as it is."""
    tower = getattr(getattr(model, "encoder", model), "tower", None)
    if not isinstance(tower, _KeepFrozenInEval) or not tower.lower or kept is None:
        yield
        return
    tower.kept = kept
    try:
        yield
    finally:
        tower.kept = None


def build(spec: Any, input_shape: tuple[int, ...]) -> FineTuned:
    """The fine-tuned encoder of ``spec`` (loaded from its pretrained weights; a checkpoint's
    state then replaces them) over inputs of ``input_shape``."""
    from corel import pretrained as pre

    decl = pretrained(spec.encoder, spec.modality)
    if spec.modality == "text":
        folder = pre._custom_folder(spec.encoder_path) if decl.custom else pre.encoder_path(spec.encoder)
        tower: nn.Module = TextTower(pre.load_text_encoder(folder), spec.trainable_blocks,
                                     pre.encoder_digest(folder))
        width = int(pre.load_text_encoder(folder).get_embedding_dimension())
    else:
        path = spec.encoder_path if decl.custom else None
        meta = pre.image_preprocessing(spec.encoder, {}, path)["encoder"]
        tower = ImageTower(pre.load_image_encoder(spec.encoder, path=path), meta, spec.trainable_blocks,
                           f"{spec.encoder}:{meta.get('digest', '')}")
        width = int(meta["features"])
    return FineTuned(tower, FFNN((width,), spec.hidden))


def text_preprocessing(name: str, path: Any = None) -> dict[str, Any]:
    """What a fine-tuned text run records: the encoder by name and digest, its tokenizer's
    maximum length (the rows' width) and the input's layout."""
    from corel import pretrained as pre

    frozen = pre.text_preprocessing(name, path)
    folder = pre.local_path(frozen["encoder"]["digest"]) if pretrained(name, "text").custom else pre.encoder_path(name)
    length = int(pre.load_text_encoder(folder).max_seq_length)
    return {**frozen, "input_shape": [2, length],
            "encoder": {**frozen["encoder"], "mode": "finetune", "max_length": length},
            "input": "one string per sample, through the encoder's own tokenizer: token ids and "
                     "attention mask, padded to max_length"}


def tokens(texts: Sequence[str], preprocessing: dict[str, Any]) -> torch.Tensor:
    """Texts as a fine-tuned text run takes them: (N, 2, max_length) float32, ids and mask."""
    from corel import pretrained as pre

    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, not one string; wrap it: [text]")
    meta = preprocessing["encoder"]
    custom = pretrained(meta["name"], "text").custom
    folder = pre.local_path(meta["digest"]) if custom else pre.encoder_path(meta["name"])
    if pre.encoder_digest(folder) != meta["digest"]:
        raise ValueError(f"encoder {meta['name']!r} here is not the one this model was trained on")
    length = int(meta["max_length"])
    tokenizer = pre.load_text_encoder(folder).tokenizer
    out = torch.zeros(len(texts), 2, length)
    for start in range(0, len(texts), 1024):
        batch = tokenizer(list(texts[start:start + 1024]), padding="max_length", truncation=True,
                          max_length=length, return_tensors="pt")
        out[start:start + 1024, 0] = batch["input_ids"].float()
        out[start:start + 1024, 1] = batch["attention_mask"].float()
    return out
