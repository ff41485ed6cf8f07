"""What the throughput benchmarks divide by: a step's FLOPs and this machine's sgemm rate."""

from __future__ import annotations

import statistics
import time

import torch


def step_flops(model: torch.nn.Module) -> int:
    """FLOPs of one training step per sample: 6 per weight of every matrix product (2 in
    the forward pass, 4 in the backward: the input's gradient and the weight's), the
    convention of the issue's figures and of most MFU accounting. Biases, activations,
    the loss and Adam are left out (a few percent)."""
    return 6 * sum(p.numel() for name, p in model.named_parameters()
                   if p.dim() >= 2 and not name.startswith("head."))


def sgemm_gflops(repeats: int = 5, n: int = 1024) -> float:
    """This machine's float32 matrix-product rate with the same torch threads: the median
    of ``repeats`` timed (n x n) @ (n x n) products, 2 n^3 FLOPs each."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        rates.append(4 * 2 * n**3 / (time.perf_counter() - started) / 1e9)
    return statistics.median(rates)
