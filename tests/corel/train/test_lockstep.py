"""Stacks of other losses trained in lockstep (corel.train.lockstep): a sweep of every loss
takes each pass together, and each member ends as it does in its own stack.

Not marked `kernels`: every figure is float64, and each assertion compares two computations
of this process (the lockstep sweep and each loss's own stack), as tests/corel/train/test_pruning.py's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from corel.data import load_dataset
from corel.loss_catalog import LOSS_NAMES, declaration
from corel.spec import ExperimentSpec
from corel.train import EngineOptions, GroupCallback, StackedRun, fit_group, fit_sweep
from corel.train.lockstep import lockstep_key, lockstep_pass

BASE = {"dataset": "digits", "epochs": 2, "batch_size": 64, "lr": 1e-3}


@pytest.fixture(scope="module")
def digits64():
    # The first 320 training rows: 5 steps a pass, enough for the orders and the stops below,
    # and every comparison holds whatever the rows (the file alone: 6.0 s, against 10.4 s on
    # all of them; in make test-fast the two lockstep sweeps took 22.7 s).
    return load_dataset(ExperimentSpec(dataset="digits", train_subset=320)).astype(torch.float64)


def _specs(seeds: tuple[int, ...]) -> list[ExperimentSpec]:
    return [ExperimentSpec(**BASE, loss=loss, seed=seed, **({"lam": 0.7} if "lam" in declaration(loss).params else {}))
            for loss in LOSS_NAMES for seed in seeds]


class Steps(GroupCallback):
    """The step of every on_batch_end, in the order heard."""

    def __init__(self):
        self.steps: list[int] = []

    def on_batch_end(self, step):
        self.steps.append(step)
        return False


def _worst(a, b) -> float:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


@pytest.mark.parametrize("seeds", [(0,), (0, 1)], ids=["one seed", "two seeds"])
def test_every_loss_steps_in_lockstep_and_each_member_ends_as_in_its_own_stack(digits64, seeds):
    specs = _specs(seeds)
    heard = Steps()
    swept = fit_sweep(specs, [heard], data=digits64, chance_epochs=0)
    # In lockstep: each step of the pass is taken by all eleven stacks before the next one
    # (one after another, the first stack would hear 0, 1, 2, ... first).
    assert heard.steps[: len(LOSS_NAMES)] == [0] * len(LOSS_NAMES), heard.steps[:20]
    apart = Steps()
    separate = fit_sweep(specs, [apart], data=digits64, chance_epochs=0, options=EngineOptions(lockstep=False))
    assert apart.steps[:3] == [0, 1, 2] and sorted(apart.steps) == sorted(heard.steps)
    for loss in LOSS_NAMES:
        mine = [i for i, s in enumerate(specs) if s.loss == loss]
        own = fit_group([specs[i] for i in mine], data=digits64, chance_epochs=0)
        for i, alone in zip(mine, own, strict=True):
            for got in (swept[i], separate[i]):
                assert _worst(got, alone) <= 1e-10, (loss, specs[i].seed)
                assert len(got.history) == len(alone.history) == BASE["epochs"]
                for m, n in zip(got.history, alone.history, strict=True):
                    assert abs(m.train_loss - n.train_loss) <= 1e-10 * max(1.0, abs(n.train_loss)), loss
                    assert (m.train_accuracy, m.val_accuracy) == (n.train_accuracy, n.val_accuracy), loss
                assert got.test_accuracy == alone.test_accuracy, loss


class StopAt(GroupCallback):
    def __init__(self, step: int):
        self.step = step

    def on_batch_end(self, step):
        return step == self.step


def test_a_stack_stopped_mid_pass_leaves_the_others_going(digits64):
    specs = _specs((0, 1))
    cosine = [s for s in specs if s.loss == "cosine"]
    center = [s for s in specs if s.loss == "center"]
    groups = [StackedRun.start(cosine, digits64), StackedRun.start(center, digits64)]
    assert lockstep_key(groups[0]) == lockstep_key(groups[1]) is not None
    passes = lockstep_pass(groups, [[StopAt(3)], []])
    assert passes[0] is None  # its callback stopped it
    alone = StackedRun.start(center, digits64)
    want = alone.train_pass()
    got = passes[1]
    assert got is not None and want is not None
    assert got[1] == want[1]
    assert max(abs(a - b) for a, b in zip(got[0], want[0], strict=True)) <= 1e-9
    for name in alone.params:
        assert float((groups[1].params[name] - alone.params[name]).detach().abs().max()) <= 1e-12, name


def test_only_stacks_that_draw_the_same_batches_share_a_key(digits64):
    one = StackedRun.start(_specs((0,))[:1], digits64)
    cosine = [s for s in _specs((0,)) if s.loss == "cosine"]
    assert lockstep_key(one) == lockstep_key(StackedRun.start(cosine, digits64))
    # Another seed draws another order; another batch size other batches; a stack further
    # along (another generator state) other batches again.
    assert lockstep_key(one) != lockstep_key(StackedRun.start([cosine[0].model_copy(update={"seed": 1})], digits64))
    assert lockstep_key(one) != lockstep_key(
        StackedRun.start([cosine[0].model_copy(update={"batch_size": 32})], digits64))
    ahead = StackedRun.start(cosine, digits64)
    ahead.run_epoch()
    assert lockstep_key(one) != lockstep_key(ahead)
    # Wider inputs than MAX_INPUTS (pixels, not features) take their own passes: there it was slower.
    wide = dataclasses.replace(digits64, **{f"x_{s}": getattr(digits64, f"x_{s}").flatten(1).repeat(1, 10)
                                            for s in ("train", "val", "test")}, input_shape=(640,))
    assert lockstep_key(StackedRun.start(cosine[:1], wide)) is None
    # A CNN runs member by member: it takes its own pass.
    cnn = ExperimentSpec(**BASE, loss="cosine", model="cnn")
    assert lockstep_key(StackedRun.start([cnn], load_dataset(cnn).astype(torch.float64))) is None


def test_text_stacks_with_dropout_step_in_lockstep_as_each_alone(shared_datasets):
    """The paper's AG News FFNN has dropout: each member's masks come from its own stream in
    lockstep too (one stream per member, whichever stack it is in)."""
    text = {"dataset": "ag-news", "train_subset": 96, "epochs": 2, "batch_size": 32, "lr": 1e-3,
            "dataset_path": str(shared_datasets / "ag_news" / "test.csv")}
    data = load_dataset(ExperimentSpec(**text)).astype(torch.float64)
    specs = [ExperimentSpec(**text, loss=loss, seed=seed) for loss in ("cce", "center", "cosine") for seed in (0, 1)]
    heard = Steps()
    swept = fit_sweep(specs, [heard], data=data, chance_epochs=0)
    assert heard.steps[:3] == [0, 0, 0], heard.steps
    for loss in ("cce", "center", "cosine"):
        mine = [i for i, s in enumerate(specs) if s.loss == loss]
        own = fit_group([specs[i] for i in mine], data=data, chance_epochs=0)
        for i, alone in zip(mine, own, strict=True):
            assert _worst(swept[i], alone) <= 1e-10, (loss, specs[i].seed)
            assert [m.val_accuracy for m in swept[i].history] == [m.val_accuracy for m in alone.history]


def test_a_pruned_sweep_in_lockstep_keeps_the_survivors_of_the_sweep_in_turn(digits64):
    """Pruning across groups (issue 62's) works in lockstep as it does in turn: the same
    members pruned at the same rungs, the survivors (their stacks rebuilt from checkpoints,
    and still in lockstep) ending as in turn."""
    specs = [ExperimentSpec(**{**BASE, "epochs": 6}, loss=loss, lam=lam)
             for loss in ("cce", "cosine", "center") for lam in (0.3, 0.6, 0.9)
             if loss != "cce" or lam == 0.3]
    heard = Steps()
    swept = fit_sweep(specs, [heard], data=digits64, prune={"eta": 3, "min_epochs": 2})
    assert heard.steps[:3] == [0, 0, 0]
    apart = fit_sweep(specs, data=digits64, prune={"eta": 3, "min_epochs": 2}, options=EngineOptions(lockstep=False))
    assert [r.pruned and r.pruned["rung"] for r in swept] == [r.pruned and r.pruned["rung"] for r in apart]
    assert 0 < sum(r.pruned is None for r in swept) < len(specs)  # some pruned, some kept
    for got, want in zip(swept, apart, strict=True):
        assert len(got.history) == len(want.history)
        if got.pruned is None:
            assert _worst(got, want) <= 1e-10
