"""Successive halving inside a stacked group (corel.train.pruning, fit_group(prune=...)):
pruned members leave the stack, and a survivor ends bit for bit (float64) as the same
member of the unpruned stack ends; rungs, Pareto fronts, seeds judged together, and the
ValueErrors of bad input."""

from __future__ import annotations

import pytest
import torch

from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.train import GroupCallback, Prune, fit_group, fit_sweep
from corel.train.pruning import configuration, keep, pareto_fronts

# Not marked `kernels` (make test's second run on other kernels): every figure here is
# float64, and each assertion compares two computations of this process (a pruned stack and
# the unpruned one, a resumed group and the whole), 1e-16 apart on any kernels, or checks
# arguments; they run once, on this CPU's own kernels (tests/corel/test_vectorized.py).

BASE = {"dataset": "digits", "epochs": 6, "batch_size": 32, "lr": 1e-3, "loss": "cosine"}
LAMS = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)


@pytest.fixture(scope="module")
def digits64():
    return load_dataset(ExperimentSpec(dataset="digits")).astype(torch.float64)


class Sizes(GroupCallback):
    """The group's size at every epoch, and what on_prune heard."""

    def __init__(self):
        self.sizes, self.pruned = [], []

    def on_epoch_end(self, metrics, group):
        self.sizes.append(group.size)

    def on_prune(self, group, kept, why, rung):
        self.pruned.append((rung, list(kept), sorted(why)))


def test_survivors_end_bit_for_bit_as_in_the_unpruned_stack(digits64):
    specs = [ExperimentSpec(**BASE, lam=lam) for lam in LAMS]
    whole = fit_group(specs, data=digits64)
    seen = Sizes()
    pruned = fit_group(specs, [seen], data=digits64,
                       prune={"metric": "val_accuracy", "eta": 3, "min_epochs": 2})
    # Rungs at epochs 2 and 6 (2 x 3): only 2 is below the 6 epochs. 6 members keep 2.
    assert seen.sizes == [6, 6, 2, 2, 2, 2], seen.sizes
    assert [p[0] for p in seen.pruned] == [2] and len(seen.pruned[0][1]) == 2
    survivors = [i for i, r in enumerate(pruned) if r.pruned is None]
    assert len(survivors) == 2
    # The best two by validation accuracy at epoch 2 stayed.
    at_rung = [r.history[1].val_accuracy for r in whole]
    assert sorted(survivors, key=lambda i: -at_rung[i]) == sorted(range(6), key=lambda i: (-at_rung[i], i))[:2]
    for i in survivors:
        mine, theirs = pruned[i], whole[i]
        assert [m.to_dict() | {"seconds": 0} for m in mine.history] == \
               [m.to_dict() | {"seconds": 0} for m in theirs.history]
        assert (mine.best_epoch, mine.best_val_accuracy, mine.test_accuracy) == (
            theirs.best_epoch, theirs.best_val_accuracy, theirs.test_accuracy)
        a, b = mine.model.state_dict(), theirs.model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), i  # bit for bit
    for i in set(range(6)) - set(survivors):
        r = pruned[i]
        assert r.pruned["rung"] == 2 and "1/3" in r.pruned["reason"], r.pruned
        assert len(r.history) == 2 and not r.stopped
        # Its history is the unpruned member's first two epochs; its best checkpoint serves.
        assert [m.val_accuracy for m in r.history] == [m.val_accuracy for m in whole[i].history[:2]]
        assert r.best_epoch in (1, 2)


class StopAt(GroupCallback):
    """Every member's checkpoint at ``epoch``, the group stopped there: a worker lost after
    the epoch was recorded and before its rung was judged."""

    def __init__(self, epoch):
        self.epoch, self.saved = epoch, None

    def on_epoch_end(self, metrics, group):
        if metrics[0].epoch == self.epoch:
            self.saved = [group.member_run(i).checkpoint() for i in range(group.size)]
            return True
        return False


def _same_ends(got, want):
    assert [r.pruned and r.pruned["rung"] for r in got] == [r.pruned and r.pruned["rung"] for r in want]
    for mine, theirs in zip(got, want, strict=True):
        assert [m.val_accuracy for m in mine.history] == [m.val_accuracy for m in theirs.history]
        if mine.pruned is None:
            a, b = mine.model.state_dict(), theirs.model.state_dict()
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_group_resumed_at_a_rung_not_yet_judged_is_judged_there_first(digits64):
    prune = {"metric": "val_accuracy", "eta": 3, "min_epochs": 2}
    specs = [ExperimentSpec(**BASE, lam=lam) for lam in LAMS]
    whole = fit_group(specs, data=digits64, prune=prune)
    stop = StopAt(2)
    fit_group(specs, [stop], data=digits64, prune=prune)
    seen = Sizes()
    resumed = fit_group(specs, [seen], data=digits64, prune=prune, checkpoints=stop.saved)
    assert seen.pruned and seen.pruned[0][0] == 2 and seen.sizes[0] == 2, (seen.pruned, seen.sizes)
    _same_ends(resumed, whole)
    # Judged and recorded before the loss: the survivors' checkpoints resume without a
    # second judgement (which would keep one of the two).
    survivors = [i for i, r in enumerate(whole) if r.pruned is None]
    again = fit_group([specs[i] for i in survivors], data=digits64, prune=prune,
                      checkpoints=[stop.saved[i] for i in survivors], rung_judged=True)
    _same_ends(again, [whole[i] for i in survivors])


def test_seeds_of_one_configuration_are_judged_by_their_mean_and_go_together(digits64):
    specs = [ExperimentSpec(**BASE, lam=lam, seed=seed) for lam in (0.1, 0.5, 0.9) for seed in (0, 1)]
    results = fit_group(specs, data=digits64, prune={"eta": 3, "min_epochs": 1})
    kept = [i for i, r in enumerate(results) if r.pruned is None]
    assert len(kept) == 2 and specs[kept[0]].lam == specs[kept[1]].lam, kept


def test_two_metrics_keep_the_best_pareto_fronts():
    scores = [(0.9, 0.1), (0.1, 0.9), (0.5, 0.5), (0.4, 0.4), (0.2, 0.2), (0.05, 0.05)]
    assert pareto_fronts(scores) == [[0, 1, 2], [3], [4], [5]]
    configs = [str(i) for i in range(6)]
    kept, why = keep(scores, configs, eta=3)  # 2 of 6: from the first front, by the first metric
    assert kept == [0, 2] and sorted(why) == [1, 3, 4, 5]
    kept, _ = keep(scores, configs, eta=2)  # 3 of 6: the whole first front
    assert kept == [0, 1, 2]


def test_rungs_and_configurations():
    assert Prune(("val_accuracy",), 3, 1).rungs(27) == [1, 3, 9]
    assert Prune(("val_accuracy",), 2, 2).rungs(16) == [2, 4, 8]
    a = ExperimentSpec(**BASE, lam=0.5, seed=0)
    assert configuration(a) == configuration(a.model_copy(update={"seed": 3}))
    assert configuration(a) != configuration(a.model_copy(update={"lam": 0.6}))


@pytest.mark.parametrize(("prune", "members", "words"), [
    ({"eta": 1}, 3, "prune.eta is 1; it must be an integer of at least 2"),
    ({"min_epochs": 6}, 3, "prune.min_epochs is 6, but the runs train 6 epochs"),
    ({"metric": "val_loss"}, 3, "prune.metric is 'val_loss'; give one of val_accuracy, val_map_at_r"),
    ({"metric": ["val_accuracy", "val_accuracy"]}, 3, "prune.metric is"),
    ({"speed": 2}, 3, "prune: unknown field(s) speed"),
    ({}, 1, "pruning needs a group of at least 2 members; this one has 1"),
])
def test_bad_pruning_is_a_value_error_that_says_what_is_allowed(prune, members, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Prune.of(prune, 6, members)


def test_map_at_r_prunes_too(digits64):
    specs = [ExperimentSpec(**{**BASE, "epochs": 3}, lam=lam) for lam in (0.2, 0.6, 0.9)]
    results = fit_group(specs, data=digits64,
                        prune={"metric": ["val_accuracy", "val_map_at_r"], "eta": 3, "min_epochs": 1})
    gone = [r for r in results if r.pruned is not None]
    assert len(gone) == 2 and all(set(r.pruned["metrics"]) == {"val_accuracy", "val_map_at_r"} for r in gone)


def _same_run(mine, theirs):
    assert [m.to_dict() | {"seconds": 0} for m in mine.history] == \
           [m.to_dict() | {"seconds": 0} for m in theirs.history]
    assert (mine.best_epoch, mine.best_val_accuracy, mine.test_accuracy) == (
        theirs.best_epoch, theirs.best_val_accuracy, theirs.test_accuracy)
    a, b = mine.model.state_dict(), theirs.model.state_dict()
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("eta", [3, 6])
def test_a_sweep_of_several_groups_prunes_across_them(digits64, eta):
    # Two losses cannot share a stack: two groups, trained in lockstep, judged together.
    losses = ("cosine", "gaussian")
    specs = [ExperimentSpec(**{**BASE, "loss": loss}, lam=lam) for loss in losses for lam in (0.3, 0.6, 0.9)]
    alone = [r for loss in losses for r in fit_group([s for s in specs if s.loss == loss], data=digits64)]
    seen = Sizes()
    swept = fit_sweep(specs, [seen], data=digits64, prune={"eta": eta, "min_epochs": 2})
    at_rung = [r.history[1].val_accuracy for r in alone]
    best = sorted(range(6), key=lambda i: (-at_rung[i], i))[: 6 // eta]
    survivors = [i for i, r in enumerate(swept) if r.pruned is None]
    assert sorted(survivors) == sorted(best), (survivors, at_rung)
    for i in survivors:
        assert _same_run(swept[i], alone[i]), i  # as in its own unpruned group, bit for bit
    for i in set(range(6)) - set(survivors):
        assert swept[i].pruned["rung"] == 2 and f"kept {6 // eta} of 6 configurations" in swept[i].pruned["reason"]
        assert [m.val_accuracy for m in swept[i].history] == [m.val_accuracy for m in alone[i].history[:2]]
    # Each group heard its own epochs: 2 groups x 2 epochs of 3, then only the survivors'.
    assert seen.sizes[:4] == [3, 3, 3, 3]
    left = [sum(1 for i in survivors if specs[i].loss == loss) for loss in losses]
    assert sorted(seen.sizes[4:]) == sorted([n for n in left if n] * 4), (seen.sizes, left)
    if eta == 6:  # one configuration of six is kept: the other loss's group ended at the rung
        assert 0 in left and len(seen.pruned) == 2 and [] in [p[1] for p in seen.pruned]


def test_a_pruned_sweep_needs_one_number_of_epochs(digits64):
    specs = [ExperimentSpec(**BASE, lam=0.3), ExperimentSpec(**{**BASE, "epochs": 4}, lam=0.6)]
    with pytest.raises(ValueError, match=r"must train the same epochs .* these train \[4, 6\]"):
        fit_sweep(specs, data=digits64, prune={})


def test_groups_of_other_losses_load_their_data_once():
    specs = [ExperimentSpec(**{**BASE, "epochs": 1, "loss": loss}, lam=0.5) for loss in ("cosine", "gaussian")]
    first, second = fit_sweep(specs)
    assert first.run.data is second.run.data
