"""The squared distances' backward: corel's matrix products against cdist's own backward.

Gaussian-COREL's similarity is ``-gamma cdist(h, W)**2``. Autograd's backward of that
(``aten._cdist_backward`` for h and for W, after the square's) forms every difference
h_i - w_k, divides it by its distance and sums it; corel's
(``corel.fused.squared_distance_backward``) takes the same sums as matrix products about
the class vectors' mean. This times cdist's, corel's Python and (where ``corel.native``
is built) corel's C++, which the native steps run, on the paper's FFNN shapes (batch 128,
10 classes, 128-d representations), solo and as a 10-member stack, alternating them
``--repeats`` times in one run, and prints the median milliseconds of each, the ratios to
cdist's, and how far cdist's and corel's land from the exact gradient (float64, from the
differences) in float32, near the origin and 500 away from it.
Run: ``.venv/bin/python bench/distance_backward.py [--repeats 7] [--calls 200]`` (``--device
cuda`` on a GPU, with TF32 off as corel's fp32 training has it).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from flops import describe, synchronize  # bench/flops.py, beside this file

from corel import native
from corel.device import ieee_float32
from corel.fused import squared_distance_backward


def cdist_backward(grad: torch.Tensor, h: torch.Tensor, W: torch.Tensor,
                   dist: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What autograd ran for ``cdist(h, W)**2`` before corel's own backward: the square's
    (2 dist, from the forward's distances), then cdist's for h and for W."""
    grad_dist = grad * (2.0 * dist)
    return (torch.ops.aten._cdist_backward(grad_dist.contiguous(), h, W, 2.0, dist),
            torch.ops.aten._cdist_backward(grad_dist.mT.contiguous(), W, h, 2.0, dist.mT.contiguous()))


def corel_backward(grad: torch.Tensor, h: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    grad_h, grad_w = squared_distance_backward(grad, h, W)
    assert grad_h is not None and grad_w is not None
    return grad_h, grad_w


def milliseconds(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - started) / calls * 1e3


def error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double().cpu() - exact).abs().max() / exact.abs().max())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda (float32 products, TF32 off)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats, args.calls = 1, 3
    device = torch.device(args.device)
    with ieee_float32(device):
        run(args.repeats, args.calls, device)


def run(repeats: int, calls: int, device: torch.device) -> None:
    g = torch.Generator().manual_seed(0)
    built = native.module()
    print(f"torch {torch.__version__}, {describe(device)}")
    for label, stack in (("solo (128 x 10, 128-d)", ()), ("stacked (10 x 128 x 10, 128-d)", (10,))):
        h = torch.randn(*stack, 128, 128, generator=g).to(device)
        W = torch.randn(*stack, 10, 128, generator=g).to(device)
        grad = torch.randn(*stack, 128, 10, generator=g).to(device)
        dist = torch.cdist(h, W, compute_mode="donot_use_mm_for_euclid_dist")
        ways = {"cdist's": partial(cdist_backward, grad, h, W, dist),
                "corel's (Python)": partial(corel_backward, grad, h, W)}
        if built is not None:  # the same calls in C++, as corel's native steps make them
            ways["corel's (C++)"] = partial(built.squared_distance_backward, grad, h, W, True, True)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for fn in ways.values():
            milliseconds(fn, 20, device)  # warm-up
        for _ in range(repeats):
            for name, fn in ways.items():
                times[name].append(milliseconds(fn, calls, device))
        medians = {name: statistics.median(t) for name, t in times.items()}
        print(f"{label}: " + ", ".join(f"{name} {ms:.3f} ms" for name, ms in medians.items())
              + f" (medians of {repeats})")
        baseline = medians["cdist's"]
        for name in list(ways)[1:]:
            print(f"  ratio cdist's / {name}: {baseline / medians[name]:.2f}x")
    for offset in (0.0, 500.0):
        shift = torch.randn(1, 128, generator=g, dtype=torch.float64)
        shift = shift / shift.norm() * offset
        h = (shift + torch.randn(128, 128, generator=g, dtype=torch.float64)).float().to(device)
        W = (shift + torch.randn(10, 128, generator=g, dtype=torch.float64)).float().to(device)
        grad = torch.randn(128, 10, generator=g).to(device)
        diff = h.double().cpu().unsqueeze(-2) - W.double().cpu().unsqueeze(-3)
        exact_h = 2 * (grad.double().cpu().unsqueeze(-1) * diff).sum(-2)
        exact_w = -2 * (grad.double().cpu().unsqueeze(-1) * diff).sum(-3)
        dist = torch.cdist(h, W, compute_mode="donot_use_mm_for_euclid_dist")
        old, new = cdist_backward(grad, h, W, dist), corel_backward(grad, h, W)
        print(f"float32 error against the exact gradient (float64), points {offset:g} from the origin: "
              f"cdist's {max(error(old[0], exact_h), error(old[1], exact_w)):.2g}, "
              f"corel's {max(error(new[0], exact_h), error(new[1], exact_w)):.2g} (of the largest component)")


if __name__ == "__main__":
    main()
