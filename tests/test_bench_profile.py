"""bench/profile_step.py's dispatch timer: the matrix products it finds and the FLOPs it
adds up from their shapes, on products whose FLOPs are known."""

from __future__ import annotations

import importlib.util
import sys

import torch

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "bench"))  # profile_step imports bench/flops.py beside it
_spec = importlib.util.spec_from_file_location("profile_step", REPO / "bench" / "profile_step.py")
assert _spec is not None and _spec.loader is not None
profile_step = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(profile_step)


def test_the_timer_counts_each_product_and_its_flops():
    layer = torch.nn.Linear(20, 8)
    x = torch.randn(32, 20, requires_grad=True)
    a, b = torch.randn(5, 4, 6), torch.randn(5, 6, 3)
    timer = profile_step.Timer()
    with timer:
        layer(x).sum().backward()  # addmm forward; mm for the weight's and the input's gradients
        torch.bmm(a, b)
        torch.baddbmm(torch.zeros(5, 4, 3), a, b)
    assert timer.calls["aten.addmm.default"] == 1
    assert timer.calls["aten.mm.default"] == 2
    assert timer.calls["aten.bmm.default"] == 1 and timer.calls["aten.baddbmm.default"] == 1
    linear = 3 * 2 * 32 * 20 * 8  # forward, weight gradient, input gradient
    batched = 2 * (2 * 5 * 4 * 6 * 3)
    assert timer.flops == linear + batched
    assert all(timer.seconds[name] > 0 for name in timer.calls)


def test_the_floor_adds_the_products_adam_and_the_distances_and_nothing_else():
    """floor(): the timed products plus the timed Adam and cdist calls (and nothing else the
    timer saw), and the fraction of a given rate that a step of only those reaches."""
    layer = torch.nn.Linear(64, 32)
    optimizer = torch.optim.Adam(layer.parameters(), fused=True)
    centres = torch.randn(10, 32, requires_grad=True)
    timer = profile_step.Timer()
    with timer:
        for _ in range(2):
            h = torch.nn.functional.leaky_relu(layer(torch.randn(128, 64)), 0.1)
            torch.cdist(h, centres, compute_mode="donot_use_mm_for_euclid_dist").sum().backward()
            optimizer.step()
    assert timer.calls["aten._fused_adam_.default"] == 2 and timer.calls["aten._cdist_backward.default"] >= 2
    products, fixed, fraction = profile_step.floor(timer, steps=2, gemm=50.0, model_flops=1e6)
    assert products == sum(timer.seconds[n] for n in profile_step.PRODUCTS) / 2 * 1e3 > 0
    timed = [timer.seconds[n] for n in profile_step.FLOOR if n in timer.seconds]
    assert len(timed) >= 3 and fixed == sum(timed) / 2 * 1e3
    assert timer.seconds["aten.leaky_relu.default"] > 0  # timed, and left out of the floor
    assert products + fixed < sum(timer.seconds.values()) / 2 * 1e3
    assert abs(fraction - 1e6 / ((products + fixed) / 1e3) / 50e9) < 1e-12
