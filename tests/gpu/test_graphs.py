"""corel.train.graphs on a GPU (cuda_graphs="capture", the default): the training step captured
once as a CUDA graph and replayed for every full batch trains what the eager loop trains.
Written in a session without a GPU (issue 24), first passed on an H100 on 2026-11-27;
bench/on_gpu.sh runs this file first and trains the CNN rows with graphs only where it
passes."""

from __future__ import annotations

import pytest
import torch

import corel.train.solo
import corel.train.stacked
from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.train import EngineOptions, StackedRun, run_epoch, start_run
from corel.train.graphs import WARMUP
from corel.train.options import parse_cuda_graphs

pytestmark = pytest.mark.gpu

# digits at batch 64: 20 steps a pass, the last one short (1,257 = 19 x 64 + 41).
BASE = {"dataset": "digits", "epochs": 2, "batch_size": 64, "lr": 1e-3}
SOLO = {
    "ffnn-gaussian": {"loss": "gaussian", "lam": 0.75},
    "ffnn-center": {"loss": "center", "lam": 0.3, "alpha": 0.5},
    "ffnn-cce": {"loss": "cce"},
    "cnn-cosine": {"model": "cnn", "loss": "cosine", "lam": 0.6},
}
# Step calls in two passes: WARMUP eager, one recorded, the short last batch of each pass.
EAGER_CALLS = WARMUP + 1 + 2


def graphs(value: str) -> EngineOptions:
    """The engine's options for a COREL_CUDA_GRAPHS value, as the settings read it."""
    return EngineOptions(cuda_graphs=parse_cuda_graphs(value))


@pytest.fixture(scope="module")
def digits():
    return load_dataset(ExperimentSpec(dataset="digits"))


def counted(monkeypatch, module, name):
    """Counts the calls of ``module.name`` (the step function a GraphedSteps runs)."""
    calls = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.mark.parametrize("name", list(SOLO))
def test_a_graphed_run_trains_as_the_eager_run(digits, monkeypatch, name):
    spec = ExperimentSpec(**{**BASE, **SOLO[name]})
    data = digits.astype(torch.float64)  # where rounding cannot grow
    eager = start_run(spec, data=data, options=graphs("0"))
    eager_history = [run_epoch(eager) for _ in range(2)]
    calls = counted(monkeypatch, corel.train.solo, "_indexed_step")
    graphed = start_run(spec, data=data, options=graphs("1"))
    graphed_history = [run_epoch(graphed) for _ in range(2)]
    steps = graphed.graphed
    assert graphed.device.type == "cuda" and steps is not None
    assert steps.failed is None and steps.replaying
    assert len(calls) == EAGER_CALLS  # the other 34 of 40 steps were replays
    torch.testing.assert_close(graphed.model.state_dict(), eager.model.state_dict(), rtol=1e-7, atol=1e-9)
    for got, want in zip(graphed_history, eager_history, strict=True):
        assert got.train_accuracy == pytest.approx(want.train_accuracy, abs=2 / 1257)
        assert got.train_loss == pytest.approx(want.train_loss, rel=1e-6)


def test_a_graphed_stacked_cnn_seed_group_trains_as_the_eager_one(digits, monkeypatch):
    """The paper's CNN rows' shape: one lambda, several seeds (vmap, each seed's own batch)."""
    data = digits.astype(torch.float64)
    specs = [ExperimentSpec(**{**BASE, "model": "cnn", "loss": "gaussian", "lam": 0.8, "seed": s})
             for s in (0, 1, 0)]
    eager = StackedRun.start(specs, data, options=graphs("0"))
    for _ in range(2):
        eager.run_epoch()
    calls = counted(monkeypatch, StackedRun, "_indexed_step")
    graphed = StackedRun.start(specs, data, options=graphs("1"))
    for _ in range(2):
        graphed.run_epoch()
    assert graphed._graphed is not None and graphed._graphed.failed is None and graphed._graphed.replaying
    assert len(calls) == EAGER_CALLS
    for i in range(len(specs)):
        torch.testing.assert_close(graphed.member_state(i), eager.member_state(i), rtol=1e-7, atol=1e-9)


def test_a_graphed_center_group_keeps_its_centers_in_step(digits, monkeypatch):
    """Center's centers change every step, inside the graph: a replay that wrote a tensor
    the group no longer reads would leave them at their captured values."""
    data = digits.astype(torch.float64)
    specs = [ExperimentSpec(**{**BASE, "loss": "center", "lam": 0.3, "alpha": a}) for a in (0.1, 0.9)]
    results = {}
    for mode in ("0", "1"):
        group = StackedRun.start(specs, data, options=graphs(mode))
        for _ in range(2):
            group.run_epoch()
        results[mode] = [group.member_state(i) for i in range(len(specs))]
        if mode == "1":  # replayed, not left eager by a failed capture
            assert group._graphed is not None and group._graphed.failed is None and group._graphed.replaying
    for got, want in zip(results["1"], results["0"], strict=True):
        torch.testing.assert_close(got["head.centers"], want["head.centers"], rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


def test_a_graphed_bf16_run_learns_as_the_eager_one(digits, monkeypatch):
    spec = ExperimentSpec(**{**BASE, "loss": "gaussian", "lam": 0.75, "precision": "bf16", "epochs": 3})
    accuracies = {}
    for mode in ("0", "1"):
        run = start_run(spec, data=digits, options=graphs(mode))
        history = [run_epoch(run) for _ in range(3)]
        accuracies[mode] = history[-1].val_accuracy
        if mode == "1":
            assert run.graphed is not None and run.graphed.failed is None and run.graphed.replaying
    assert accuracies["1"] > 0.8
    assert abs(accuracies["1"] - accuracies["0"]) < 0.03, accuracies


def test_a_graphed_step_never_waits_for_the_gpu(digits, monkeypatch):
    """Replays launch the whole step with one call and read nothing back."""
    from corel.train import Callback

    class NoWaits(Callback):
        def on_batch_end(self, step: int) -> bool:
            torch.cuda.set_sync_debug_mode("error" if WARMUP + 1 <= step < 18 else "default")
            return False

    run = start_run({**BASE, "loss": "gaussian", "lam": 0.75}, data=digits, options=graphs("1"))
    try:
        assert corel.train.solo.train_pass(run, [NoWaits()]) is not None
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert run.graphed is not None and run.graphed.replaying


def test_graphs_are_the_default_on_a_gpu_and_0_turns_them_off(digits, monkeypatch):
    """Unset, COREL_CUDA_GRAPHS captures on CUDA (the default since these tests passed on an
    H100); 0 leaves a run and a stacked group on the plain loop."""
    specs = [ExperimentSpec(**{**BASE, "loss": "gaussian", "lam": lam}) for lam in (0.5, 0.8)]
    run = start_run(specs[0], data=digits)
    run_epoch(run)
    group = StackedRun.start(specs, digits)
    group.run_epoch()
    assert run.device.type == "cuda" and run.graphed is not None and run.graphed.replaying
    assert group._graphed is not None and group._graphed.replaying
    run = start_run(specs[0], data=digits, options=graphs("0"))
    run_epoch(run)
    group = StackedRun.start(specs, digits, options=graphs("0"))
    group.run_epoch()
    assert run.device.type == "cuda" and run.graphed is None and group._graphed is None
