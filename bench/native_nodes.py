"""The compiled fused nodes (corel.native) against their Python twins, in one process.

Trains the paper's FFNN (Gaussian-COREL head) on Fashion-MNIST for one epoch with
``corel.training.train_pass``, alternating the two implementations of the fused nodes
``--repeats`` times (the Python one by hiding the built module, as ``COREL_NATIVE=0``
does), each from the same initial weights and order, and prints the median samples/s of
each, the ratio, and whether the two epochs ended on the same weights bit for bit (they
must: the nodes make the same calls). Needs ``python -m corel.native build`` (``make
install`` runs it). Run: ``.venv/bin/python bench/native_nodes.py [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from flops import describe  # bench/flops.py, beside this file

from corel import native
from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.training import start_run, train_pass


def epoch(spec: ExperimentSpec, data, compiled: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """(samples/s, the weights after the epoch) with or without the compiled nodes."""
    built = native.module
    if not compiled:
        native.module = lambda: None  # type: ignore[assignment]
    try:
        run = start_run(spec, data=data, device="cpu")
        started = time.perf_counter()
        assert train_pass(run) is not None
        rate = len(data.y_train) / (time.perf_counter() - started)
    finally:
        native.module = built  # type: ignore[assignment]
    return rate, run.model.state_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    args = parser.parse_args()
    if native.module() is None:
        raise SystemExit("corel.native is not built here: run `python -m corel.native build` first")
    spec = ExperimentSpec(dataset="fashion-mnist", model="ffnn", loss="gaussian", lam=0.85, epochs=1)
    data = load_dataset(spec, args.data_dir)
    print(f"Fashion-MNIST FFNN (gaussian, fp32), {len(data.y_train)} training samples, batch "
          f"{spec.batch_size}, torch {torch.__version__}, {describe('cpu')}")
    epoch(spec, data, True)  # warm-up
    compiled, python, same = [], [], True
    for _ in range(args.repeats):
        a, weights_a = epoch(spec, data, True)
        b, weights_b = epoch(spec, data, False)
        compiled.append(a)
        python.append(b)
        same = same and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    a, b = statistics.median(compiled), statistics.median(python)
    print(f"compiled nodes (corel.native): median {a:9.0f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in compiled)})")
    print(f"Python nodes (corel.fused)   : median {b:9.0f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in python)})")
    print(f"same weights after each epoch, bit for bit: {'yes' if same else 'NO'}")
    print(f"ratio compiled / Python: {a / b:.2f}")


if __name__ == "__main__":
    main()
