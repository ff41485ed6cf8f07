"""What a training loop reports: one epoch's metrics, and the callbacks that receive them
(a solo run's and a stacked group's)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from corel.train.solo import Run
    from corel.train.stacked import StackedRun


@dataclass(frozen=True)
class EpochMetrics:
    """What one epoch produced. ``test_accuracy`` is measured only when validation improves."""

    epoch: int  # 1-based
    train_loss: float
    train_accuracy: float
    val_accuracy: float
    seconds: float
    is_best: bool
    test_accuracy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Callback:
    """Receives progress; return True from a hook to ask training to stop."""

    def on_epoch_end(self, metrics: EpochMetrics, run: Run) -> bool | None:
        return None

    def on_batch_end(self, step: int) -> bool | None:
        return None


class GroupCallback:
    """Receives a group's progress; return True from a hook to stop the whole group.

    ``on_epoch_end`` is called once per epoch with every member's metrics
    (``metrics[i]`` is member i's), so that a caller can record all of them, with
    ``group.member_run(i).checkpoint()`` for each, in one transaction; members that have
    failed to learn are in ``group.failed`` (see :class:`corel.train.guards.GroupChanceGuard`).
    ``on_batch_end`` runs after every optimizer step (cancel between batches).
    """

    def on_epoch_end(self, metrics: list[EpochMetrics], group: StackedRun) -> bool | None:
        return None

    def on_batch_end(self, step: int) -> bool | None:
        return None
