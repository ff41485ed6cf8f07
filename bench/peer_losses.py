"""What each loss costs per epoch, and what the stacked trainer's declining them costs.

On Fashion-MNIST (the 55,000 training images, FFNN, batch 128, one seed), for every loss
of the catalog (the paper's four and pytorch-metric-learning's seven):

* the seconds of one training epoch (``train_pass``), median of ``--repeats``, and its
  ratio to CCE's, measured in turns (each repeat runs every loss once) so that the
  machine's noise falls on all alike;
* for the pair-based losses, the seconds of the pass that recomputes the class means they
  predict with (every training representation, after each epoch).

Then what a sweep loses when the stacked trainer declines a loss: a two-member grid (the
size of ``corel reproduce --peers``' grids) of Gaussian-COREL lambdas trained as one
stacked run vs one after another, median seconds of an epoch each and their ratio. The
declined losses (ArcFace, CosFace, NormalizedSoftmax, ProxyAnchor, SupCon, Triplet,
MultiSimilarity) train their members the second way.

Run: ``.venv/bin/python bench/peer_losses.py [--repeats 3] [--subset N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from corel.data import load_dataset
from corel.loss_catalog import PAPER_LOSSES, PEER_LOSSES, declaration
from corel.spec import ExperimentSpec
from corel.train import StackedRun, represent, start_run, train_pass

LOSSES = PAPER_LOSSES + PEER_LOSSES


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--subset", type=int, default=None, help="only the first N training rows")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats, args.subset = 1, 512
    torch.set_num_threads(os.cpu_count() or 1)
    base = ExperimentSpec(dataset="fashion-mnist", epochs=1, seed=0, train_subset=args.subset)
    data = load_dataset(base)
    n = len(data.y_train)
    print(f"Fashion-MNIST, {n} training rows, FFNN, batch 128, {torch.get_num_threads()} threads, "
          f"{args.repeats} repeats")

    assert train_pass(start_run(base, data=data)) is not None  # warm-up, not timed
    epoch: dict[str, list[float]] = {loss: [] for loss in LOSSES}
    means: dict[str, list[float]] = {loss: [] for loss in LOSSES if not declaration(loss).class_vectors}
    for _ in range(args.repeats):
        for loss in LOSSES:
            run = start_run(base.model_copy(update={"loss": loss}), data=data)
            started = time.perf_counter()
            assert train_pass(run) is not None
            epoch[loss].append(time.perf_counter() - started)
            if loss in means:
                started = time.perf_counter()
                run.model.head.set_class_means(represent(run.model, data.x_train), data.y_train)
                means[loss].append(time.perf_counter() - started)

    cce = statistics.median(epoch["cce"])
    print(f"\n{'loss':<16} {'s/epoch':>8} {'x CCE':>6} {'class-mean pass s':>18}")
    for loss in LOSSES:
        med = statistics.median(epoch[loss])
        extra = f"{statistics.median(means[loss]):.3f}" if loss in means else "-"
        print(f"{loss:<16} {med:8.3f} {med / cce:6.2f} {extra:>18}")

    specs = [base.model_copy(update={"loss": "gaussian", "lam": lam}) for lam in (0.5, 0.85)]
    stacked, alone = [], []
    for _ in range(args.repeats):
        group = StackedRun.start(specs, data, device="cpu")
        started = time.perf_counter()
        assert group.train_pass() is not None
        stacked.append(time.perf_counter() - started)
        started = time.perf_counter()
        for spec in specs:
            assert train_pass(start_run(spec, data=data)) is not None
        alone.append(time.perf_counter() - started)
    s, a = statistics.median(stacked), statistics.median(alone)
    print(f"\ntwo-member grid, one epoch: stacked {s:.3f} s, one after another {a:.3f} s")
    print(f"declining to stack costs: {a / s:.2f}x the stacked time")


if __name__ == "__main__":
    main()
