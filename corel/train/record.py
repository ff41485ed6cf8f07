"""A run's bookkeeping, one record per solo run and one per stacked member: the epochs'
metrics, the epoch of best validation accuracy with its weights, and the test accuracy
measured at that epoch (the paper's protocol: the reported test accuracy is the one at
the epoch of best validation accuracy)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from corel.train.callbacks import EpochMetrics

__all__ = ["Record"]

Tensors = dict[str, torch.Tensor]


@dataclass
class Record:
    """What one run has been through: ``history`` (one :class:`EpochMetrics` an epoch) and
    its best epoch so far (``best_epoch`` 0 and ``best_val_accuracy`` -1 before the first)."""

    history: list[EpochMetrics] = field(default_factory=list)
    best_epoch: int = 0
    best_val_accuracy: float = -1.0
    test_accuracy: float | None = None
    best_state: Tensors | None = None
    keep_last: bool = False
    """Every epoch is the new best: a few-shot run's (spec.fewshot), which has no labelled rows
    besides its shots to choose an epoch by, keeps its last, as the protocol's heads do."""

    def improves(self, val_accuracy: float) -> bool:
        """Whether an epoch of this validation accuracy is the new best: above the best so
        far, or tied with it (the later of tied epochs is the best: it has trained longer, and
        on a small validation split ties are common, where the earliest would serve a model
        of its first epoch); any epoch where the record keeps the last."""
        return self.keep_last or val_accuracy >= self.best_val_accuracy

    def observe(
        self, epoch: int, *, train_loss: float, train_accuracy: float, val_accuracy: float,
        seconds: float, test_accuracy: float | None, state: Callable[[], Tensors],
    ) -> EpochMetrics:
        """Record a finished epoch and return its metrics. Where its validation accuracy
        improves (:meth:`improves`: the loop measures ``test_accuracy`` then, else passes
        None), it becomes the best epoch and ``state()`` (the weights, on the CPU) is kept."""
        is_best = self.improves(val_accuracy)
        test = test_accuracy if is_best else None
        if is_best:
            self.best_epoch, self.best_val_accuracy, self.test_accuracy = epoch, val_accuracy, test
            self.best_state = state()
        metrics = EpochMetrics(epoch=epoch, train_loss=train_loss, train_accuracy=train_accuracy,
                               val_accuracy=val_accuracy, seconds=seconds, is_best=is_best,
                               test_accuracy=test)
        self.history.append(metrics)
        return metrics

    def to_checkpoint(self) -> dict[str, Any]:
        """The record's part of a checkpoint: ``history`` and ``best``."""
        return {
            "history": [m.to_dict() for m in self.history],
            "best": {
                "epoch": self.best_epoch,
                "val_accuracy": self.best_val_accuracy,
                "test_accuracy": self.test_accuracy,
                "model": self.best_state,
            },
        }

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any], keep_last: bool = False) -> Record:
        """The record a checkpoint written by :meth:`to_checkpoint` carries."""
        best = ckpt["best"]
        return cls(history=[EpochMetrics(**m) for m in ckpt["history"]], best_epoch=int(best["epoch"]),
                   best_val_accuracy=float(best["val_accuracy"]), test_accuracy=best["test_accuracy"],
                   best_state=best["model"], keep_last=keep_last)

    def snapshot(self) -> Record:
        """A copy that later epochs do not change (the best weights are shared: never
        changed in place, only replaced)."""
        return Record(list(self.history), self.best_epoch, self.best_val_accuracy,
                      self.test_accuracy, self.best_state, self.keep_last)
