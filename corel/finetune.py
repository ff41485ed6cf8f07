"""Pretrained encoders fine-tuned end to end with the head (``"encoder_mode": "finetune"``).

The model is the pretrained encoder (its "tower"), then the paper's two hidden layers, then
the loss's head, trained together: the tower's trainable parameters at the spec's
``encoder_lr`` (default: a tenth of ``lr``), the rest at ``lr``. ``trainable_blocks``: only
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
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from corel.encoder_catalog import pretrained
from corel.models import FFNN

__all__ = ["FineTuned", "ImageTower", "TextTower", "build", "encoder_lr", "text_preprocessing",
           "tokens"]


def encoder_lr(spec: Any) -> float:
    """The tower's learning rate: the spec's ``encoder_lr``, else a tenth of its ``lr``."""
    return float(spec.encoder_lr) if spec.encoder_lr is not None else float(spec.lr) / 10


class _KeepFrozenInEval(nn.Module):
    """A tower whose frozen modules stay in eval mode while it trains (a frozen BatchNorm's
    statistics, a frozen dropout's identity)."""

    frozen: list[nn.Module]

    def train(self, mode: bool = True) -> _KeepFrozenInEval:
        super().train(mode)
        for module in getattr(self, "frozen", []):
            module.eval()
        return self


def _freeze(modules: Sequence[nn.Module]) -> list[nn.Module]:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)
    return list(modules)


class TextTower(_KeepFrozenInEval):
    """A sentence-transformers model's modules, from (ids, mask) rows."""

    def __init__(self, st_model: Any, trainable_blocks: int | None) -> None:
        super().__init__()
        self.steps = nn.ModuleList(copy.deepcopy(list(st_model)))
        transformer: Any = self.steps[0].auto_model
        self.token_type_ids = "token_type_ids" in getattr(self.steps[0].tokenizer, "model_input_names", ())
        layers = list(transformer.encoder.layer)
        self.blocks = len(layers)
        frozen: list[nn.Module] = []
        if trainable_blocks is not None:
            if trainable_blocks > len(layers):
                raise ValueError(f"trainable_blocks is {trainable_blocks}; this encoder has {len(layers)} blocks")
            frozen = [transformer.embeddings, *layers[: len(layers) - trainable_blocks]]
        for p in self.parameters():
            p.requires_grad_(True)
        self.frozen = _freeze(frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids, mask = x[:, 0].long(), x[:, 1].long()
        keep = max(int(mask.sum(1).max()), 1) if len(mask) else 1  # this batch's longest text
        features: dict[str, Any] = {"input_ids": ids[:, :keep], "attention_mask": mask[:, :keep]}
        if self.token_type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        for step in self.steps:
            features = step(features)
        out: torch.Tensor = features["sentence_embedding"]
        return out.to(x.dtype)


class ImageTower(_KeepFrozenInEval):
    """A timm image encoder after corel.pretrained's resize and normalisation."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, model: nn.Module, meta: dict[str, Any], trainable_blocks: int | None) -> None:
        super().__init__()
        self.model = copy.deepcopy(model)
        self.size = int(meta["image_size"])
        self.register_buffer("mean", torch.tensor(meta["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(meta["std"]).view(1, 3, 1, 1), persistent=False)
        stages = list(getattr(self.model, "blocks", None) or getattr(self.model, "stages", None) or [])
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
            frozen = [m for _, m in list(self.model.named_children())[:first]]
            frozen += stages[: len(stages) - trainable_blocks]
        self.frozen = _freeze(frozen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        x = nn.functional.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False,
                                      antialias=x.shape[-1] > self.size)
        out: torch.Tensor = self.model((x - self.mean.to(x.dtype)) / self.std.to(x.dtype))
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


def build(spec: Any, input_shape: tuple[int, ...]) -> FineTuned:
    """The fine-tuned encoder of ``spec`` (loaded from its pretrained weights; a checkpoint's
    state then replaces them) over inputs of ``input_shape``."""
    from corel import pretrained as pre

    decl = pretrained(spec.encoder, spec.modality)
    if spec.modality == "text":
        folder = pre._custom_folder(spec.encoder_path) if decl.custom else pre.encoder_path(spec.encoder)
        tower: nn.Module = TextTower(pre.load_text_encoder(folder), spec.trainable_blocks)
        width = int(pre.load_text_encoder(folder).get_embedding_dimension())
    else:
        path = spec.encoder_path if decl.custom else None
        meta = pre.image_preprocessing(spec.encoder, {}, path)["encoder"]
        tower = ImageTower(pre.load_image_encoder(spec.encoder, path=path), meta, spec.trainable_blocks)
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
