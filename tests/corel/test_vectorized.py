"""Stacked training: every member ends as ``fit`` would have left it alone."""

import pytest
import torch

from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.training import (
    Callback,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    fit,
    make_optimizer,
    model_from_checkpoint,
)
from corel.vectorized import GroupCallback, StackedRun, fit_group, group_key, group_specs

# Stacked and single matrix products may round differently; ~300 Adam steps on digits
# keep the members within float32 rounding of their solo runs.
TOL = {"rtol": 1e-4, "atol": 1e-5}
EPOCHS = 4
# digits: 1,257 training images, so 79 steps an epoch at batch 16, ~300 in all.
BASE = {"dataset": "digits", "epochs": EPOCHS, "batch_size": 16, "lr": 1e-3}
SWEEPS = {
    "gaussian": [{"lam": lam} for lam in (0.3, 0.6, 0.9)],
    "center": [{"lam": 0.3, "alpha": alpha} for alpha in (0.1, 0.5, 0.9)],
    "cosine": [{"lam": lam} for lam in (0.3, 0.6, 0.9)],
    "cce": [{"lam": 0.3}, {"lam": 0.8}],
    "learned-gamma": [
        {"loss": "gaussian", "learn_gamma": True, "gamma": g, "lam": 0.7} for g in (0.2, 1.0)
    ],
}


def sweep(name, **update):
    loss = {"loss": name} if name in ("gaussian", "center", "cosine", "cce") else {}
    return [ExperimentSpec(**{**BASE, **loss, **v, **update}) for v in SWEEPS[name]]


@pytest.fixture(scope="module")
def digits():
    return load_dataset(ExperimentSpec(dataset="digits"))


class Keep(Callback):
    """Keeps the solo run's checkpoint of one epoch (by default the last); can stop there."""

    def __init__(self, epoch=EPOCHS, stop=False):
        self.epoch, self.stop, self.saved = epoch, stop, None

    def on_epoch_end(self, metrics, run):
        if metrics.epoch == self.epoch:
            self.saved = checkpoint_from_bytes(checkpoint_to_bytes(run.checkpoint()))
            return self.stop
        return None


class KeepGroup(GroupCallback):
    """The group's counterpart: every member's checkpoint of one epoch, as the worker saves them."""

    def __init__(self, epoch=EPOCHS, stop=False):
        self.epoch, self.stop, self.saved, self.seen = epoch, stop, None, []

    def on_epoch_end(self, metrics, group):
        self.seen.append(metrics)
        if metrics[0].epoch == self.epoch:
            self.saved = [
                checkpoint_from_bytes(checkpoint_to_bytes(c)) for c in group.checkpoints()
            ]
            return self.stop
        return None


_cache: dict = {}


def solo(spec, data):
    """fit(spec) and its last checkpoint (fit loads the best weights into run.model)."""
    if spec not in _cache:
        keep = Keep()
        _cache[spec] = (fit(spec, [keep], data=data), keep.saved)
    return _cache[spec]


def assert_same_checkpoint(got, want, exact=False):
    """Same format and contents; weights and Adam moments within TOL (or bit for bit)."""
    close = (
        (lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0))
        if exact
        else (lambda a, b: torch.testing.assert_close(a, b, **TOL))
    )
    assert got.keys() == want.keys()
    for key in ("format", "spec", "epoch", "input_shape", "num_classes", "class_names"):
        assert got[key] == want[key], key
    assert got["preprocessing"] == want["preprocessing"]
    assert list(got["model"]) == list(want["model"])
    close(got["model"], want["model"])
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert got["optimizer"]["state"].keys() == want["optimizer"]["state"].keys()
    close(got["optimizer"]["state"], want["optimizer"]["state"])
    assert torch.equal(got["rng"]["shuffle"], want["rng"]["shuffle"])
    assert_same_history(got["history"], want["history"])
    best_got, best_want = dict(got["best"]), dict(want["best"])
    close(best_got.pop("model"), best_want.pop("model"))
    assert best_got == best_want


def assert_same_history(got, want):
    def as_dict(m):
        return m if isinstance(m, dict) else m.to_dict()

    got, want = [as_dict(m) for m in got], [as_dict(m) for m in want]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        # The epoch's wall time differs; the train loss is a batch mean, which the
        # batched cross-entropy sums in another order (CCE, Center loss).
        a, b = dict(a), dict(b)
        assert a.pop("seconds") > 0
        b.pop("seconds")
        assert a.pop("train_loss") == pytest.approx(b.pop("train_loss"), rel=1e-5)
        assert a == b


@pytest.mark.parametrize("name", list(SWEEPS))
def test_members_end_as_if_trained_alone(digits, name):
    specs = sweep(name)
    keep = KeepGroup()
    results = fit_group(specs, [keep], data=digits)
    assert [r.spec for r in results] == specs
    assert [len(m) for m in keep.seen] == [len(specs)] * EPOCHS
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        alone, last = solo(spec, digits)
        assert_same_checkpoint(keep.saved[i], last)
        assert not result.stopped
        assert_same_history(result.history, alone.history)
        assert (result.best_epoch, result.best_val_accuracy, result.test_accuracy) == (
            alone.best_epoch,
            alone.best_val_accuracy,
            alone.test_accuracy,
        )
        # Like fit, the result's model holds the best-validation weights.
        torch.testing.assert_close(result.model.state_dict(), alone.model.state_dict(), **TOL)
        assert result.model.head.extra_repr() == alone.model.head.extra_repr()
    # The members really differ (but CCE ignores lam): not one model trained M times.
    w = [r.run.model.head.W for r in results]
    assert torch.equal(w[0], w[-1]) == (name == "cce")


def test_gaussian_members_are_bit_identical_to_solo_runs_here(digits):
    """Not a promise in general (other GEMM kernels round differently), but true on digits."""
    specs = sweep("gaussian")
    keep = KeepGroup()
    fit_group(specs, [keep], data=digits)
    for spec, ckpt in zip(specs, keep.saved, strict=True):
        torch.testing.assert_close(ckpt["model"], solo(spec, digits)[1]["model"], rtol=0, atol=0)


def test_the_ffnn_fast_path_is_the_vmapped_encoder(digits):
    group = StackedRun.start(sweep("gaussian"), digits)
    x = digits.x_val[:50]
    fast = group.encode(x)
    generic = group._vmapped_encoder(group.params, group.buffers, x)
    assert fast.shape == (3, 50, 128)
    torch.testing.assert_close(fast, generic)
    for i, member in enumerate(group.members):
        torch.testing.assert_close(fast[i], member(x))


def test_the_generic_vmap_path_matches_solo_runs_cnn(digits):
    specs = [
        ExperimentSpec(dataset="digits", model="cnn", loss="gaussian", lam=lam, epochs=2, lr=1e-3)
        for lam in (0.4, 0.8)
    ]
    keep = KeepGroup(epoch=2)
    fit_group(specs, [keep], data=digits)
    for spec, ckpt in zip(specs, keep.saved, strict=True):
        want = Keep(epoch=2)
        fit(spec, [want], data=digits)
        assert_same_checkpoint(ckpt, want.saved)


@pytest.mark.parametrize("name", ["gaussian", "center"])
def test_a_member_checkpoint_resumes_alone(digits, name):
    specs = sweep(name)
    stop = KeepGroup(epoch=2, stop=True)
    results = fit_group(specs, [stop], data=digits)
    assert all(r.stopped for r in results) and all(len(r.history) == 2 for r in results)
    for i, spec in enumerate(specs):
        # The checkpoint has the solo format: a solo run stopped at epoch 2 writes the same.
        solo_stop = Keep(epoch=2, stop=True)
        fit(spec, [solo_stop], data=digits)
        assert_same_checkpoint(stop.saved[i], solo_stop.saved)
        assert (
            make_optimizer(results[i].model, spec.lr).load_state_dict(stop.saved[i]["optimizer"])
            is None
        )
        torch.rand(100)  # something else uses the global RNG before the resume
        keep = Keep()
        resumed = fit(spec, [keep], data=digits, checkpoint=stop.saved[i])
        alone, last = solo(spec, digits)
        assert_same_checkpoint(keep.saved, last)
        assert (resumed.best_epoch, resumed.test_accuracy) == (
            alone.best_epoch,
            alone.test_accuracy,
        )


def test_a_group_restarts_from_member_checkpoints(digits):
    specs = sweep("center")
    whole = KeepGroup()
    fit_group(specs, [whole], data=digits)
    first = KeepGroup(epoch=2, stop=True)
    fit_group(specs, [first], data=digits)

    group = StackedRun.start(specs, digits, checkpoints=first.saved)
    assert group.epoch == 2 and [len(h) for h in group.histories] == [2, 2, 2]
    rest = KeepGroup()
    results = fit_group(specs, [rest], data=digits, checkpoints=first.saved)
    assert [m[0].epoch for m in rest.seen] == [3, 4]
    for got, want in zip(rest.saved, whole.saved, strict=True):
        # The same computation as the uninterrupted group, so bit for bit.
        assert_same_checkpoint(got, want, exact=True)
    for result, want in zip(results, whole.saved, strict=True):
        assert result.best_epoch == want["best"]["epoch"]
        assert result.test_accuracy == want["best"]["test_accuracy"]


def test_restart_refuses_checkpoints_it_cannot_continue(digits):
    specs = sweep("gaussian")
    at1, at2 = KeepGroup(epoch=1, stop=True), KeepGroup(epoch=2, stop=True)
    fit_group(specs, [at1], data=digits)
    fit_group(specs, [at2], data=digits)
    with pytest.raises(ValueError, match="same epoch"):
        StackedRun.start(specs, digits, checkpoints=[at1.saved[0], at2.saved[1], at2.saved[2]])
    with pytest.raises(ValueError, match="different spec"):
        StackedRun.start(specs, digits, checkpoints=at1.saved[::-1])
    with pytest.raises(ValueError, match="one per member"):
        StackedRun.start(specs, digits, checkpoints=at1.saved[:2])


def test_best_checkpoint_serves_the_best_member_weights(digits):
    specs = sweep("cosine", epochs=2)
    results = fit_group(specs, data=digits)
    for result in results:
        ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
        assert "optimizer" not in ckpt and ckpt["epoch"] == result.best_epoch
        spec, model = model_from_checkpoint(ckpt)
        assert spec == result.spec
        torch.testing.assert_close(model.state_dict(), result.model.state_dict(), rtol=0, atol=0)


def test_callbacks_stop_the_group_between_batches(digits):
    class Cancel(GroupCallback):
        def __init__(self):
            self.steps = 0

        def on_batch_end(self, step):
            self.steps += 1
            return self.steps == 3

    cancel = Cancel()
    results = fit_group(sweep("gaussian"), [cancel], data=digits)
    assert cancel.steps == 3
    assert all(r.stopped and r.history == [] and r.best_epoch == 0 for r in results)

    group = StackedRun.start(sweep("gaussian"), digits)
    assert group.run_epoch([Cancel()]) is None and group.epoch == 0


def test_group_key_puts_only_loss_parameter_sweeps_together():
    base = ExperimentSpec(dataset="fashion-mnist", loss="gaussian", lam=0.5, seed=3)
    same = [
        base.model_copy(update={"lam": 0.9}),
        base.model_copy(update={"gamma": 2.0, "alpha": 0.5}),
        base.model_copy(update={"dataset_path": "/elsewhere/fashion"}),  # only a location
    ]
    assert all(group_key(s) == group_key(base) for s in same)
    for update in (
        {"seed": 4},
        {"batch_size": 64},
        {"loss": "cosine"},
        {"model": "cnn"},
        {"hidden": 64},
        {"lr": 1e-3},
        {"epochs": 3},
        {"train_subset": 100},
        {"learn_gamma": True},
    ):
        assert group_key(base.model_copy(update=update)) != group_key(base), update
    hash(group_key(base))


def test_text_specs_are_not_vectorized_and_npz_paths_name_the_data():
    text = ExperimentSpec(dataset="ag-news", dataset_path="news.csv", loss="cosine")
    assert group_key(text) is None
    a = ExperimentSpec(dataset="npz", dataset_path="a.npz")
    assert group_key(a) == group_key(a.model_copy(update={"lam": 0.9}))
    assert group_key(a) != group_key(a.model_copy(update={"dataset_path": "b.npz"}))
    with pytest.raises(ValueError, match="alone"):
        StackedRun.start([text, text], data=None)  # type: ignore[arg-type]


def test_group_specs_keeps_order_and_leaves_the_rest_alone():
    g = ExperimentSpec(dataset="digits", loss="gaussian")
    text = ExperimentSpec(dataset="ag-news", dataset_path="news.csv")
    specs = [
        g.model_copy(update={"lam": 0.1}),
        g.model_copy(update={"seed": 1}),
        text,
        g.model_copy(update={"lam": 0.9}),
        g.model_copy(update={"loss": "center", "alpha": 0.5}),
        text,
        g.model_copy(update={"seed": 1, "lam": 0.2}),
        g.model_copy(update={"loss": "center", "alpha": 0.9}),
    ]
    assert group_specs(specs) == [[0, 3], [1, 6], [2], [4, 7], [5]]
    assert group_specs([]) == []


def test_fit_group_refuses_specs_that_cannot_be_stacked(digits):
    g = ExperimentSpec(dataset="digits", epochs=1)
    with pytest.raises(ValueError, match="seed"):
        fit_group([g, g.model_copy(update={"seed": 1})], data=digits)
    with pytest.raises(ValueError, match="at least one"):
        fit_group([], data=digits)
