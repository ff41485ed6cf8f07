"""What each loss costs per epoch, and what stacking a sweep's members of it gains.

On Fashion-MNIST (the 55,000 training images, FFNN, batch 128, one seed), for every loss
of the catalog (the paper's four and pytorch-metric-learning's seven):

* the seconds of one training epoch (``train_pass``), median of ``--repeats``, and its
  ratio to CCE's, measured in turns (each repeat runs every loss once) so that the
  machine's noise falls on all alike;
* for the pair-based losses, the seconds of the pass that recomputes the class means they
  predict with (every training representation, after each epoch).

Then, per loss, a two-member grid (the size of ``corel reproduce --peers``' grids: the
loss's tuning grid, two seeds for CCE) trained as one stacked run vs one after another:
median seconds of an epoch each (the pair-based losses' class-mean pass included, as the
trainers run it) and their ratio. Every loss stacks since issue 70 (before, the seven
pytorch-metric-learning losses trained their members one after another). Last, the seven
peers as a sweep has them, 2 option values x 3 seeds each, stacked against one by one
(``peer losses stacked (3 seeds x 2 option values) against one by one: R``).

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
from corel.train import Run, StackedRun, represent, start_run, train_pass

LOSSES = PAPER_LOSSES + PEER_LOSSES


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--subset", type=int, default=None, help="only the first N training rows")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.repeats, args.subset = 1, 512
    # Every core, unless the environment says how many (make test's smoke run, beside a busy
    # process: one).
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
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

    stacked: dict[str, list[float]] = {loss: [] for loss in LOSSES}
    alone: dict[str, list[float]] = {loss: [] for loss in LOSSES}
    for _ in range(args.repeats):
        for loss in LOSSES:
            specs = grid(base.model_copy(update={"loss": loss}))
            group = StackedRun.start(specs, data, device="cpu")
            started = time.perf_counter()
            assert group.train_pass() is not None
            if group.uses_class_means:
                group.set_class_means()
            stacked[loss].append(time.perf_counter() - started)
            runs = [start_run(spec, data=data) for spec in specs]
            started = time.perf_counter()
            for run in runs:
                assert train_pass(run) is not None
                class_mean_pass(run)
            alone[loss].append(time.perf_counter() - started)
    print(f"\n{'two-member grid':<16} {'stacked s':>9} {'alone s':>8} {'gain':>6}")
    gains = []
    for loss in LOSSES:
        s, a = statistics.median(stacked[loss]), statistics.median(alone[loss])
        gains.append(a / s)
        print(f"{loss:<16} {s:9.3f} {a:8.3f} {a / s:5.2f}x")
    print(f"stacking a two-member grid: median {statistics.median(gains):.2f}x the speed of one after "
          f"another over {len(LOSSES)} losses (peers alone: "
          f"{statistics.median(gains[len(PAPER_LOSSES):]):.2f}x)")

    # The seven peers as a sweep has them: 2 option values x 3 seeds a loss, six members,
    # each loss's members stacked against the same members one by one, in turns.
    grids = {loss: [s.model_copy(update={"seed": seed}) for s in grid(base.model_copy(update={"loss": loss}))
                    for seed in (0, 1, 2)] for loss in PEER_LOSSES}
    sweep_stacked, sweep_alone = [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for specs in grids.values():
            group = StackedRun.start(specs, data, device="cpu")
            assert group.train_pass() is not None
            if group.uses_class_means:
                group.set_class_means()
        sweep_stacked.append(time.perf_counter() - started)
        started = time.perf_counter()
        for specs in grids.values():
            for spec in specs:
                run = start_run(spec, data=data)
                assert train_pass(run) is not None
                class_mean_pass(run)
        sweep_alone.append(time.perf_counter() - started)
    s, a = statistics.median(sweep_stacked), statistics.median(sweep_alone)
    print(f"\nthe seven peer losses, 2 option values x 3 seeds each (42 members), one epoch: stacked "
          f"{s:.2f} s, one by one {a:.2f} s")
    print(f"peer losses stacked (3 seeds x 2 option values) against one by one: {a / s:.2f}x")


def grid(spec: ExperimentSpec) -> list[ExperimentSpec]:
    """The loss's two-member tuning grid (its declaration's first grid field), or two seeds."""
    decl = declaration(spec.loss)
    if not decl.grid:
        return [spec.model_copy(update={"seed": seed}) for seed in (0, 1)]
    field, values = next(iter(decl.grid.items()))
    return [spec.model_copy(update={field: value}) for value in values[:2]]


def class_mean_pass(run: Run) -> None:
    """What the solo loop does after a pair-based loss's epoch: the class means."""
    if run.model.head.uses_class_means:
        run.model.head.set_class_means(represent(run.model, run.data.x_train), run.data.y_train)


if __name__ == "__main__":
    main()
