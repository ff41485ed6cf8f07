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
