"""The compiled step and nodes (corel.native) against the autograd step and the Python nodes.

Trains the paper's FFNN (Gaussian-COREL head) on Fashion-MNIST for one epoch with
``corel.train.train_pass`` three ways, alternated ``--repeats`` times in one process,
each from the same initial weights and order:

* ``step``: the whole step as one native call (:mod:`corel.train.native_step`), the default;
* ``nodes``: the autograd step over the compiled fused nodes (the native step hidden);
* ``python``: the autograd step over the Python nodes (the built module hidden, as
  ``COREL_NATIVE=0`` does);

then a 10-member lambda sweep (``StackedRun.train_pass``) with and without the stacked
native step. It prints the median samples/s of each, the ratios, and whether every way
ended on the same weights bit for bit (it must: each makes the same calls). Needs
``python -m corel.native build`` (``make install`` runs it).
Run: ``.venv/bin/python bench/native_nodes.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
from flops import describe  # bench/flops.py, beside this file

from corel import native, train
from corel.data import Dataset, load_dataset
from corel.spec import ExperimentSpec
from corel.train import steps

WAYS = ("step", "nodes", "python")


def _hidden(owner: Any, name: str, stack: ExitStack) -> None:
    """``owner.name`` returns None until the stack closes."""
    kept = getattr(owner, name)
    setattr(owner, name, lambda *args, **kwargs: None)
    stack.callback(setattr, owner, name, kept)


def solo(spec: ExperimentSpec, data: Dataset, way: str) -> tuple[float, dict[str, torch.Tensor]]:
    """(samples/s, the weights after the epoch) of one solo epoch the given way."""
    with ExitStack() as stack:
        if way != "step":
            _hidden(steps, "gaussian_mlp_step", stack)
        if way == "python":
            _hidden(native, "module", stack)
        run = train.start_run(spec, data=data, device="cpu")
        started = time.perf_counter()
        assert train.train_pass(run) is not None
        rate = len(data.y_train) / (time.perf_counter() - started)
    return rate, run.model.state_dict()


def group(specs: list[ExperimentSpec], data: Dataset, way: str) -> tuple[float, dict[str, torch.Tensor]]:
    """(model-samples/s, the stacked weights after the epoch) of one stacked epoch."""
    with ExitStack() as stack:
        if way != "step":
            _hidden(steps, "stacked_gaussian_mlp_step", stack)
        run = train.StackedRun.start(specs, data, device="cpu")
        run.train_pass()  # the first pass creates Adam's state; the second is timed
        started = time.perf_counter()
        assert run.train_pass() is not None
        rate = len(specs) * len(data.y_train) / (time.perf_counter() - started)
    return rate, {k: v.detach() for k, v in run.params.items()}


def alternate(repeats: int, ways: tuple[str, ...], one: Callable[[str], tuple[float, dict[str, torch.Tensor]]]
              ) -> tuple[dict[str, float], bool]:
    """Median rate of each way over ``repeats`` alternations, and whether they all ended
    on the same weights bit for bit each time."""
    rates: dict[str, list[float]] = {way: [] for way in ways}
    same = True
    for _ in range(repeats):
        weights = {}
        for way in ways:
            rate, weights[way] = one(way)
            rates[way].append(rate)
        first = weights[ways[0]]
        same = same and all(torch.equal(first[k], w[k]) for w in weights.values() for k in first)
    for way, values in rates.items():
        print(f"  {way:6s}: median {statistics.median(values):9.0f}  (runs: {', '.join(f'{v:.0f}' for v in values)})")
    return {way: statistics.median(values) for way, values in rates.items()}, same


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.repeats = 1
    if native.module() is None:
        raise SystemExit("corel.native is not built here: run `python -m corel.native build` first")
    spec = ExperimentSpec(dataset="fashion-mnist", model="ffnn", loss="gaussian", lam=0.85, epochs=1,
                          train_subset=1024 if args.smoke else None)
    data = load_dataset(spec, args.data_dir)
    print(f"Fashion-MNIST FFNN (gaussian, fp32), {len(data.y_train)} training samples, batch "
          f"{spec.batch_size}, torch {torch.__version__}, {describe('cpu')}")
    solo(spec, data, "step")  # warm-up
    print("solo epoch, samples/s:")
    rates, same = alternate(args.repeats, WAYS, lambda way: solo(spec, data, way))
    print(f"  same weights after each epoch, bit for bit: {'yes' if same else 'NO'}")
    specs = [spec.model_copy(update={"lam": lam / 10}) for lam in range(1, 11)][:2 if args.smoke else 10]
    print(f"{len(specs)}-member stacked epoch (lam {specs[0].lam}..{specs[-1].lam}), model-samples/s:")
    stacks, stacks_same = alternate(args.repeats, WAYS[:2], lambda way: group(specs, data, way))
    print(f"  same weights after each epoch, bit for bit: {'yes' if stacks_same else 'NO'}")
    print(f"ratio native step / autograd step over compiled nodes: {rates['step'] / rates['nodes']:.2f}")
    print(f"ratio compiled nodes / Python nodes: {rates['nodes'] / rates['python']:.2f}")
    print(f"ratio stacked native step / stacked autograd step: {stacks['step'] / stacks['nodes']:.2f}")


if __name__ == "__main__":
    main()
