"""Training throughput: corel's in-memory index batching vs a DataLoader loop.

Trains the paper's FFNN (Gaussian-COREL head) on Fashion-MNIST for one epoch
with ``corel.train.train_pass`` and with a plain
``DataLoader(TensorDataset(x, y), batch_size, shuffle=True)`` loop — same model,
loss, batch size, optimizer and torch thread count — alternating the two
``--repeats`` times in one run, and prints the median samples/s of each, the achieved
GFLOP/s of corel's step beside this machine's sgemm rate measured in the same run (once
per alternation, the median: on a shared machine it moves as much as the loops do), and
the two ratios (last two lines: ``fraction of sgemm: F`` and ``ratio corel / DataLoader:
X``; targets 0.5 and 1.5). Run: ``.venv/bin/python bench/train_throughput.py``.

``--device cuda`` runs both loops on a GPU: corel's with the data held there, the
DataLoader's with the data on the host, pinned and copied a batch at a time (the usual
GPU loop); the rate divided by is then the GPU's own float32 matrix product (TF32 off,
8192^3), and its bfloat16 rate is printed beside it. ``--precision bf16`` trains both
under bfloat16 autocast and divides by the bfloat16 rate.

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
from flops import (  # bench/flops.py, beside this file
    describe,
    sgemm_gflops,
    step_flops,
    synchronize,
)
from torch.utils.data import DataLoader, TensorDataset

from corel.cli import engine_options
from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.train import start_run, train_pass, train_step

# The engine's switches from COREL_CUDA_GRAPHS, COREL_NATIVE and COREL_NATIVE_DIR, as `corel train`
# reads them (bench/on_gpu.sh sets them).
OPTIONS = engine_options(os.environ)

def corel_epoch(spec: ExperimentSpec, data, device: str) -> float:
    run = start_run(spec, data=data, device=device, options=OPTIONS)
    synchronize(device)
    started = time.perf_counter()
    assert train_pass(run) is not None
    synchronize(device)
    return len(data.y_train) / (time.perf_counter() - started)


def dataloader_epoch(spec: ExperimentSpec, data, device: str) -> float:
    run = start_run(spec, data=data, device=device, options=OPTIONS)
    cuda = torch.device(device).type == "cuda"
    loader = DataLoader(
        TensorDataset(data.x_train, data.y_train),
        batch_size=spec.batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(spec.seed),
        pin_memory=cuda,
    )
    run.model.train()
    synchronize(device)
    started = time.perf_counter()
    for xb, yb in loader:
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        train_step(run.model, run.optimizer, xb, yb, precision=spec.precision)
    synchronize(device)
    return len(data.y_train) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loss", default="gaussian")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist"),
                        help="the images (default Fashion-MNIST, as the figures in the docs)")
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    gemm_size = {"repeats": 1, "n": 256} if args.smoke else {}
    if args.smoke:
        args.repeats = 1
    spec = ExperimentSpec(dataset=args.dataset, model="ffnn", loss=args.loss, lam=0.85, epochs=1,
                          precision=args.precision, train_subset=1024 if args.smoke else None)
    data = load_dataset(spec, args.data_dir)
    print(f"{args.dataset} FFNN ({args.loss}, {args.precision}), {len(data.y_train)} training samples, "
          f"batch {spec.batch_size}, torch {torch.__version__}, {describe(args.device)}")
    corel_epoch(spec, data, args.device)  # warm-up: kernels chosen, caches filled
    ours, theirs, gemms = [], [], []
    for _ in range(args.repeats):  # sgemm in each alternation too: on a shared machine it moves with them
        ours.append(corel_epoch(spec, data, args.device))
        theirs.append(dataloader_epoch(spec, data, args.device))
        gemms.append(sgemm_gflops(device=args.device, **gemm_size))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"corel train_pass      : median {a:9.0f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in ours)})")
    print(f"DataLoader(TensorDS)  : median {b:9.0f} samples/s  (runs: {', '.join(f'{v:.0f}' for v in theirs)})")
    flops = step_flops(start_run(spec, data=data, device="cpu", options=OPTIONS).model)
    fp32 = statistics.median(gemms)
    bf16 = sgemm_gflops(device=args.device, dtype=torch.bfloat16, **gemm_size) if args.device != "cpu" else None
    gemm = bf16 if (bf16 and args.precision == "bf16") else fp32
    achieved = a * flops / 1e9
    print(f"FFNN step: {flops / 1e3:.0f} kFLOP per sample (6 per weight); corel {achieved:.1f} GFLOP/s, "
          f"sgemm here {fp32:.1f} GFLOP/s (median; runs: {', '.join(f'{g:.1f}' for g in gemms)}; "
          f"{describe(args.device)})"
          + (f", bf16 matrix product {bf16:.1f} GFLOP/s" if bf16 else ""))
    print(f"fraction of sgemm: {achieved / gemm:.2f}")
    print(f"ratio corel / DataLoader: {a / b:.2f}")


if __name__ == "__main__":
    with OPTIONS.applied():
        main()
