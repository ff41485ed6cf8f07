"""What a training loop reports: one epoch's metrics, and the callbacks that receive them
(a solo run's and a stacked group's), with what a callback may read of the run or group
(:class:`RunView`, :class:`GroupView`): the loops' classes satisfy them, and nothing here
imports the loops."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from corel.data import Dataset
    from corel.spec import ExperimentSpec


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


class Trained(Protocol):
    """What a solo run and a stacked group both have: the data, the device and precision
    they train on, and the epochs done."""

    @property
    def data(self) -> Dataset: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def precision(self) -> str: ...
    @property
    def epoch(self) -> int: ...


class RunView(Trained, Protocol):
    """What a callback reads of a solo run (:class:`corel.train.Run`)."""

    @property
    def spec(self) -> ExperimentSpec: ...
    @property
    def history(self) -> list[EpochMetrics]: ...
    @property
    def best_epoch(self) -> int: ...
    @property
    def best_val_accuracy(self) -> float: ...
    @property
    def test_accuracy(self) -> float | None: ...

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume or serve (see ``Run.checkpoint``)."""
        ...

    def best_checkpoint(self) -> dict[str, Any]:
        """A serving checkpoint of the best-validation epoch."""
        ...


class GroupView(Trained, Protocol):
    """What a group callback reads of a stacked group (:class:`corel.train.StackedRun`);
    ``failed`` (member index: why it failed to learn) is the one thing it may change."""

    @property
    def specs(self) -> list[ExperimentSpec]: ...
    @property
    def size(self) -> int: ...
    @property
    def histories(self) -> list[list[EpochMetrics]]: ...
    @property
    def failed(self) -> dict[int, str]: ...

    def member_run(self, i: int) -> RunView:
        """Member i as a solo run (see ``StackedRun.member_run``)."""
        ...


class Callback:
    """Receives progress; return True from a hook to ask training to stop."""

    def on_epoch_end(self, metrics: EpochMetrics, run: RunView) -> bool | None:
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

    def on_epoch_end(self, metrics: list[EpochMetrics], group: GroupView) -> bool | None:
        return None

    def on_batch_end(self, step: int) -> bool | None:
        return None

    def on_prune(self, group: GroupView, kept: list[int], why: dict[int, str], rung: int) -> None:
        """The group drops members at epoch ``rung`` (corel.train.pruning), before it is
        rebuilt: ``group`` is still the whole group (``group.member_run(j).best_checkpoint()``
        for a member that goes); from the next epoch its member i is the one at position
        ``kept[i]``; ``why[j]``: why the member at position j goes."""
        return None
