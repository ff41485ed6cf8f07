"""Stacked training: every member ends as ``fit`` would have left it alone.

The equivalence is checked in float64, where it holds on any CPU: stacked and single
matrix products round differently (and differently again on another CPU's kernels),
and ~300 float32 Adam steps amplify a one-ulp difference to ~1e-3 (seen with MKL's
AVX2 code path, as on AMD machines). In float64 the members agree with their solo runs
to ~1e-16 after those steps, so the tolerance below is tight enough to catch a member
whose gradient is off by a factor of 1.001, which Adam's normalisation nearly hides
(see ``test_a_wrongly_scaled_member_gradient_is_caught``). float32 is compared only
over a few steps, where rounding cannot grow.
"""

import dataclasses

import pytest
import torch

import corel.train.stacked
from corel.data import Dataset, load_dataset
from corel.spec import ExperimentSpec
from corel.train import (
    Callback,
    GroupCallback,
    StackedRun,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    fit,
    fit_group,
    group_key,
    group_specs,
    make_optimizer,
    model_from_checkpoint,
    run_epoch,
    start_run,
    train_pass,
)
from tests.corel.losses.test_peers import MEMBERS

# make test runs the tests marked KERNELS once more on other kernels (torch's non-vectorised
# ones, MKL's reproducible path): those in float32, whose bounds are a few ulps, and the one
# that measures how rounding grows. The float64 equivalences (a member against its solo run,
# both computed here, 1e-16 apart against a tolerance of 1e-9 or 1e-10) hold on any kernels,
# as the module's docstring says: they run once, on this CPU's own.
KERNELS = pytest.mark.kernels

# float64 after ~300 Adam steps: measured differences are ~1e-16 (Intel AVX-512 and
# MKL's AVX2 path alike); a gradient off by 0.1% moves a member by ~1e-6.
TOL = {"rtol": 1e-9, "atol": 1e-9}
EPOCHS = 4
# digits: 1,257 training images, so 79 steps an epoch at batch 16, 316 in all.
BASE = {"dataset": "digits", "epochs": EPOCHS, "batch_size": 16, "lr": 1e-3}
SWEEPS = {
    # lam >= 0.5 only: below it Gaussian-COREL's training is chaotic, and any two
    # computations that round differently part ways (test_gaussian_corel_below_half_...).
    "gaussian": [{"lam": lam} for lam in (0.6, 0.75, 0.9)],
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


@pytest.fixture(scope="module")
def digits64(digits):
    return digits.astype(torch.float64)


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


class StopAfterSteps(Callback, GroupCallback):
    """Stops a solo run or a group after ``steps`` optimizer steps."""

    def __init__(self, steps):
        self.steps, self.taken = steps, 0

    def on_batch_end(self, step):
        self.taken += 1
        return self.taken == self.steps


_cache: dict = {}


def solo(spec, data):
    """fit(spec) and its last checkpoint (fit loads the best weights into run.model)."""
    key = (spec, data.dtype)
    if key not in _cache:
        keep = Keep()
        _cache[key] = (fit(spec, [keep], data=data), keep.saved)
    return _cache[key]


def assert_same_checkpoint(got, want, exact=False, tol=TOL):
    """Same format and contents; weights and Adam moments within ``tol`` (or bit for bit)."""
    close = (
        (lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0))
        if exact
        else (lambda a, b: torch.testing.assert_close(a, b, **tol))
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
    assert_same_history(got["history"], want["history"], exact)
    best_got, best_want = dict(got["best"]), dict(want["best"])
    close(best_got.pop("model"), best_want.pop("model"))
    assert best_got == best_want


def assert_same_history(got, want, exact=False):
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
        loss_a, loss_b = a.pop("train_loss"), b.pop("train_loss")
        assert loss_a == (loss_b if exact else pytest.approx(loss_b, rel=TOL["rtol"]))
        assert a == b


def max_difference(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("name", list(SWEEPS))
def test_members_end_as_if_trained_alone(digits64, name):
    specs = sweep(name)
    keep = KeepGroup()
    results = fit_group(specs, [keep], data=digits64)
    assert [r.spec for r in results] == specs
    assert [len(m) for m in keep.seen] == [len(specs)] * EPOCHS
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        alone, last = solo(spec, digits64)
        assert last["model"]["head.W"].dtype == torch.float64
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
    # Not one model trained M times: members whose loss parameters differ end far apart
    # (a member given another's lam/alpha/gamma would fail here); CCE ignores lam, so its
    # members end together.
    states = [r.run.model.state_dict() for r in results]
    for i in range(len(states)):
        for j in range(i):
            gap = max_difference(states[i], states[j])
            if name == "cce":
                assert gap <= TOL["atol"], (i, j, gap)
            else:
                assert gap > 1e-3, (i, j, gap)


# Each sweep's members given seeds: members of one seed beside members of another (each
# member then gathers its seed's batch), or one member per seed in order (cce, learned-gamma:
# the streams' batches are the members' own).
SEEDED = {"gaussian": [1, 0, 1], "center": [2, 0, 2], "cosine": [0, 1, 1], "cce": [0, 1],
          "learned-gamma": [3, 0]}


def seeded(name):
    return [s.model_copy(update={"seed": seed}) for s, seed in zip(sweep(name), SEEDED[name], strict=True)]


@pytest.mark.parametrize("name", list(SEEDED))
def test_members_of_several_seeds_end_as_if_trained_alone(digits64, name):
    """A group may mix seeds: each member starts from its seed's weights and trains on its
    seed's batch order, so it ends as its solo run (the checkpoint's data order included)."""
    specs = seeded(name)
    keep = KeepGroup()
    results = fit_group(specs, [keep], data=digits64)
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        alone, last = solo(spec, digits64)
        assert_same_checkpoint(keep.saved[i], last)
        assert_same_history(result.history, alone.history)
        assert (result.best_epoch, result.test_accuracy) == (alone.best_epoch, alone.test_accuracy)
        torch.testing.assert_close(result.model.state_dict(), alone.model.state_dict(), **TOL)


# pytorch-metric-learning's losses stack as COREL's do (issue 70): three members a loss, each
# with its own options (the numbers a stack holds per member, as lambda), two of them of seed
# 0 (they share their batches) and one of seed 1 (its own batches). The triplet miner is a
# name the members share: one group per miner.
PEER_MEMBERS = {
    **MEMBERS,  # the members tests/corel/losses/test_peers.py runs under vmap, one step
    "triplet-easy": [{"margin": m, "miner": "easy"} for m in (0.05, 0.3, 0.15)],
}
PEER_SEEDS = (0, 1, 0)
PEER_EPOCHS = 2  # 158 steps at batch 16
PEER_TOL = {"rtol": 1e-10, "atol": 1e-10}


def peer_group(name):
    loss = name.split("-")[0]
    return [ExperimentSpec(**{**BASE, "epochs": PEER_EPOCHS, "loss": loss, "seed": seed, **options})
            for options, seed in zip(PEER_MEMBERS[name], PEER_SEEDS, strict=True)]


def test_every_peer_loss_and_miner_is_stacked_here():
    from corel.loss_catalog import MINERS, PEER_LOSSES

    assert {name.split("-")[0] for name in PEER_MEMBERS} == set(PEER_LOSSES)
    assert {name.split("-")[1] for name in PEER_MEMBERS if "-" in name} == set(MINERS)


@pytest.mark.parametrize("name", sorted(PEER_MEMBERS))
def test_peer_loss_members_end_as_if_trained_alone(digits64, name):
    """A member's weights, Adam moments, class means (pair-based losses predict with them, set
    after every epoch), losses and figures in a stack are those of the member trained alone,
    in float64, for members that share batches and for one with its own seed's."""
    specs = peer_group(name)
    keep = KeepGroup(epoch=PEER_EPOCHS)
    results = fit_group(specs, [keep], data=digits64)
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        want = Keep(epoch=PEER_EPOCHS)
        alone = fit(spec, [want], data=digits64)
        assert_same_checkpoint(keep.saved[i], want.saved, tol=PEER_TOL)
        assert_same_history(result.history, alone.history)
        assert (result.best_epoch, result.best_val_accuracy, result.test_accuracy) == (
            alone.best_epoch, alone.best_val_accuracy, alone.test_accuracy)
        torch.testing.assert_close(result.model.state_dict(), alone.model.state_dict(), **PEER_TOL)
        assert result.model.head.extra_repr() == alone.model.head.extra_repr()
        assert result.model.head.W.abs().sum() > 0  # class vectors trained, or class means set
    # Each member trained with its own options: the two of seed 0 end far apart. Not the
    # hard miner's: it keeps the triplets with an <= ap whatever the margin (> 0), which then
    # only adds to the loss's value; nor the easy miner's, which keeps none (no gradient).
    first, third = results[0], results[2]
    gap = max_difference(first.run.model.state_dict(), third.run.model.state_dict())
    losses = [[m.train_loss for m in r.history] for r in (first, third)]
    if name == "triplet-easy":
        assert gap == 0.0 and losses == [[0.0] * PEER_EPOCHS] * 2
    elif name == "triplet-hard":
        assert gap == 0.0
        margins = [s.margin for s in (specs[0], specs[2])]
        # by the margins' difference on each batch that keeps a triplet, 0 on the others
        step = abs(margins[1] - margins[0])
        assert all(0.5 * step < abs(b - a) <= step + 1e-12 for a, b in zip(*losses, strict=True)), losses
    else:
        assert gap > 1e-3, gap


# The paper's text models have dropout 0.5: they stack too (issue 70), each member drawing its
# masks from its own stream, as its solo run does. AG News's first 96 training rows over GloVe
# (three batches an epoch), 128 rows of each evaluation split, and the CNN's texts cut to their
# first 24 words: its seven float64 runs over 200 rows and the whole splits at 64 words took
# 102 s on torch's default kernels (the kernel pass, AVX2 EPYC), most of it the convolutions'
# backward passes.
TEXT = {"dataset": "ag-news", "train_subset": 96, "epochs": 2, "batch_size": 32, "lr": 1e-3, "loss": "cosine"}
TEXT_MEMBERS = ((0.6, 0), (0.9, 1), (0.8, 0))  # (lam, seed): two of seed 0, one of seed 1
TEXT_EVAL_ROWS, TEXT_WORDS = 128, 24


def _smaller(data: Dataset) -> Dataset:
    """The first TEXT_EVAL_ROWS rows of the evaluation splits; a sequence's first TEXT_WORDS."""
    cut = {f"{x}_{s}": getattr(data, f"{x}_{s}")[:TEXT_EVAL_ROWS] for s in ("val", "test") for x in ("x", "y")}
    rows = None if data.rows is None else {**data.rows, **{s: data.rows[s][:TEXT_EVAL_ROWS] for s in ("val", "test")}}
    data = dataclasses.replace(data, **cut, rows=rows)
    if len(data.input_shape) == 1:  # the FFNN's mean word vectors
        return data
    words = {f"x_{s}": getattr(data, f"x_{s}")[:, :TEXT_WORDS] for s in ("train", "val", "test")}
    return dataclasses.replace(data, **words, input_shape=(TEXT_WORDS, *data.input_shape[1:]),
                               preprocessing={**data.preprocessing, "max_len": TEXT_WORDS})


@pytest.fixture(scope="module")
def news64(shared_datasets):
    csv = shared_datasets / "ag_news" / "test.csv"
    return {model: _smaller(load_dataset(ExperimentSpec(**TEXT, model=model, dataset_path=str(csv))).astype(torch.float64))
            for model in ("ffnn", "cnn")}


def text_specs(model):
    """The members (the data is given to fit: its path only names it)."""
    return [ExperimentSpec(**TEXT, model=model, dataset_path="news.csv", lam=lam, seed=seed)
            for lam, seed in TEXT_MEMBERS]


@pytest.mark.parametrize("model", ["ffnn", "cnn"])
def test_text_members_with_dropout_end_as_if_trained_alone(news64, model):
    """Each member of a text stack draws its dropout masks from its own stream: its weights,
    Adam moments, losses, figures and dropout stream equal its solo run's (float64); its
    checkpoint at epoch 1 resumes alone to the same end, the stream's state included."""
    data = news64[model]
    specs = text_specs(model)
    keep, first = KeepGroup(epoch=2), KeepGroup(epoch=1)
    results = fit_group(specs, [keep, first], data=data, chance_epochs=0)
    for i, (spec, result) in enumerate(zip(specs, results, strict=True)):
        want = Keep(epoch=2)
        alone = fit(spec, [want], data=data, chance_epochs=0)
        assert_same_checkpoint(keep.saved[i], want.saved, tol=PEER_TOL)
        assert torch.equal(keep.saved[i]["rng"]["dropout"], want.saved["rng"]["dropout"])
        assert_same_history(result.history, alone.history)
        assert (result.best_epoch, result.test_accuracy) == (alone.best_epoch, alone.test_accuracy)
        torch.rand(100)  # something else draws from the global generator before the resume
        resumed = Keep(epoch=2)
        fit(spec, [resumed], data=data, chance_epochs=0, checkpoint=first.saved[i])
        assert_same_checkpoint(resumed.saved, want.saved, tol=PEER_TOL)
    # The two members of seed 0 drew the same masks but trained their own lambdas.
    assert max_difference(results[0].run.model.state_dict(), results[2].run.model.state_dict()) > 1e-3


@pytest.fixture(params=["member by member", "vmap"])
def encoder_path(request, monkeypatch):
    """Other encoders than the FFNN run member by member on a CPU and under vmap on a GPU:
    both, here on the CPU."""
    if request.param == "vmap":
        monkeypatch.setattr(corel.train.stacked, "ENCODER_LOOP_DEVICES", ())
    return request.param


def test_cnn_members_of_several_seeds_match_solo_runs(digits64, encoder_path):
    """The generic encoder on each member's own batches."""
    specs = [ExperimentSpec(dataset="digits", model="cnn", loss="gaussian", lam=lam, seed=seed,
                            epochs=2, lr=1e-3) for lam, seed in ((0.8, 1), (0.6, 0), (0.7, 1))]
    keep = KeepGroup(epoch=2)
    fit_group(specs, [keep], data=digits64)
    for spec, ckpt in zip(specs, keep.saved, strict=True):
        want = Keep(epoch=2)
        fit(spec, [want], data=digits64)
        assert_same_checkpoint(ckpt, want.saved)


@pytest.mark.parametrize("scale", [0.5, 1.001])
def test_a_wrongly_scaled_member_gradient_is_caught(digits64, monkeypatch, scale):
    """The equivalence test above can fail: scale member 1's gradient before each Adam step.

    Adam divides by the gradient's running RMS, so a constant factor changes only the
    epsilon's share: after 316 steps a factor of 1.001 moves the weights by ~1e-6, hidden
    in float32 noise on another CPU (~1e-3) but 1,000 times TOL in float64.
    """
    adam = corel.train.stacked.adam

    def skewed_adam(params, lr):
        optimizer = adam(params, lr)
        step = optimizer.step

        def skewed_step(closure=None):
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad[1] *= scale
            return step(closure)

        optimizer.step = skewed_step
        return optimizer

    monkeypatch.setattr(corel.train.stacked, "adam", skewed_adam)
    specs = sweep("gaussian")
    keep = KeepGroup()
    fit_group(specs, [keep], data=digits64)
    for i in (0, 2):  # the others are untouched
        assert_same_checkpoint(keep.saved[i], solo(specs[i], digits64)[1])
    with pytest.raises(AssertionError, match="not close"):
        assert_same_checkpoint(keep.saved[1], solo(specs[1], digits64)[1])


@KERNELS
@pytest.mark.parametrize("lam, grows", [(0.3, True), (0.9, False)])
def test_gaussian_corel_below_half_amplifies_rounding(digits64, lam, grows):
    """Why the Gaussian sweep above keeps lam >= 0.5: a property of the loss, not of stacking.

    Two solo float64 runs whose initial first-layer weights differ by one ulp: at lam 0.3
    repulsion outweighs attraction and the gap grows by ~1e13 in four epochs (seen: ~1e-3),
    so a stacked member, whose products round differently on some CPUs, ends as far from
    its solo run; at lam 0.9 the gap stays at rounding level.
    """
    spec = ExperimentSpec(**{**BASE, "loss": "gaussian", "lam": lam})

    def last_weights(nudge):
        run = start_run(spec, data=digits64)
        if nudge:
            with torch.no_grad():
                w = run.model.encoder.net[1].weight
                w.copy_(torch.nextafter(w, torch.full_like(w, 2.0)))
        while run.epoch < spec.epochs:
            run_epoch(run)
        return run.model.state_dict()

    gap = max_difference(last_weights(nudge=True), last_weights(nudge=False))
    if grows:
        assert gap > 1e-6, gap
    else:
        assert gap < 1e-11, gap


STEPS = 3
EPS32 = torch.finfo(torch.float32).eps


@KERNELS
@pytest.mark.parametrize("name", list(SWEEPS))
def test_float32_members_match_solo_runs_over_a_few_steps(digits, name):
    """The default precision, over a horizon where rounding cannot grow.

    One Adam step moves a weight by about lr, and one that was computed from a
    gradient a few ulps off lands a few ulps of the weight away; over STEPS steps the
    differences add up to at most a few ulps per step. Measured: <= 2.2e-8 on weights
    of magnitude <= ~0.5 with MKL's AVX-512 and AVX2 paths; allowed: 8 ulps per step.
    """
    specs = sweep(name)
    group = StackedRun.start(specs, digits)
    assert group.train_pass([StopAfterSteps(STEPS)]) is None
    for i, spec in enumerate(specs):
        run = start_run(spec, data=digits)
        assert train_pass(run, [StopAfterSteps(STEPS)]) is None
        got, want = group.member_state(i), run.model.state_dict()
        assert got.keys() == want.keys() and want["head.W"].dtype == torch.float32
        for key, value in want.items():
            assert got[key].dtype == value.dtype
            scale = max(float(value.abs().max()), 1.0)
            torch.testing.assert_close(got[key], value, rtol=0, atol=8 * STEPS * EPS32 * scale)


@KERNELS
def test_the_ffnn_fast_path_is_the_vmapped_encoder(digits):
    group = StackedRun.start(sweep("gaussian"), digits)
    x = digits.x_val[:50]
    fast = group.encode(x)
    generic = group._vmapped_encoder(group.params, group.buffers, x)
    assert fast.shape == (3, 50, 128)
    torch.testing.assert_close(fast, generic)
    for i, member in enumerate(group.members):
        torch.testing.assert_close(fast[i], member(x))


def test_the_generic_path_matches_solo_runs_cnn(digits64, encoder_path):
    specs = [
        ExperimentSpec(dataset="digits", model="cnn", loss="gaussian", lam=lam, epochs=2, lr=1e-3)
        for lam in (0.4, 0.8)
    ]
    keep = KeepGroup(epoch=2)
    fit_group(specs, [keep], data=digits64)
    for spec, ckpt in zip(specs, keep.saved, strict=True):
        want = Keep(epoch=2)
        fit(spec, [want], data=digits64, chance_epochs=0)  # lam 0.4 is at chance: no matter
        assert_same_checkpoint(ckpt, want.saved)


@pytest.mark.parametrize("name", ["gaussian", "center"])
def test_a_member_checkpoint_resumes_alone(digits64, name):
    specs = sweep(name)
    stop = KeepGroup(epoch=2, stop=True)
    results = fit_group(specs, [stop], data=digits64)
    assert all(r.stopped for r in results) and all(len(r.history) == 2 for r in results)
    for i, spec in enumerate(specs):
        # The checkpoint has the solo format: a solo run stopped at epoch 2 writes the same.
        solo_stop = Keep(epoch=2, stop=True)
        fit(spec, [solo_stop], data=digits64)
        assert_same_checkpoint(stop.saved[i], solo_stop.saved)
        assert (
            make_optimizer(results[i].model, spec.lr).load_state_dict(stop.saved[i]["optimizer"])
            is None
        )
        torch.rand(100)  # something else uses the global RNG before the resume
        keep = Keep()
        resumed = fit(spec, [keep], data=digits64, checkpoint=stop.saved[i])
        alone, last = solo(spec, digits64)
        assert_same_checkpoint(keep.saved, last)
        assert (resumed.best_epoch, resumed.test_accuracy) == (
            alone.best_epoch,
            alone.test_accuracy,
        )


@KERNELS
@pytest.mark.parametrize("seeds", ["one seed", "several seeds"])
def test_a_group_restarts_from_member_checkpoints(digits, seeds):
    specs = sweep("center") if seeds == "one seed" else seeded("center")
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
    if seeds == "several seeds":  # each seed's data order was restored; a member given
        # another seed's (seed 0's, to a seed-2 member) is refused
        forged = {**first.saved[2], "rng": {**first.saved[2]["rng"], "shuffle": first.saved[1]["rng"]["shuffle"]}}
        with pytest.raises(ValueError, match="checkpoint 2 has another data order than checkpoint 0, of "
                                             "the same seed 2"):
            StackedRun.start(specs, digits, checkpoints=[*first.saved[:2], forged])


@KERNELS
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


@KERNELS
def test_best_checkpoint_serves_the_best_member_weights(digits):
    specs = sweep("cosine", epochs=2)
    results = fit_group(specs, data=digits)
    for result in results:
        ckpt = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
        assert "optimizer" not in ckpt and ckpt["epoch"] == result.best_epoch
        spec, model = model_from_checkpoint(ckpt)
        assert spec == result.spec
        torch.testing.assert_close(model.state_dict(), result.model.state_dict(), rtol=0, atol=0)


@KERNELS
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


def test_group_key_puts_only_loss_parameter_and_seed_sweeps_together():
    base = ExperimentSpec(dataset="fashion-mnist", loss="gaussian", lam=0.5, seed=3)
    same = [
        base.model_copy(update={"lam": 0.9}),
        base.model_copy(update={"gamma": 2.0, "alpha": 0.5}),
        base.model_copy(update={"seed": 4, "lam": 0.7}),
        base.model_copy(update={"dataset_path": "/elsewhere/fashion"}),  # only a location
    ]
    assert all(group_key(s) == group_key(base) for s in same)
    for update in (
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
    # A peer loss's numeric options are its members' own; the triplet miner is the group's.
    arc = ExperimentSpec(dataset="digits", loss="arcface")
    assert group_key(arc.model_copy(update={"margin": 10.0, "scale": 8.0, "seed": 2})) == group_key(arc)
    trip = ExperimentSpec(dataset="digits", loss="triplet", miner="hard")
    assert group_key(trip.model_copy(update={"margin": 0.3})) == group_key(trip)
    assert group_key(trip.model_copy(update={"miner": "semihard"})) != group_key(trip)


def test_fine_tuned_specs_are_not_vectorized_and_npz_paths_name_the_data():
    text = ExperimentSpec(dataset="ag-news", dataset_path="news.csv", loss="cosine")
    assert group_key(text) == group_key(text.model_copy(update={"lam": 0.9, "seed": 3}))  # dropout stacks
    tuned = ExperimentSpec(dataset="text", dataset_path="news.npz", encoder="minilm", encoder_mode="finetune")
    assert group_key(tuned) is None
    a = ExperimentSpec(dataset="npz", dataset_path="a.npz")
    assert group_key(a) == group_key(a.model_copy(update={"lam": 0.9}))
    assert group_key(a) != group_key(a.model_copy(update={"dataset_path": "b.npz"}))
    with pytest.raises(ValueError, match=r"cannot be trained stacked \(its encoder is fine-tuned\); train them alone"):
        StackedRun.start([tuned, tuned], data=None)  # type: ignore[arg-type]


def test_group_specs_keeps_order_and_leaves_the_rest_alone():
    g = ExperimentSpec(dataset="digits", loss="gaussian")
    # a fine-tuned encoder trains alone
    text = ExperimentSpec(dataset="text", dataset_path="news.npz", encoder="minilm", encoder_mode="finetune")
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
    # A group's members of one seed come together, seeds in order of first appearance.
    assert group_specs(specs) == [[0, 3, 1, 6], [2], [4, 7], [5]]
    assert group_specs([]) == []


def test_group_specs_splits_a_group_past_its_limit_keeping_seeds_whole():
    g = ExperimentSpec(dataset="digits", loss="gaussian")
    specs = [g.model_copy(update={"lam": lam, "seed": seed})
             for lam in (0.2, 0.4, 0.6) for seed in (5, 1, 7)]
    assert group_specs(specs) == [[0, 3, 6, 1, 4, 7, 2, 5, 8]]
    assert group_specs(specs, max_members=3) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    assert group_specs(specs, max_members=4) == [[0, 3, 6, 1], [4, 7, 2, 5], [8]]
    with pytest.raises(ValueError, match="at least 1"):
        group_specs(specs, max_members=0)


@KERNELS
def test_fit_group_refuses_specs_that_cannot_be_stacked(digits):
    g = ExperimentSpec(dataset="digits", epochs=1)
    with pytest.raises(ValueError, match="differs from spec 0 in batch_size; only lam, gamma, "
                                         "alpha, margin, scale, scale_neg, temperature and seed may differ"):
        fit_group([g, g.model_copy(update={"batch_size": 64})], data=digits)
    with pytest.raises(ValueError, match="at least one"):
        fit_group([], data=digits)


@KERNELS
def test_a_group_refuses_labels_outside_the_classes(digits):
    bad = Dataset(**{**vars(digits), "y_train": digits.y_train.clone()})
    bad.y_train[3] = -1
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.9"):
        fit_group(sweep("gaussian"), data=bad)


@KERNELS
def test_fit_group_judges_each_member_as_fit_does(digits):
    """The one "not learning" judgement (corel.train.guards) runs inside fit_group: the member at
    lam 0.3 (Gaussian-COREL without a minimum) fails with fit's verdict, the other goes
    on to the end; with chance_epochs=0 nobody is judged."""
    from corel.train import NotLearningError

    base = {"dataset": "digits", "loss": "gaussian", "epochs": 10, "lr": 3e-3, "batch_size": 64}
    specs = [ExperimentSpec(**base, lam=lam) for lam in (0.3, 0.85)]
    seen: list[dict[int, str]] = []

    class Watch(GroupCallback):
        def on_epoch_end(self, metrics, group):
            seen.append(dict(group.failed))

    results = fit_group(specs, [Watch()], data=digits)
    assert results[0].failed is not None and "not learning" in results[0].failed
    assert results[1].failed is None and len(results[1].history) == 10
    assert results[1].test_accuracy > 0.9
    # The callbacks saw the verdict in the epoch it was given (before they recorded it).
    first = next(i for i, failed in enumerate(seen) if failed)
    assert seen[first] == {0: results[0].failed}
    with pytest.raises(NotLearningError) as solo:
        fit(specs[0], data=digits)
    assert "lam >= 0.5" in str(solo.value) and "lam >= 0.5" in results[0].failed
    assert all(r.failed is None for r in fit_group(specs, data=digits, chance_epochs=0))
