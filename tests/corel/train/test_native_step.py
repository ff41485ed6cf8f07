"""The whole training step as one native call (corel.train.native_step), solo and stacked: bit for bit
the autograd step it replaces, really taken in training, and out of the way wherever the
autograd step must run (hooks, another head, a learned gamma, the optimiser's first step)."""

from __future__ import annotations

import pytest
import torch

from corel import native
from corel.data import Dataset
from corel.models import build_classifier
from corel.spec import ExperimentSpec
from corel.train import adam, solo, steps
from corel.train import native_step as step

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


@pytest.fixture(autouse=True)
def built():
    assert native.module() is not None, (
        "corel.native is not built for this environment: `python -m corel.native build` (make install runs it)")


def _model(dtype=torch.float32, **spec):
    torch.manual_seed(3)
    values = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "lam": 0.85, "hidden": 32} | spec
    model = build_classifier(ExperimentSpec(**values), (1, 28, 28), 10).to(dtype)
    return model, adam(model.parameters(), 1e-3)


def _batches(dtype, steps=6, size=16):
    generator = torch.Generator().manual_seed(5)
    return [(torch.randn(size, 1, 28, 28, generator=generator, dtype=dtype),
             torch.randint(0, 10, (size,), generator=generator)) for _ in range(steps)]


class Counted:
    """A native step of corel.train.native_step (the solo one by default), counting the steps it took
    (non-None) and passed."""

    def __init__(self, native_step=step.gaussian_mlp_step):
        self.native_step = native_step
        self.took = self.passed = 0

    def __call__(self, *args, **kwargs):
        out = self.native_step(*args, **kwargs)
        if out is None:
            self.passed += 1
        else:
            self.took += 1
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_step_is_the_autograd_step_bit_for_bit(dtype, monkeypatch):
    batches = _batches(dtype)
    results = {}
    for name in ("native", "autograd"):
        model, optimizer = _model(dtype)
        counted = Counted()
        monkeypatch.setattr(steps, "gaussian_mlp_step", counted if name == "native" else lambda *a, **k: None)
        outs = [steps.solo_step(model, optimizer, x, y, check=i % 2 == 0) for i, (x, y) in enumerate(batches)]
        results[name] = model, optimizer, outs, counted
    (model, optimizer, outs, counted), (their_model, their_optimizer, their_outs, _) = results.values()
    # The first step creates Adam's state on torch's path; every later one is native.
    assert (counted.took, counted.passed) == (len(batches) - 1, 1)
    for (loss, sim), (their_loss, their_sim) in zip(outs, their_outs, strict=True):
        assert torch.equal(loss, their_loss) and torch.equal(sim, their_sim)
        assert not loss.requires_grad and not sim.requires_grad
    assert outs[0][0] != outs[-1][0]  # it did learn: the steps are not all the first one
    for (name, p), q in zip(model.named_parameters(), their_model.parameters(), strict=True):
        assert torch.equal(p, q), name
        assert torch.equal(p.grad, q.grad), name  # left in .grad as backward() leaves them
    mine, theirs = optimizer.state_dict()["state"], their_optimizer.state_dict()["state"]
    for index, entry in theirs.items():
        for key, value in entry.items():
            assert torch.equal(mine[index][key], value), (index, key)


def test_a_pass_trains_with_the_native_step_and_as_before(monkeypatch):
    spec = ExperimentSpec(dataset="fashion-mnist", model="ffnn", loss="gaussian", lam=0.85, hidden=32, epochs=1)
    x, y = _batches(torch.float32, steps=1, size=300)[0]

    data = Dataset(name="noise", modality="image", x_train=x, y_train=y, x_val=x[:20], y_val=y[:20],
                   x_test=x[:20], y_test=y[:20], class_names=[str(k) for k in range(10)],
                   input_shape=(1, 28, 28), preprocessing={})
    totals = {}
    for name in ("native", "autograd"):
        counted = Counted()
        monkeypatch.setattr(steps, "gaussian_mlp_step", counted if name == "native" else lambda *a, **k: None)
        run = solo.start_run(spec, data=data, device="cpu")
        totals[name] = solo.train_pass(run), [p.detach().clone() for p in run.model.parameters()]
        if name == "native":
            assert counted.took == 2 and counted.passed == 1  # 3 batches of 128 (the last 44)
    assert totals["native"][0] == totals["autograd"][0]
    assert all(torch.equal(a, b) for a, b in zip(totals["native"][1], totals["autograd"][1], strict=True))


def test_bad_labels_are_refused_as_the_autograd_step_refuses_them():
    model, optimizer = _model()
    (x, y), (x2, y2) = _batches(torch.float32, steps=2)
    steps.solo_step(model, optimizer, x, y, check=True)  # Adam's state exists: the native step is next
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.9"):
        step.gaussian_mlp_step(model, optimizer, x2, y2 + 10, check=True)
    with pytest.raises(ValueError, match=r"labels must have shape \(16,\)"):
        step.gaussian_mlp_step(model, optimizer, x2, y2[:5], check=True)


def _stepped(**spec):
    model, optimizer = _model(**spec)
    x, y = _batches(torch.float32, steps=1)[0]
    steps.solo_step(model, optimizer, x, y, check=False)
    return model, optimizer, x, y


@pytest.mark.parametrize("spec", [{"loss": "cce"}, {"loss": "cosine"}, {"loss": "center"},
                                  {"learn_gamma": True}, {"model": "cnn"}])
def test_other_heads_and_encoders_take_the_autograd_step(spec):
    model, optimizer, x, y = _stepped(**spec)
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
def test_hooks_and_the_first_step_keep_the_autograd_step():
    model, optimizer = _model()
    x, y = _batches(torch.float32, steps=1)[0]
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None  # no Adam state yet
    steps.solo_step(model, optimizer, x, y, check=False)
    before = model.head.W.detach().clone()
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is not None
    assert not torch.equal(model.head.W, before)  # it stepped

    seen = []
    hook = model.head.W.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.norm()))
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None
    steps.solo_step(model, optimizer, x, y, check=False)
    assert len(seen) == 1  # the autograd step ran, and the hook with it
    hook.remove()
    forward = model.encoder.register_forward_hook(lambda *args: seen.append(None))
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None
    forward.remove()
    model.head.W.requires_grad_(False)
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None
    model.head.W.requires_grad_(True)
    with torch.no_grad():
        assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None
    with torch.autograd.detect_anomaly(check_nan=True):
        assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is None
    assert step.gaussian_mlp_step(model, torch.optim.Adam(model.parameters()), x, y, check=False) is None
    assert step.gaussian_mlp_step(model, optimizer, x.double(), y, check=False) is None
    assert step.gaussian_mlp_step(model, optimizer, x, y, check=False) is not None


def _group(dtype, seeds, **spec):
    from corel.train import StackedRun

    x, y = _batches(torch.float32, steps=1, size=300)[0]
    data = Dataset(name="noise", modality="image", x_train=x, y_train=y, x_val=x[:20], y_val=y[:20],
                   x_test=x[:20], y_test=y[:20], class_names=[str(k) for k in range(10)],
                   input_shape=(1, 28, 28), preprocessing={}).astype(dtype)
    values = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "hidden": 32, "epochs": 1} | spec
    return StackedRun.start([ExperimentSpec(**values, lam=lam, seed=seed) for seed in seeds for lam in (0.3, 0.9)],
                            data, device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seeds", [[0], [0, 1]], ids=["shared batches", "a stream per seed"])
def test_the_stacked_native_step_is_the_autograd_step_bit_for_bit(dtype, seeds, monkeypatch):

    results = {}
    for name in ("native", "autograd"):
        counted = Counted(step.stacked_gaussian_mlp_step)
        monkeypatch.setattr(steps, "stacked_gaussian_mlp_step", counted if name == "native" else lambda *a, **k: None)
        run = _group(dtype, seeds)
        first = run.train_pass()
        second = run.train_pass()
        results[name] = run, (first, second), counted
    (run, passes, counted), (theirs, their_passes, _) = results.values()
    assert (counted.took, counted.passed) == (5, 1)  # 2 passes of 3 steps; the first creates Adam's state
    assert passes == their_passes
    assert passes[0] != passes[1]
    for name, p in run.params.items():
        assert torch.equal(p, theirs.params[name]), name
        assert torch.equal(p.grad, theirs.params[name].grad), name
    mine, want = run.optimizer.state_dict()["state"], theirs.optimizer.state_dict()["state"]
    for index, entry in want.items():
        for key, value in entry.items():
            assert torch.equal(mine[index][key], value), (index, key)


@pytest.mark.parametrize("spec", [{"loss": "cce"}, {"learn_gamma": True}, {"model": "cnn"}])
def test_other_stacks_take_the_autograd_step(spec, monkeypatch):

    counted = Counted(step.stacked_gaussian_mlp_step)
    monkeypatch.setattr(steps, "stacked_gaussian_mlp_step", counted)
    run = _group(torch.float32, [0], **spec)
    run.train_pass()
    run.train_pass()
    assert counted.took == 0 and counted.passed == 6
