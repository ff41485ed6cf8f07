"""Cosine-COREL's repulsion: the equation corel implements against the authors' code.

corel (the paper's equation): repulse = (max_{k != y} cos(h, w_k))^2, which also pushes a
negative best wrong cosine up towards 0. The authors' released CosineARLoss
(kiankd/corel2019, corel/loss_functions.py) takes the max over a row in which the own
class's entry is 0, so the repulsion is (max(0, max_{k != y} cos))^2: negative cosines
cost nothing. This trains both on MNIST FFNN, same data, seeds and init, and prints test
accuracy at the best-validation epoch, medians and the difference. Run from the
repository's root: ``COREL_DATA_DIR=../shared/datasets .venv/bin/python bench/cosine_repulsion.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from corel.data import load_dataset  # noqa: E402
from corel.losses import attractive_repulsive  # noqa: E402
from corel.spec import ExperimentSpec  # noqa: E402
from corel.train import run_epoch, start_run  # noqa: E402


def clamped_loss(self, sim, h, labels, *, check=True):  # the authors' CosineARLoss
    own = torch.nn.functional.one_hot(labels, sim.shape[1]).bool()
    attract = sim.gather(1, labels.unsqueeze(1)).squeeze(1)
    repulse = sim.masked_fill(own, 0.0).amax(dim=1).square()
    return (-self.lam * attract + (1.0 - self.lam) * repulse).mean()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dataset", default="mnist")
    ap.add_argument("--lam", type=float, default=0.4)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.epochs, args.seeds = 1, 1
    torch.set_num_threads(1)
    base = ExperimentSpec(dataset=args.dataset, model="ffnn", loss="cosine", lam=args.lam, epochs=args.epochs,
                          train_subset=1000 if args.smoke else None)
    data = load_dataset(base, os.environ.get("COREL_DATA_DIR"))
    # The equation's loss is corel's own: check the override differs only where it should.
    sim = torch.tensor([[0.9, -0.5, -0.2], [0.1, 0.8, 0.3]])
    labels = torch.tensor([0, 1])
    ours = attractive_repulsive(sim, labels, 0.5, "max_squared")
    theirs = clamped_loss(types.SimpleNamespace(lam=0.5), sim, None, labels)
    print(f"on a row whose wrong cosines are all negative: corel {ours:.4f}, authors' {theirs:.4f}")
    results: dict[str, list[float]] = {"corel (equation)": [], "authors' code (clamped)": []}
    for seed in range(args.seeds):
        for name in results:
            spec = base.model_copy(update={"seed": seed})
            run = start_run(spec, data=data)
            if name.startswith("authors"):
                run.model.head.loss = types.MethodType(clamped_loss, run.model.head)
            t = time.perf_counter()
            while run.epoch < spec.epochs:
                run_epoch(run)
            results[name].append(100 * float(run.test_accuracy))
            print(f"seed {seed} {name:24} test {results[name][-1]:.2f}  ({time.perf_counter() - t:.0f} s)",
                  flush=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    for name, values in results.items():
        print(f"{name:24} median {med[name]:.2f}  mean {statistics.fmean(values):.2f}  "
              f"over {len(values)} seeds")
    a, b = med.values()
    print(f"difference (corel - authors'): {a - b:+.2f} points; the paper's Table 1: 96.95 (MNIST FFNN)")


if __name__ == "__main__":
    main()
