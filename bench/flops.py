"""What the throughput benchmarks divide by: a step's FLOPs and this machine's sgemm rate."""

from __future__ import annotations

import statistics
import time

import torch

from corel.train import EngineOptions


def step_flops(model: torch.nn.Module) -> int:
    """FLOPs of one training step per sample: 6 per weight of every matrix product (2 in
    the forward pass, 4 in the backward: the input's gradient and the weight's), the
    convention of the issue's figures and of most MFU accounting. Biases, activations,
    the loss and Adam are left out (a few percent)."""
    return 6 * sum(p.numel() for name, p in model.named_parameters()
                   if p.dim() >= 2 and not name.startswith("head."))


def sgemm_gflops(repeats: int = 5, n: int | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> float:
    """This machine's matrix-product rate with the same torch threads: the median of
    ``repeats`` timed (n x n) @ (n x n) products, 2 n^3 FLOPs each, float32 by default
    (on a GPU, true float32: TF32 off, as corel's runs have it). n defaults to 1024 on a
    CPU and 8192 on a GPU, where a smaller product does not fill the chip."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    n = n or (8192 if cuda else 1024)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        torch.mm(a, b)  # warm-up
        rates = []
        for _ in range(repeats):
            synchronize(device)
            started = time.perf_counter()
            for _ in range(4):
                torch.mm(a, b)
            synchronize(device)
            rates.append(4 * 2 * n**3 / (time.perf_counter() - started) / 1e9)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return statistics.median(rates)


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a timer reads the
    work done rather than the work queued."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def describe(device: str | torch.device, options: EngineOptions | None = None) -> str:
    """The device in words: the GPU's name (and whether corel's passes replay CUDA graphs
    under ``options``, default the engine's), or the CPU's thread count."""
    device = torch.device(device)
    if device.type == "cuda":
        graphs = "on" if (options or EngineOptions()).cuda_graphs == "capture" else "off"
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}, CUDA graphs {graphs}"
    return f"CPU, {torch.get_num_threads()} threads"
