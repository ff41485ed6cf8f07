"""The stacked loop: :func:`fit_group` trains a group of specs that differ only in loss
parameters and seed as one :class:`corel.stacked.StackedRun`, as :func:`corel.training.fit` trains
one, with the same guard against runs that do not learn (:mod:`corel.guards`).

The pieces it is made of: which specs go together (:mod:`corel.grouping`), the stacked
model and its optimizer (:mod:`corel.stacked`), the callbacks (:mod:`corel.progress`);
their public names are importable from here too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from corel.data import Dataset, load_dataset
from corel.grouping import as_spec, check_group, group_key, group_specs
from corel.guards import CHANCE_EPOCHS, GroupChanceGuard, chance_accuracy
from corel.progress import GroupCallback
from corel.spec import ExperimentSpec
from corel.stacked import StackedRun
from corel.training import FitResult

__all__ = ["GroupCallback", "StackedRun", "fit_group", "group_key", "group_specs"]


def fit_group(
    specs: Sequence[ExperimentSpec | dict[str, Any]],
    callbacks: Iterable[GroupCallback] = (),
    *,
    data: Dataset | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    device: str | torch.device | None = None,
    checkpoints: Sequence[dict[str, Any]] | None = None,
    chance_epochs: int = CHANCE_EPOCHS,
) -> list[FitResult]:
    """:func:`corel.training.fit` for a group: one :class:`FitResult` per spec, in order.

    Every callback sees every epoch; one that returns True stops the whole group, and
    every result is then ``stopped``. A member that :func:`corel.guards.not_learning`
    judges failed (``chance_epochs=0``: none) is marked in ``group.failed`` before the
    callbacks see the epoch, rides along with the others, and ends with its verdict in
    ``FitResult.failed``; the group stops when every member has failed.
    """
    checked = [as_spec(s) for s in specs]
    check_group(checked)
    if data is None:
        data = load_dataset(checked[0], data_dir)
    group = StackedRun.start(checked, data, device=device, checkpoints=checkpoints)
    y_val = group.data.y_val
    guard = GroupChanceGuard(chance_accuracy(y_val), chance_epochs, len(y_val))
    cbs = [guard, *callbacks]
    stopped = False
    while group.epoch < group.epochs:
        metrics = group.run_epoch(cbs)
        if metrics is None or any([bool(cb.on_epoch_end(metrics, group)) for cb in cbs]):
            stopped = True
            break
    return [FitResult.from_run(group.member_run(i), stopped, group.failed.get(i))
            for i in range(group.size)]
