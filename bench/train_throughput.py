"""Training throughput: corel's in-memory index batching vs a DataLoader loop.

Trains the paper's FFNN (Gaussian-COREL head) on Fashion-MNIST for one epoch
with ``corel.training.train_pass`` and with a plain
``DataLoader(TensorDataset(x, y), batch_size, shuffle=True)`` loop — same model,
loss, batch size, optimizer and torch thread count — alternating the two
``--repeats`` times in one run, and prints the median samples/s of each, the achieved
GFLOP/s of corel's step beside this machine's sgemm rate measured in the same run, and
the two ratios (last two lines: ``fraction of sgemm: F`` and ``ratio corel / DataLoader:
X``; targets 0.5 and 1.5). Run: ``.venv/bin/python bench/train_throughput.py``.

Both loops take the same optimizer steps on the same model; what differs is the
loop around them. The DataLoader loop fetches 128 samples one by one and collates
them, and steps with ``train_step``, which validates each batch's labels and reads
the loss and accuracy back every step. ``train_pass`` gathers a batch with one
``index_select``, validates the labels once a pass, and keeps its sums on the device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from flops import sgemm_gflops, step_flops  # bench/flops.py, beside this file
from torch.utils.data import DataLoader, TensorDataset

from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.training import start_run, train_pass, train_step


def corel_epoch(spec: ExperimentSpec, data) -> float:
    run = start_run(spec, data=data, device="cpu")
    started = time.perf_counter()
    assert train_pass(run) is not None
    return len(data.y_train) / (time.perf_counter() - started)


def dataloader_epoch(spec: ExperimentSpec, data) -> float:
    run = start_run(spec, data=data, device="cpu")
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=spec.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(spec.seed),
    )
    run.model.train()
    started = time.perf_counter()
    for xb, yb in loader:
        train_step(run.model, run.optimizer, xb, yb)
    return len(data.y_train) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loss", default="gaussian")
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    args = parser.parse_args()
    spec = ExperimentSpec(dataset="fashion-mnist", model="ffnn", loss=args.loss, lam=0.85, epochs=1)
    data = load_dataset(spec, args.data_dir)
    print(f"Fashion-MNIST FFNN ({args.loss}), {len(data.y_train)} training samples, "
          f"batch {spec.batch_size}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    ours, theirs = [], []
    for _ in range(args.repeats):
        ours.append(corel_epoch(spec, data))
        theirs.append(dataloader_epoch(spec, data))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"corel train_pass      : median {a:9.0f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in ours)})")
    print(f"DataLoader(TensorDS)  : median {b:9.0f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in theirs)})")
    flops = step_flops(start_run(spec, data=data, device="cpu").model)
    gemm = sgemm_gflops()
    achieved = a * flops / 1e9
    print(f"FFNN step: {flops / 1e3:.0f} kFLOP per sample (6 per weight); corel {achieved:.1f} GFLOP/s, "
          f"sgemm here {gemm:.1f} GFLOP/s ({torch.get_num_threads()} threads)")
    print(f"fraction of sgemm: {achieved / gemm:.2f}")
    print(f"ratio corel / DataLoader: {a / b:.2f}")


if __name__ == "__main__":
    main()
