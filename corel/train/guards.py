"""The "not learning" judgement, one owner for both loops: a run (or a stacked group's
member) that stays at chance, or whose loss diverges, has failed, and says why.

:class:`ChanceGuard` ends a solo run (``corel.train.solo.fit``) with
:class:`NotLearningError`; :class:`GroupChanceGuard` marks a stacked group's member
failed (``group.failed``) while the others go on (``corel.train.stacked.fit_group``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch

from corel.loss_catalog import declaration
from corel.spec import ExperimentSpec
from corel.train.callbacks import Callback, EpochMetrics, GroupCallback, GroupView, RunView

# The fewest epochs at chance in a row after which a run has failed (see not_learning).
CHANCE_EPOCHS = 5


class NotLearningError(ValueError):
    """Training stopped because the model is not learning (see :func:`not_learning`)."""


def chance_accuracy(labels: torch.Tensor) -> float:
    """The accuracy of always answering the most frequent class of ``labels``."""
    if len(labels) == 0:
        return float("nan")
    return float(torch.bincount(labels).max()) / len(labels)


_UNBOUNDED = ("{loss} with lam = {lam} < {least:g} has no minimum: its loss falls "
              "without bound as the representations move away from every class vector, so "
              "the repulsion wins and training diverges. Use lam >= {least:g}.")


def chance_ceiling(chance: float, n_val: int | None = None) -> float:
    """The highest validation accuracy still "at chance": 5% of the way from chance to
    perfect (0.145 for ten balanced classes), or two standard errors of an accuracy that
    is chance on ``n_val`` rows, whichever is more (a small validation set is noisy:
    0.2 above chance for 22 rows of three classes)."""
    margin = 0.05 * (1.0 - chance)
    if n_val:
        margin = max(margin, 2.0 * math.sqrt(chance * (1.0 - chance) / n_val))
    return chance + margin


def not_learning(
    history: Sequence[EpochMetrics], chance: float, spec: ExperimentSpec, epochs: int = CHANCE_EPOCHS,
    n_val: int | None = None, n_train: int | None = None,
) -> str | None:
    """Why a run has failed to train, or None while it has not.

    "At chance" is a validation accuracy at most :func:`chance_ceiling` (``n_val``: the
    number of validation rows, for the noise of a small set). A run has failed when

    * its training loss is not finite;
    * it is Gaussian-COREL with lam < 0.5, whose loss has no minimum, and either its
      training loss has been negative and falling for ``epochs`` epochs (a loss that
      cannot go below 0 at lam >= 0.5: the representations are running away, whatever
      the accuracy of the moment) or it has been at chance for that long;
    * it has been at chance for its last ``max(epochs, spec.epochs / 3)`` epochs: it
      never learned, or learned and then collapsed. (A slow start is not a failure:
      Center loss at lam 0.7 on AG News sits at chance for 10 of 40 epochs, then
      reaches 83%.)
    * it has finished, however few its epochs, and never got above chance: a run at
      chance is not a success, whatever its length.

    ``epochs=0`` turns the check off. The advice follows from the run (``n_train``: its
    training rows, to count its steps): see :func:`_advice`.
    """
    if not history or epochs <= 0 or math.isnan(chance):
        return None  # (no validation rows: nothing to judge by)
    last = history[-1]
    if not math.isfinite(last.train_loss):
        return (f"the training loss became {last.train_loss} at epoch {last.epoch}: training "
                f"diverged. Try a smaller learning rate (the paper's is 1e-4).")
    decl = declaration(spec.loss)
    least = decl.min_lam  # below it the loss has no minimum (the declaration says where)
    diverging = least is not None and spec.lam < least
    unbounded = _UNBOUNDED.format(loss=decl.display, lam=spec.lam, least=least or 0.0)
    if diverging and len(history) >= epochs:
        losses = [m.train_loss for m in history[-epochs:]]
        if losses[0] < 0 and all(b < a for a, b in itertools.pairwise(losses)):
            return (f"the model is not learning: its training loss has been negative and "
                    f"falling for {epochs} epochs (now {last.train_loss:.4g}), so the "
                    f"representations are running away. {unbounded}")
    patience = epochs if diverging else max(epochs, math.ceil(spec.epochs / 3))
    ceiling = chance_ceiling(chance, n_val)
    best = max(history, key=lambda m: m.val_accuracy)
    finished = len(history) >= spec.epochs
    if finished and best.val_accuracy <= ceiling:
        patience = len(history)
    elif len(history) < patience or any(m.val_accuracy > ceiling for m in history[-patience:]):
        return None
    span = f"{patience} epochs" if patience != 1 else "its one epoch"
    story = (f"validation accuracy has stayed at chance for {span} (at most "
             f"{max(m.val_accuracy for m in history[-patience:]):.3f}; always answering the most "
             f"frequent class scores {chance:.3f})")
    if best.val_accuracy > ceiling:
        story += f", after reaching {best.val_accuracy:.3f} at epoch {best.epoch}"
    why = unbounded if diverging else _advice(history, spec, n_train, collapsed=best.val_accuracy > ceiling)
    if not diverging and "lam" in decl.params:
        why = why[:-1] + "; or another lam."
    return f"the model is not learning: {story}. {why}"


FEW_STEPS = 300
"""Below this many optimiser steps a run at chance has most likely not trained long enough."""


def _advice(history: Sequence[EpochMetrics], spec: ExperimentSpec, n_train: int | None, collapsed: bool) -> str:
    """What would help a run at chance, from what it did: one that learned and collapsed
    needs a smaller learning rate; one that took few steps, more of them (or a larger rate,
    where it is at the paper's); otherwise a smaller rate."""
    quick = 1e-3  # the quick budget's (corel.spec.BUDGETS)
    if not collapsed and n_train:
        per_epoch = math.ceil(n_train / spec.batch_size)
        steps = len(history) * per_epoch
        if steps < FEW_STEPS:
            out = (f"It took only {steps} optimiser step{'s' if steps != 1 else ''} ({len(history)} "
                   f"epoch{'s' if len(history) != 1 else ''} of {per_epoch}): train more epochs")
            if per_epoch < 10:
                out += f", or a smaller batch_size (this run's is {spec.batch_size} for {n_train} training rows)"
            if spec.lr < quick:
                out += f", or a larger learning rate (the quick budget's is 1e-3; this run's is {spec.lr:g})"
            return out + "."
    if not collapsed and spec.lr < quick:
        return (f"Try a larger learning rate (the quick budget's is 1e-3; this run's is {spec.lr:g}) "
                "or more epochs.")
    return f"Try a smaller learning rate (this run's is {spec.lr:g}; the paper's is 1e-4)."


class ChanceGuard(Callback):
    """Ends training with :class:`NotLearningError` once :func:`not_learning` says so."""

    def __init__(self, chance: float, epochs: int = CHANCE_EPOCHS, n_val: int | None = None) -> None:
        self.chance = chance
        self.epochs = epochs
        self.n_val = n_val

    def on_epoch_end(self, metrics: EpochMetrics, run: RunView) -> bool | None:
        verdict = not_learning(run.history, self.chance, run.spec, self.epochs, self.n_val,
                               len(run.data.y_train))
        if verdict is not None:
            raise NotLearningError(verdict)
        return None


class GroupChanceGuard(GroupCallback):
    """:class:`ChanceGuard` for a stacked group: a member that :func:`not_learning` judges
    failed is marked in ``group.failed`` (member index: the verdict) and rides along
    until the group ends; the others go on. Asks the group to stop once every member
    has failed. Runs before the group's other callbacks, so that they see the verdicts
    of the epoch they record."""

    def __init__(self, chance: float, epochs: int = CHANCE_EPOCHS, n_val: int | None = None) -> None:
        self.chance = chance
        self.epochs = epochs
        self.n_val = n_val

    def on_epoch_end(self, metrics: list[EpochMetrics], group: GroupView) -> bool | None:
        for i in range(group.size):
            if i not in group.failed:
                verdict = not_learning(group.histories[i], self.chance, group.specs[i], self.epochs,
                                       self.n_val, group.data.y_train.shape[-1])
                if verdict is not None:
                    group.failed[i] = verdict
        return len(group.failed) == group.size
