"""Where a training step's time goes: torch.profiler's table of the solo and the stacked step.

A diagnostic, not a benchmark (it prints no ratio): the FFNN on Fashion-MNIST with a
Gaussian-COREL head, ``--steps`` steps of ``corel.train.train_pass`` and of a 10-member
``StackedRun.train_pass`` after a warm-up pass each, and per operator its share of the
self CPU time, its milliseconds a step and its calls a step. The matrix products are the
arithmetic; everything else is what the loop costs around it. (Under a profiler
``FusedAdam.step`` takes torch's wrapped step, so its ``Optimizer.step#`` row is Python
that an unprofiled step does not run; and the native step of ``corel/train/native_step.py`` stands
aside, so the table is the autograd step's; ``--timer dispatch`` times the native step. And the stacked step's first-layer weight gradient,
``aten::mm`` of 1280 x 128 x 784, runs several times slower under the profiler than
without it: 4-6 ms against 1.65 ms, timed per ATen call with a TorchDispatchMode, on a
2-core AMD EPYC.)
``--timer dispatch`` times each ATen call's wall clock instead (a ``TorchDispatchMode``,
without the profiler's slowdown of the products), and adds up the matrix products' FLOPs
from their shapes: their GFLOP/s beside this machine's sgemm (``bench/flops.py``) says
how near the arithmetic itself runs to the limit, and the rest of the step is what it
costs around it. The step time with no timer at all is printed first, and last a floor:
the step if nothing ran but its products, Adam and the loss's distances, as timed (calls
whose cost the math and the parameter count fix: Adam reads and writes four tensors the
size of the model, and Gaussian-COREL takes its distances from the differences,
``corel/similarity.py``; their backward is matrix products, counted with the products,
``corel.fused.squared_distance_backward``), and the fraction of sgemm that such a step would reach by the
throughput benchmarks' measure (6 FLOPs a weight; the first layer's products do 4, as no
gradient of the input is taken, so that measure can pass 1).
Run: ``.venv/bin/python bench/profile_step.py [--steps 100] [--rows 20] [--timer dispatch]``.
"""

from __future__ import annotations

import argparse
import collections
import copy
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from flops import sgemm_gflops, step_flops  # bench/flops.py, beside this file
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from corel.data import Dataset, load_dataset
from corel.spec import ExperimentSpec
from corel.train import StackedRun, start_run, train_pass


def table(prof: profile, steps: int, rows: int) -> str:
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    lines = [f"{'operator':48s} {'self %':>7s} {'ms/step':>8s} {'calls/step':>10s}"]
    for e in events[:rows]:
        lines.append(f"{e.key[:48]:48s} {100 * e.self_cpu_time_total / total:6.1f}% "
                     f"{e.self_cpu_time_total / 1e3 / steps:8.3f} {e.count / steps:10.1f}")
    lines.append(f"{'total':48s} {100.0:6.1f}% {total / 1e3 / steps:8.3f}")
    return "\n".join(lines)


# The matrix products and their FLOPs from the operands' shapes (batched ones by batch).
PRODUCTS: dict[str, Callable[..., int]] = {
    "aten.mm.default": lambda a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1],
    "aten.addmm.default": lambda c, a, b, *_: 2 * a.shape[0] * a.shape[1] * b.shape[1],
    "aten.bmm.default": lambda a, b: 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2],
    "aten.baddbmm.default": lambda c, a, b, *_: 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2],
}


class Timer(TorchDispatchMode):
    """Each ATen call's wall clock and count, and the matrix products' FLOPs."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.flops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        started = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        name = str(func)
        self.seconds[name] += time.perf_counter() - started
        self.calls[name] += 1
        if name in PRODUCTS:
            self.flops += PRODUCTS[name](*args)
        return out


# What a step cannot do without, besides its products: Adam (and its step count) and the
# Gaussian-COREL distances (cdist forward; its backward is products since corel's squared
# distances have their own, but a plain cdist's backward counts here).
FLOOR = ("aten._fused_adam_.default", "aten._foreach_add_.Scalar",
         "aten._cdist_forward.default", "aten._cdist_backward.default")


def floor(timer: Timer, steps: int, gemm: float, model_flops: float) -> tuple[float, float, float]:
    """From a :class:`Timer` of ``steps`` steps: (the products' milliseconds a step, the
    :data:`FLOOR` calls' milliseconds a step, the fraction of ``gemm`` GFLOP/s that a step
    of only those would reach for ``model_flops`` FLOPs a step)."""
    products = sum(timer.seconds[name] for name in PRODUCTS) / steps * 1e3
    fixed = sum(timer.seconds[name] for name in FLOOR) / steps * 1e3
    return products, fixed, model_flops / ((products + fixed) / 1e3) / (gemm * 1e9)


def timed(train: Callable[[], object], steps: int, rows: int, gemm: float, model_flops: float) -> str:
    """The step with no timer (median of 3 passes), then each ATen call's share under a
    :class:`Timer`, the matrix products' rate against ``gemm`` GFLOP/s, and the
    :func:`floor` of a step that does ``model_flops`` FLOPs."""
    plain = []
    for _ in range(3):
        started = time.perf_counter()
        train()
        plain.append((time.perf_counter() - started) / steps * 1e3)
    timer = Timer()
    with timer:
        train()
    step = statistics.median(plain)
    lines = [f"step with no timer: {step:.3f} ms (median of 3 passes)",
             f"{'ATen call':48s} {'share':>7s} {'ms/step':>8s} {'calls/step':>10s}"]
    total = sum(timer.seconds.values())
    for name, seconds in timer.seconds.most_common(rows):
        lines.append(f"{name[:48]:48s} {100 * seconds / total:6.1f}% {seconds * 1e3 / steps:8.3f} "
                     f"{timer.calls[name] / steps:10.1f}")
    lines.append(f"{'all ATen calls':48s} {100.0:6.1f}% {total * 1e3 / steps:8.3f}")
    products, fixed, fraction = floor(timer, steps, gemm, model_flops)  # ms a step
    rate = timer.flops / steps / (products / 1e3) / 1e9 if products else 0.0
    lines.append(f"matrix products: {products:.3f} ms a step, {rate:.1f} GFLOP/s, "
                 f"{rate / gemm:.2f} of sgemm here ({gemm:.1f} GFLOP/s); everything else: "
                 f"{step - products:.3f} ms a step")
    lines.append(f"floor: the products ({products:.3f} ms) + Adam and the distances ({fixed:.3f} ms) "
                 f"= {products + fixed:.3f} ms a step, a fraction of sgemm of {fraction:.2f} "
                 f"(the benchmarks' measure); the rest costs {step - products - fixed:.3f} ms")
    return "\n".join(lines)


def subset(data: Dataset, rows: int) -> Dataset:
    part = copy.copy(data)
    part.x_train, part.y_train = data.x_train[:rows], data.y_train[:rows]
    return part


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--timer", default="profiler", choices=["profiler", "dispatch"],
                        help="torch.profiler's table (default), or each ATen call's wall clock")
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.rows, args.members = 3, 5, 2
    specs = [ExperimentSpec(dataset="fashion-mnist", model="ffnn", loss="gaussian", epochs=1,
                            lam=round((i + 1) / args.members, 4)) for i in range(args.members)]
    data = load_dataset(specs[0], args.data_dir)
    part = subset(data, args.steps * specs[0].batch_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps of batch "
          f"{specs[0].batch_size}")

    run = start_run(specs[-1], data=part, device="cpu")
    group = StackedRun.start(specs, part, device="cpu")
    gemm = sgemm_gflops(**({"repeats": 1, "n": 256} if args.smoke else {})) if args.timer == "dispatch" else 0.0
    per_step = step_flops(run.model) * specs[0].batch_size  # FLOPs of one member's step
    for title, train, members in (
            (f"solo step (train_pass, lam {specs[-1].lam})", lambda: train_pass(run), 1),
            (f"stacked step ({args.members} members)", group.train_pass, args.members)):
        train()  # warm-up
        if args.timer == "dispatch":
            print(f"\n{title}:\n" + timed(train, args.steps, args.rows, gemm, members * per_step))
            continue
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            train()
        print(f"\n{title}:\n" + table(prof, args.steps, args.rows))


if __name__ == "__main__":
    main()
