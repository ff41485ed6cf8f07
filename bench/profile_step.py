"""Where a training step's time goes: torch.profiler's table of the solo and the stacked step.

A diagnostic, not a benchmark (it prints no ratio): the FFNN on Fashion-MNIST with a
Gaussian-COREL head, ``--steps`` steps of ``corel.training.train_pass`` and of a 10-member
``StackedRun.train_pass`` after a warm-up pass each, and per operator its share of the
self CPU time, its milliseconds a step and its calls a step. The matrix products are the
arithmetic; everything else is what the loop costs around it. (Under a profiler
``FusedAdam.step`` takes torch's wrapped step, so its ``Optimizer.step#`` row is Python
that an unprofiled step does not run. And the stacked step's first-layer weight gradient,
``aten::mm`` of 1280 x 128 x 784, runs several times slower under the profiler than
without it: 4-6 ms against 1.65 ms, timed per ATen call with a TorchDispatchMode, on a
2-core AMD EPYC.)
Run: ``.venv/bin/python bench/profile_step.py [--steps 100] [--rows 20]``.
"""

from __future__ import annotations

import argparse
import copy
import os

import torch
from torch.profiler import ProfilerActivity, profile

from corel.data import Dataset, load_dataset
from corel.spec import ExperimentSpec
from corel.training import start_run, train_pass
from corel.vectorized import StackedRun


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


def subset(data: Dataset, rows: int) -> Dataset:
    part = copy.copy(data)
    part.x_train, part.y_train = data.x_train[:rows], data.y_train[:rows]
    return part


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    args = parser.parse_args()
    specs = [ExperimentSpec(dataset="fashion-mnist", model="ffnn", loss="gaussian", epochs=1,
                            lam=round((i + 1) / args.members, 4)) for i in range(args.members)]
    data = load_dataset(specs[0], args.data_dir)
    part = subset(data, args.steps * specs[0].batch_size)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps} steps of batch "
          f"{specs[0].batch_size}")

    run = start_run(specs[-1], data=part, device="cpu")
    train_pass(run)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        train_pass(run)
    print(f"\nsolo step (train_pass, lam {specs[-1].lam}):\n" + table(prof, args.steps, args.rows))

    group = StackedRun.start(specs, part, device="cpu")
    group.train_pass()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        group.train_pass()
    print(f"\nstacked step ({args.members} members):\n" + table(prof, args.steps, args.rows))


if __name__ == "__main__":
    main()
