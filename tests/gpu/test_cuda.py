"""The GPU path: a run, a stacked group, bf16, serving and checkpoints, on CUDA. Each test
checks ``device.type == "cuda"`` where the work happens, so that a CPU-only device choice
fails it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corel.data import load_dataset
from corel.serving import ServedModel
from corel.spec import ExperimentSpec
from corel.train import (
    StackedRun,
    accuracy,
    checkpoint_from_bytes,
    checkpoint_to_bytes,
    fit,
    model_from_checkpoint,
    start_run,
    train_pass,
)

pytestmark = pytest.mark.gpu

BASE = {"dataset": "digits", "epochs": 2, "batch_size": 64, "lr": 1e-3, "loss": "cosine", "lam": 0.8}


@pytest.fixture(scope="module")
def digits():
    return load_dataset(ExperimentSpec(dataset="digits"))


def test_a_run_trains_on_the_gpu_with_its_data_there(digits):
    run = start_run(BASE, data=digits)  # the default device: CUDA when there is one
    assert run.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in run.model.parameters())
    assert run.data.x_train.device.type == "cuda" and run.data.y_train.device.type == "cuda"
    seen: list[torch.device] = []
    hook = run.model.encoder.register_forward_pre_hook(lambda m, args: seen.append(args[0].device))
    assert train_pass(run) is not None
    hook.remove()
    assert seen and all(d.type == "cuda" for d in seen)  # every batch, on the device


def test_bf16_on_the_gpu(digits):
    result = fit({**BASE, "precision": "bf16"}, data=digits)
    assert result.run.device.type == "cuda" and result.run.precision == "bf16"
    assert result.test_accuracy is not None and result.test_accuracy > 0.8


def test_a_stacked_group_on_the_gpu(digits):
    specs = [ExperimentSpec(**{**BASE, "lam": lam}) for lam in (0.6, 0.8, 0.95)]
    group = StackedRun.start(specs, digits)
    assert group.device.type == "cuda"
    assert all(t.device.type == "cuda" for t in group.params.values())
    assert group.run_epoch() is not None


def test_a_cnn_group_of_several_seeds_on_the_gpu_matches_its_solo_runs_and_never_waits(digits):
    """The paper's CNN rows' shape (one lambda, several seeds: vmap's grouped convolutions
    on each seed's own batches): each member ends where its solo GPU run ends (float64,
    where rounding cannot grow), and no step of the group reads a value back to the host."""
    from corel.train import GroupCallback, fit_group

    data = digits.astype(torch.float64)
    specs = [ExperimentSpec(**{**BASE, "model": "cnn", "loss": "gaussian", "epochs": 1, "seed": seed})
             for seed in (0, 1, 0)]

    class NoWaits(GroupCallback):
        def on_batch_end(self, step: int) -> bool:
            torch.cuda.set_sync_debug_mode("error" if 0 < step < 15 else "default")
            return False

    group = StackedRun.start(specs, data)
    assert group.device.type == "cuda" and group.data.x_train.device.type == "cuda"
    try:
        assert group.train_pass([NoWaits()]) is not None
    finally:
        torch.cuda.set_sync_debug_mode("default")
    results = fit_group(specs, data=data, chance_epochs=0)
    for spec, result in zip(specs, results, strict=True):
        alone = fit(spec, data=data, chance_epochs=0)
        assert result.run.device.type == "cuda" and result.model.head.W.device.type == "cuda"
        torch.testing.assert_close(result.model.state_dict(), alone.model.state_dict(), rtol=1e-7, atol=1e-7)


def test_a_gpu_checkpoint_serves_on_the_gpu_and_on_the_cpu(digits):
    result = fit(BASE, data=digits)
    blob = checkpoint_to_bytes(result.run.best_checkpoint())
    on_gpu = ServedModel.from_bytes(blob, "cuda")
    assert on_gpu.device.type == "cuda"
    x = digits.x_test[:32].cpu()  # the model's inputs (already prepared)
    computed_on: list[torch.device] = []
    hook = on_gpu.model.encoder.register_forward_hook(lambda m, args, out: computed_on.append(out.device))
    h_gpu = on_gpu.embed(x)
    hook.remove()
    # The rows are computed on the GPU and handed back as float32 on the CPU (embed's
    # contract: /embed and the batch jobs write them out from there).
    assert [d.type for d in computed_on] == ["cuda"]
    assert h_gpu.device.type == "cpu" and h_gpu.dtype == torch.float32
    on_cpu = ServedModel.from_bytes(blob, "cpu")
    assert on_cpu.device.type == "cpu"
    torch.testing.assert_close(h_gpu, on_cpu.embed(x), rtol=1e-4, atol=1e-4)
    # And a CPU checkpoint loads on the GPU.
    cpu_run = fit(BASE, data=digits, device="cpu")
    _, model = model_from_checkpoint(checkpoint_from_bytes(checkpoint_to_bytes(cpu_run.run.best_checkpoint())), "cuda")
    assert model.head.W.device.type == "cuda"


@pytest.mark.parametrize("loss", ["cce", "center", "cosine", "gaussian"])
def test_a_training_step_never_waits_for_the_gpu(digits, loss):
    """No step reads a value back to the host (a ``.item()``, a ``bincount``, a boolean
    mask): such a wait stalls a run on everything queued on the GPU, and many runs sharing
    one GPU on each other. CUDA's sync debug mode raises at any synchronising call in the
    steps after the first (which validates the labels once and creates Adam's state)."""
    from corel.train import Callback

    class NoWaits(Callback):
        def on_batch_end(self, step: int) -> bool:
            if step == 0:
                torch.cuda.set_sync_debug_mode("error")
                return False
            if step >= 10:
                torch.cuda.set_sync_debug_mode("default")
                return True  # train_pass returns None before adding up its pass
            return False

    run = start_run({**BASE, "loss": loss}, data=digits)
    assert run.device.type == "cuda"
    try:
        assert train_pass(run, [NoWaits()]) is None
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_data_too_large_for_the_gpu_stays_pinned_on_the_host_and_batches_cross_asynchronously(
        digits, monkeypatch):
    import corel.device

    resident = fit(BASE, data=digits)  # digits fits: held on the GPU
    assert resident.run.data.x_train.device.type == "cuda"
    monkeypatch.setattr(corel.device, "fits_on_device", lambda data, device: False)
    run = start_run(BASE, data=digits)
    assert run.device.type == "cuda"
    assert run.data.x_train.device.type == "cpu" and run.data.x_train.is_pinned()
    assert run.data.y_train.device.type == "cuda"
    seen: list[torch.device] = []
    hook = run.model.encoder.register_forward_pre_hook(lambda m, args: seen.append(args[0].device))
    assert train_pass(run) is not None
    hook.remove()
    assert seen and all(d.type == "cuda" for d in seen)  # every batch copied to the GPU
    hosted = fit(BASE, data=digits)
    assert hosted.run.data.x_train.device.type == "cpu"
    # The same batches in the same order as the resident run: the same training.
    assert hosted.history[-1].train_loss == pytest.approx(resident.history[-1].train_loss, rel=1e-4)
    for name, value in resident.model.state_dict().items():
        torch.testing.assert_close(hosted.model.state_dict()[name], value, rtol=1e-4, atol=1e-5)


def test_exact_neighbour_search_runs_on_the_gpu(digits):
    from corel.index import VectorIndex

    rows = np.asarray(digits.x_train.cpu().flatten(1), dtype=np.float32)
    labels = np.asarray(digits.y_train.cpu())
    for geometry in ("euclidean", "cosine"):
        on_cpu = VectorIndex.build(rows, labels, geometry, "exact")
        on_gpu = on_cpu.to("cuda")
        assert on_gpu.device.type == "cuda" and on_cpu.device.type == "cpu"
        d_gpu, r_gpu = on_gpu.search(rows[:50], 5)
        d_cpu, r_cpu = on_cpu.search(rows[:50], 5)
        np.testing.assert_allclose(d_gpu, d_cpu, rtol=1e-4, atol=1e-4)
        assert (r_gpu[:, 0] == r_cpu[:, 0]).mean() > 0.95
        assert VectorIndex.from_bytes(on_gpu.to_bytes()).device.type == "cpu"


def test_a_gpu_trained_run_exports_and_runs_under_onnxruntime_on_the_cpu(digits):
    import onnxruntime as ort

    from corel.export import export

    result = fit(BASE, data=digits)
    assert result.run.device.type == "cuda"
    checkpoint = checkpoint_from_bytes(checkpoint_to_bytes(result.run.best_checkpoint()))
    session = ort.InferenceSession(export(checkpoint, "onnx"), providers=["CPUExecutionProvider"])
    served = ServedModel.from_checkpoint(checkpoint, "cpu")
    # The file's input is the model's input, after the recorded preprocessing: digits'
    # rows are that already (served.prepare would apply the preprocessing a second time).
    x = digits.x_test[:16].cpu().float()
    h, sims = session.run(None, {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(h), served.embed(x), rtol=1e-4, atol=1e-4)
    assert sims.shape == (16, digits.num_classes)


@pytest.fixture
def tf32_allowed():
    """TF32 allowed to cuBLAS and cuDNN (cuDNN's is PyTorch's default), as a user's own
    process may have it; the process's settings back afterwards."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_ieee_float32_keeps_a_gpu_s_float32_products_and_convolutions_float32(tf32_allowed):
    """Where TF32 is allowed, this GPU's float32 product and convolution are TF32's (the
    control: off by more than 5e-5 relative to float64); under ieee_float32 they are
    float32's (within 1e-5), and the process's settings come back after."""
    from corel.device import ieee_float32

    g = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(512, 512, device="cuda", generator=g) for _ in range(2))
    x = torch.randn(8, 64, 32, 32, device="cuda", generator=g)
    w = torch.randn(64, 64, 3, 3, device="cuda", generator=g)

    def errors() -> tuple[float, float]:
        mm, ref_mm = a @ b, a.double() @ b.double()
        conv = torch.nn.functional.conv2d(x, w, padding=1)
        ref_conv = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
        return (float((mm - ref_mm).abs().max() / ref_mm.abs().max()),
                float((conv - ref_conv).abs().max() / ref_conv.abs().max()))

    assert min(errors()) > 5e-5  # TF32 here when allowed (about 2^-11 a product)
    with ieee_float32(torch.device("cuda")):
        assert max(errors()) < 1e-5
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def test_fp32_training_evaluation_and_serving_run_in_ieee_float32_on_the_gpu(digits, tf32_allowed):
    """A fp32 CNN run's steps (forward and backward), its evaluation, a stacked group's
    steps and the served rows all run with TF32 off, though the process allows it."""
    seen: list[tuple[str, bool, bool]] = []

    def look(where: str):
        def hook(*_):
            seen.append((where, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32))
        return hook

    cnn = {**BASE, "model": "cnn", "epochs": 1}
    run = start_run(cnn, data=digits)
    assert run.device.type == "cuda" and run.precision == "fp32"
    first_conv = run.model.encoder.features[0]
    first_conv.register_forward_pre_hook(look("train forward"))
    first_conv.register_full_backward_hook(look("train backward"))
    assert train_pass(run) is not None
    run.model.encoder.register_forward_pre_hook(look("evaluation"))
    accuracy(run.model, run.data.x_val, run.data.y_val)
    group = StackedRun.start([ExperimentSpec(**{**cnn, "seed": s}) for s in (0, 1)], digits)
    group._template.encoder.register_forward_pre_hook(look("stacked"))
    assert group.run_epoch() is not None
    served = ServedModel.from_bytes(checkpoint_to_bytes(run.checkpoint()), "cuda")
    served.model.encoder.register_forward_pre_hook(look("served"))
    served.embed(digits.x_test[:16].cpu())
    assert {where for where, *_ in seen} == {"train forward", "train backward", "evaluation", "stacked", "served"}
    assert [s for s in seen if s[1] or s[2]] == []
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32  # put back


def test_the_gaussian_distance_gradient_runs_on_the_gpu_as_exactly_as_on_the_cpu():
    """Gaussian-COREL's squared-distance backward (matrix products about the class vectors'
    mean) on CUDA, in float32 with TF32 off as training has it, 500 away from the origin: on
    the GPU, and as close to the exact gradient (float64, from the differences) as on the
    CPU, for a pair and for a stack."""
    from corel.device import ieee_float32
    from corel.fused import squared_distance_backward
    from tests.corel.test_similarity import exact_gradients, far_cluster

    for stack in ((), (4,)):
        h, W, grad = far_cluster(torch.float32, stack)
        exact_h, exact_w = exact_gradients(h, W, grad)
        with ieee_float32(torch.device("cuda")):
            got_h, got_w = squared_distance_backward(grad.cuda(), h.cuda(), W.cuda())
        for got, exact in ((got_h, exact_h), (got_w, exact_w)):
            assert got.device.type == "cuda" and got.dtype == torch.float32
            assert float((got.double().cpu() - exact).abs().max() / exact.abs().max()) < 1e-6


def test_a_stacks_shared_first_layer_runs_on_the_gpu_as_the_wide_layer():
    """corel.fused.SharedLinear (a stack's first layer on shared inputs: one baddbmm over the
    inputs broadcast to the members) on CUDA, in float64: on the GPU, with the values and
    the gradients of x, W and b of the members' weights side by side as one layer."""
    from corel.fused import shared_linear
    from tests.corel.test_fused import _wide_first_layer

    g = torch.Generator().manual_seed(7)
    x, W, b, upstream = (torch.randn(*shape, generator=g, dtype=torch.float64).cuda()
                         for shape in ((128, 784), (10, 128, 784), (10, 128), (10, 128, 128)))
    for t in (x, W, b):
        t.requires_grad_()
    out = shared_linear(x, W, b)
    assert out.device.type == "cuda" and "SharedLinear" in out.grad_fn.name()
    wide = _wide_first_layer(x, W, b)
    torch.testing.assert_close(out, wide, rtol=0, atol=1e-10)
    got = torch.autograd.grad(out, (x, W, b), upstream)
    want = torch.autograd.grad(wide, (x, W, b), upstream)
    for a, c in zip(got, want, strict=True):
        assert a.device.type == "cuda"
        torch.testing.assert_close(a, c, rtol=0, atol=1e-10)
