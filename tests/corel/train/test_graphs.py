"""corel.train.graphs on the CPU: the graphed pass's path (steps by row indices, a step that
keeps every tensor it changes in place) trains what the plain loop trains. The capture and
replay themselves need CUDA: tests/gpu/test_graphs.py."""

from __future__ import annotations

import pytest
import torch

from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.train import EngineOptions, StackedRun, fit, run_epoch, start_run
from corel.train.graphs import WARMUP, GraphedSteps
from corel.train.options import parse_cuda_graphs
from corel.train.steps import pass_mode

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels

# digits at batch 16: 79 steps a pass, the last one short (1,257 = 78 x 16 + 9).
BASE = {"dataset": "digits", "batch_size": 16, "lr": 1e-3, "epochs": 2}
SOLO = {
    "ffnn-cce": {"loss": "cce"},
    "ffnn-center": {"loss": "center", "lam": 0.3, "alpha": 0.5},
    "ffnn-cosine": {"loss": "cosine", "lam": 0.6},
    "ffnn-gaussian": {"loss": "gaussian", "lam": 0.75},
    "ffnn-gaussian-bf16": {"loss": "gaussian", "lam": 0.75, "precision": "bf16"},
    "cnn-center": {"model": "cnn", "loss": "center", "lam": 0.3, "alpha": 0.5},
}
GROUPS = {
    # one data order for every member; the FFNN's batched-product path
    "gaussian-lams": [{"loss": "gaussian", "lam": lam} for lam in (0.6, 0.9)],
    # seeds: each member its own stream's batch, gathered (members out of stream order)
    "center-seeds": [{"loss": "center", "lam": 0.3, "alpha": a, "seed": s} for a, s in ((0.1, 1), (0.5, 0), (0.9, 1))],
    "cnn-seeds": [{"model": "cnn", "loss": "gaussian", "lam": 0.8, "seed": s} for s in (0, 1)],
}


@pytest.fixture(scope="module")
def digits64():
    return load_dataset(ExperimentSpec(dataset="digits")).astype(torch.float64)


@pytest.fixture
def graphs():
    """The engine's options for a COREL_CUDA_GRAPHS value, as the settings read it."""
    def options(value: str | None) -> EngineOptions:
        return EngineOptions(cuda_graphs=parse_cuda_graphs(value or ""))
    return options


def state(tensors: dict) -> dict:
    return {k: v.detach().clone() for k, v in tensors.items()}


def adam_state(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for entry in optimizer.state.values() for t in entry.values() if isinstance(t, torch.Tensor)]


def test_the_setting():
    x = torch.zeros(3)
    cpu = torch.device("cpu")
    for value, want, on_cpu in (("1", "capture", "off"), ("eager", "eager", "eager"), ("0", "off", "off"),
                                ("", "capture", "off"), ("Off", "off", "off")):
        options = EngineOptions(cuda_graphs=parse_cuda_graphs(value))
        assert options.cuda_graphs == want, value
        assert pass_mode(options, cpu, x) == on_cpu, value  # a CPU never captures
    assert pass_mode(EngineOptions(), cpu, x) == "off"
    with pytest.raises(ValueError, match=r"COREL_CUDA_GRAPHS='maybe': allowed are 1 .* 0 .* eager"):
        parse_cuda_graphs("maybe")
    with pytest.raises(ValueError, match=r"cuda_graphs='on': allowed are capture, off, eager"):
        EngineOptions(cuda_graphs="on")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(SOLO))
def test_a_run_trains_the_same_through_the_graphed_path(digits64, graphs, name):
    spec = ExperimentSpec(**{**BASE, **SOLO[name]})
    data = digits64 if spec.precision == "fp32" else digits64.astype(torch.float32)
    runs = {}
    for mode in (None, "eager"):
        run = start_run(spec, data=data, options=graphs(mode))
        history = [run_epoch(run) for _ in range(spec.epochs)]
        runs[mode] = (run, history)
    (plain, plain_history), (graphed, graphed_history) = runs[None], runs["eager"]
    assert plain.graphed is None
    steps = graphed.graphed
    assert isinstance(steps, GraphedSteps) and not steps.capture and not steps.replaying
    assert steps._full == torch.Size([16])  # full batches; the short last one went through too
    assert graphed_history == [m.__class__(**{**m.to_dict(), "seconds": g.seconds})
                               for m, g in zip(plain_history, graphed_history, strict=True)]
    for key, want in plain.model.state_dict().items():
        assert torch.equal(graphed.model.state_dict()[key], want), key
    for got, want in zip(adam_state(graphed.optimizer), adam_state(plain.optimizer), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", list(GROUPS))
def test_a_group_trains_the_same_through_the_graphed_path(digits64, graphs, name):
    specs = [ExperimentSpec(**{**BASE, **fields}) for fields in GROUPS[name]]
    groups = {}
    for mode in (None, "eager"):
        group = StackedRun.start(specs, digits64, options=graphs(mode))
        history = [group.run_epoch() for _ in range(2)]
        groups[mode] = (group, history)
    (plain, plain_history), (graphed, graphed_history) = groups[None], groups["eager"]
    assert plain._graphed is None and graphed._graphed is not None and not graphed._graphed.capture
    for got, want in zip(graphed_history, plain_history, strict=True):
        assert [(m.train_loss, m.train_accuracy, m.val_accuracy) for m in got] == [
            (m.train_loss, m.train_accuracy, m.val_accuracy) for m in want]
    for i in range(len(specs)):
        for key, want in plain.member_state(i).items():
            assert torch.equal(graphed.member_state(i)[key], want), (i, key)
    for got, want in zip(adam_state(graphed.optimizer), adam_state(plain.optimizer), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["ffnn-center", "cnn-center"])
def test_a_run_s_step_changes_its_tensors_in_place(digits64, graphs, name):
    """A CUDA graph replays its writes into the tensors it recorded: a step that rebinds a
    parameter, a buffer or Adam's state to a new tensor would leave the model reading a
    tensor the graph no longer writes."""
    run = start_run(ExperimentSpec(**{**BASE, **SOLO[name]}), data=digits64, options=graphs("eager"))
    run_epoch(run)  # Adam's state exists from the first step on
    tensors = {**dict(run.model.named_parameters()), **dict(run.model.named_buffers())}
    before, held = state(tensors), dict(tensors)
    moments = adam_state(run.optimizer)
    run_epoch(run)
    now = {**dict(run.model.named_parameters()), **dict(run.model.named_buffers())}
    for key, tensor in held.items():
        assert now[key] is tensor, key
    assert not torch.equal(now["head.centers"], before["head.centers"])
    assert all(a is b for a, b in zip(adam_state(run.optimizer), moments, strict=True))


@pytest.mark.parametrize("name", ["center-seeds", "gaussian-lams"])
def test_a_group_s_step_changes_its_tensors_in_place(digits64, graphs, name):
    group = StackedRun.start([ExperimentSpec(**{**BASE, **f}) for f in GROUPS[name]], digits64, options=graphs("eager"))
    group.run_epoch()
    held = {**group.params, **group.buffers}
    before = state(held)
    moments = adam_state(group.optimizer)
    group.run_epoch()
    for key, tensor in held.items():
        now = {**group.params, **group.buffers}[key]
        assert now is tensor, key
    assert not torch.equal(group.params["head.W"], before["head.W"])
    if "head.centers" in held:
        assert not torch.equal(group.buffers["head.centers"], before["head.centers"])
    assert all(a is b for a, b in zip(adam_state(group.optimizer), moments, strict=True))


def test_graphed_steps_run_every_step_eagerly_without_capture():
    """capture=False (and any batch of another shape than the first): the step itself,
    every time, with its own outputs."""
    seen = []

    def step(idx):
        seen.append(idx.clone())
        return (idx.sum(), idx * 2)

    steps = GraphedSteps(step, capture=False)
    for start in range(0, 10 * (WARMUP + 2) + 3, 10):
        idx = torch.arange(start, min(start + 10, 10 * (WARMUP + 2) + 3))
        total, doubled = steps(idx)
        assert int(total) == int(idx.sum()) and torch.equal(doubled, idx * 2)
    assert len(seen) == WARMUP + 3 and not steps.replaying and steps.failed is None


def test_a_finished_run_lets_its_graph_go(digits64, graphs):
    """fit's result holds its run; the run's graph (on a GPU: a memory pool of its own) goes
    when training ends, and a run trained further takes a new one."""
    spec = ExperimentSpec(**{**BASE, "epochs": 1, "loss": "gaussian", "lam": 0.75})
    result = fit(spec, data=digits64, options=graphs("eager"))
    assert result.run.epoch == 1 and result.run.graphed is None
    result.run.spec = spec.model_copy(update={"epochs": 2})
    run_epoch(result.run)
    assert result.run.epoch == 2 and result.run.graphed is not None
