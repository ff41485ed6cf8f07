"""bf16 against fp32: test accuracy (at the best-validation epoch) and seconds per epoch of
the same Fashion-MNIST FFNN runs, per seed, in one run.

    .venv/bin/python bench/precision.py [--epochs 10] [--seeds 0 1 2] [--loss gaussian]

The last line is ``bf16 - fp32 test accuracy: mean D points (max |d| M)``; issue 24's
target is within 0.3 points. On a CPU, bf16 runs under CPU autocast: without native
bfloat16 instructions its products are slower than float32's, and the seconds say so.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.train import fit


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--loss", default="gaussian")
    parser.add_argument("--lam", type=float, default=0.85)
    parser.add_argument("--device", default=None)
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.seeds = 1, [0]
    base = {"dataset": "fashion-mnist", "model": "ffnn", "loss": args.loss, "lam": args.lam,
            "epochs": args.epochs, **({"train_subset": 1000} if args.smoke else {})}
    data = load_dataset(ExperimentSpec(**base), args.data_dir)
    print(f"Fashion-MNIST FFNN ({args.loss}, lam {args.lam}), {args.epochs} epochs, seeds "
          f"{args.seeds}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    diffs, speed = [], {"fp32": [], "bf16": []}
    for seed in args.seeds:
        acc = {}
        for precision in ("fp32", "bf16"):
            result = fit({**base, "seed": seed, "precision": precision}, data=data, device=args.device)
            acc[precision] = result.test_accuracy or 0.0
            speed[precision].append(statistics.median(m.seconds for m in result.history))
            print(f"seed {seed} {precision} on {result.run.device}: test accuracy {100 * acc[precision]:.2f}% "
                  f"(best epoch {result.best_epoch}), {speed[precision][-1]:.2f} s an epoch", flush=True)
        diffs.append(100 * (acc["bf16"] - acc["fp32"]))
    print(f"seconds an epoch, median: fp32 {statistics.median(speed['fp32']):.2f}, "
          f"bf16 {statistics.median(speed['bf16']):.2f}")
    print(f"bf16 - fp32 test accuracy: mean {statistics.mean(diffs):+.2f} points "
          f"(max |d| {max(abs(d) for d in diffs):.2f})")


if __name__ == "__main__":
    main()
