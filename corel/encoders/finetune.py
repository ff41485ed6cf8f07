"""Pretrained encoders fine-tuned end to end with the head (``"encoder_mode": "finetune"``).

The model is the pretrained encoder (its "tower"), then the paper's two hidden layers, then
the loss's head, trained together: the tower's trainable parameters at the spec's
``encoder_lr`` (default: a tenth of ``lr``), reached by a linear warm-up over the spec's
``warmup`` share of the steps (default a tenth), the rest at ``lr`` from the first step. ``trainable_blocks``: only
the tower's last N blocks (a text transformer's layers, an image network's stages) train,
with what follows them; the rest stays as pretrained (its BatchNorm statistics too).

Inputs are what comes before the encoder, as one float tensor per row so that the engine's
batching, shuffling and checkpoints apply unchanged (each family's ``inputs``: a text
family's token ids and attention masks, an image family's pixels). Each family builds its
tower (:class:`KeepFrozenInEval`); this module holds what every tower shares.

A checkpoint holds the fine-tuned weights: the whole tower, or with ``trainable_blocks``
the trained blocks alone (corel.train.checkpoints.model_state), the frozen part coming from
the encoder's files when the model is built. Not stackable.

The frozen lower part's outputs are computed once (:class:`FrozenOutputs`). With
``trainable_blocks`` below the tower's count, the embeddings (or the stem) and the blocks
below the trainable ones never change, so while the engine trains and validates
(:func:`frozen_outputs_kept`) each row's output of that lower part is computed once, a text
alone (no padding), images in chunks of a fixed size (the image family's ``KEEP_CHUNK``): the same numbers
whatever batch or run the row later appears in, and kept in this process; the steps then run only the trainable
upper part. Every run and sweep member on the same encoder with the same frozen part reuses
them. The result equals the uncached computation to float rounding (the lower part's
matrix products over other shapes than a training batch's), and is itself deterministic: a run
resumed from its checkpoint ends bit for bit as the whole run in float64.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

__all__ = ["FROZEN_OUTPUTS", "WARMUP", "FineTuned", "FrozenOutputs", "KeepFrozenInEval", "encoder_lr",
           "freeze", "frozen_outputs_heard", "frozen_outputs_kept", "optimizer_groups", "warmed_up_lr"]


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
            heard = _HEARD.get()
            if heard is not None:
                heard(len(first))
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

_HEARD: ContextVar[Callable[[int], None] | None] = ContextVar("corel_frozen_outputs_heard", default=None)


@contextmanager
def frozen_outputs_heard(callback: Callable[[int], None] | None) -> Iterator[None]:
    """Within the block (this thread's context), ``callback(rows)`` hears of each batch of
    rows whose frozen outputs were computed (not found kept): the engine shows a fine-tune's
    first epoch, which computes them for every row, as a phase."""
    token = _HEARD.set(callback)
    try:
        yield
    finally:
        _HEARD.reset(token)

"""This process's frozen lower parts' outputs (every run and sweep member shares them)."""


class KeepFrozenInEval(nn.Module):
    """A tower whose frozen modules stay in eval mode while it trains (a frozen BatchNorm's
    statistics, a frozen dropout's identity); with a frozen lower part (``lower`` > 0
    blocks), its outputs come from ``kept`` while the engine sets it."""

    frozen: list[nn.Module]
    lower = 0
    identity = ""
    kept: FrozenOutputs | None = None

    def train(self, mode: bool = True) -> KeepFrozenInEval:
        super().train(mode)
        for module in getattr(self, "frozen", []):
            module.eval()
        return self

    def _key(self, x: torch.Tensor) -> tuple[Any, ...]:
        return (type(self).__name__, self.identity, self.lower, x.dtype, str(x.device))



def freeze(modules: Sequence[nn.Module]) -> list[nn.Module]:
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)
    return list(modules)



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
    if not isinstance(tower, KeepFrozenInEval) or not tower.lower or kept is None:
        yield
        return
    tower.kept = kept
    try:
        yield
    finally:
        tower.kept = None


def optimizer_groups(model: nn.Module, lr: float, encoder_lr: float | None = None) -> list[dict[str, Any]] | None:
    """A fine-tuned model's optimiser groups: its tower's trainable parameters at
    ``encoder_lr`` (default a tenth of ``lr``; the first group, which the warm-up sets), the
    rest at ``lr``; None for a model with no tower."""
    tower = getattr(getattr(model, "encoder", model), "tower", None)
    if tower is None:
        return None
    own = {id(p) for p in tower.parameters()}
    return [{"params": [p for p in tower.parameters() if p.requires_grad], "lr": encoder_lr or lr / 10},
            {"params": [p for p in model.parameters() if id(p) not in own], "lr": lr}]
