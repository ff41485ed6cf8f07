"""bf16 runs: the forward pass and the similarities under bfloat16 autocast (CPU autocast
here), the loss's reductions, the weights and Adam's state in float32."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from corel.data import load_dataset
from corel.device import autocast, effective_precision
from corel.spec import ExperimentSpec
from corel.train import fit, fit_group, forward_loss, start_run, train_pass

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels

BASE = {"dataset": "digits", "epochs": 3, "batch_size": 32, "lr": 1e-3, "loss": "cosine", "lam": 0.8}


@pytest.fixture(scope="module")
def digits():
    return load_dataset(ExperimentSpec(dataset="digits"))


def test_precision_is_auto_fp32_bf16_or_int8_and_auto_trains_in_fp32():
    spec = ExperimentSpec(**BASE)
    assert spec.precision == "auto"
    assert start_run(spec, device="cpu").precision == "fp32"  # auto chooses features' paths; heads: fp32
    with pytest.raises(ValidationError, match="fp32"):
        ExperimentSpec(**BASE, precision="fp16")


def test_the_forward_pass_runs_in_bfloat16_and_the_loss_in_float32(digits):
    run = start_run({**BASE, "precision": "bf16"}, data=digits, device="cpu")
    x, y = digits.x_train[:64], digits.y_train[:64]
    seen: list[torch.dtype] = []
    hook = run.model.encoder.net[1].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    with torch.no_grad():
        loss, h, sim = forward_loss(run.model, x, y, precision="bf16")
    hook.remove()
    assert seen == [torch.bfloat16]  # the first layer's product, under autocast
    assert loss.dtype == h.dtype == sim.dtype == torch.float32
    with torch.no_grad():
        full, h32, _ = forward_loss(run.model, x, y, precision="fp32")
    # bfloat16 keeps 8 bits of mantissa: close to the float32 pass, not equal to it.
    assert not torch.equal(h, h32)
    assert torch.allclose(h, h32, rtol=5e-2, atol=5e-2)
    assert abs(loss.item() - full.item()) < 0.05 * abs(full.item()) + 1e-3


def test_weights_and_adam_state_stay_float32_and_the_run_learns(digits):
    spec = {**BASE, "epochs": 4}
    bf16 = fit({**spec, "precision": "bf16"}, data=digits, device="cpu")
    fp32 = fit(spec, data=digits, device="cpu")
    assert bf16.run.precision == "bf16"
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    moments = [v for state in bf16.run.optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    # Not the float32 run (autocast did something), and as good within a few points.
    w16, w32 = bf16.model.state_dict()["head.W"], fp32.model.state_dict()["head.W"]
    assert not torch.equal(w16, w32)
    assert bf16.test_accuracy is not None and fp32.test_accuracy is not None
    assert bf16.test_accuracy > 0.8 and abs(bf16.test_accuracy - fp32.test_accuracy) < 0.05
    # A checkpoint resumes in its precision.
    assert '"precision":"bf16"' in bf16.run.checkpoint()["spec"]


def test_a_stacked_bf16_group_trains_as_its_solo_runs_do(digits):
    """The stacked trainer autocasts the same two places; member i stays close to its solo
    bf16 run (bfloat16 rounds stacked and single products differently) after an epoch."""
    specs = [{**BASE, "epochs": 1, "lam": lam, "precision": "bf16"} for lam in (0.6, 0.9)]
    group = fit_group(specs, data=digits, device="cpu", chance_epochs=0)
    for spec, member in zip(specs, group, strict=True):
        solo = start_run(spec, data=digits, device="cpu")
        assert train_pass(solo) is not None
        a, b = member.run.model.state_dict(), solo.model.state_dict()
        for name in ("encoder.net.1.weight", "head.W"):
            assert torch.allclose(a[name], b[name], atol=2e-2), name
    fp32 = fit_group([{**s, "precision": "fp32"} for s in specs], data=digits, device="cpu",
                     chance_epochs=0)
    assert not torch.equal(group[0].run.model.state_dict()["head.W"],
                           fp32[0].run.model.state_dict()["head.W"])


def test_fp32_is_untouched_by_autocast():
    with autocast(torch.device("cpu"), "fp32"):
        assert not torch.is_autocast_enabled("cpu")
    with autocast(torch.device("cpu"), "bf16"):
        assert torch.is_autocast_enabled("cpu")
    assert effective_precision(torch.device("cpu"), "bf16") == "bf16"
