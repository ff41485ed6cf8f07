"""Sweep throughput: a lambda sweep trained stacked vs one run after another.

Trains ten Gaussian-COREL FFNNs on Fashion-MNIST (the 55,000 training images,
batch 128, lam = 0.1, 0.2, ..., 1.0, one seed) for one epoch

(a) together, as one ``corel.train.StackedRun`` (``train_pass``), and
(b) one after another with corel's single-run loop (``start_run`` + ``train_pass``),

alternating the two ``--repeats`` times in one run, and prints the median
model-samples/s of each (members x samples / seconds) and their ratio. It also
prints how far each stacked member ended from its solo run. Expect ~1e-7 for
most lambdas; at small lam this training amplifies rounding (a solo run whose
first layer is nudged by one ulp drifts ~1e-3 away in one epoch), and stacked
matrix products round differently from single ones.
Run: ``.venv/bin/python bench/sweep_throughput.py`` (``--device cuda`` on a GPU, whose own
float32 matrix-product rate is then the one divided by). ``--seeds K`` trains every lambda
with K seeds (``--members`` lambdas x K seeds, one group: each seed draws its own batches);
``--model cnn`` the paper's CNN, whose step is mostly convolutions (no fraction of sgemm
then), e.g. the CNN rows' shape: ``--model cnn --members 1 --seeds 3 --train-subset 12800``.
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

from corel.cli import engine_options
from corel.data import Dataset, load_dataset
from corel.spec import ExperimentSpec
from corel.train import StackedRun, start_run, train_pass

# The engine's switches from COREL_CUDA_GRAPHS, COREL_NATIVE and COREL_NATIVE_DIR, as `corel train`
# reads them (bench/on_gpu.sh sets them).
OPTIONS = engine_options(os.environ)

def stacked_epoch(specs: list[ExperimentSpec], data: Dataset, device: str) -> tuple[float, list[dict]]:
    group = StackedRun.start(specs, data, device=device, options=OPTIONS)
    synchronize(device)
    started = time.perf_counter()
    assert group.train_pass() is not None
    synchronize(device)
    seconds = time.perf_counter() - started
    return len(specs) * len(data.y_train) / seconds, [
        group.member_state(i) for i in range(len(specs))
    ]


def sequential_epochs(specs: list[ExperimentSpec], data: Dataset, device: str) -> tuple[float, list[dict]]:
    seconds, states = 0.0, []
    for spec in specs:
        run = start_run(spec, data=data, device=device, options=OPTIONS)
        synchronize(device)
        started = time.perf_counter()
        assert train_pass(run) is not None
        synchronize(device)
        seconds += time.perf_counter() - started
        states.append({k: v.detach().clone() for k, v in run.model.state_dict().items()})
    return len(specs) * len(data.y_train) / seconds, states


def differences(a: list[dict], b: list[dict]) -> list[float]:
    """Largest absolute weight difference of each member, stacked vs solo."""
    return [
        max(float((x[k].double().cpu() - y[k].double().cpu()).abs().max()) for k in x)
        for x, y in zip(a, b, strict=True)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loss", default="gaussian")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per lambda (default 1)")
    parser.add_argument("--model", default="ffnn", choices=["ffnn", "cnn"])
    parser.add_argument("--train-subset", type=int, default=None,
                        help="train on N of the training images (the spec's train_subset; default: all)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "mnist"),
                        help="the images (default Fashion-MNIST, as the figures in the docs)")
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = parser.parse_args(argv)
    gemm_size = {}
    if args.smoke:
        args.members, args.repeats, args.train_subset = 2, 1, 512
        gemm_size = {"repeats": 1, "n": 256}
    if args.threads:
        torch.set_num_threads(args.threads)
    lams = [round((i + 1) / args.members, 4) for i in range(args.members)]
    specs = [
        ExperimentSpec(dataset=args.dataset, model=args.model, loss=args.loss, lam=lam,
                       seed=seed, epochs=1, train_subset=args.train_subset)
        for seed in range(args.seeds) for lam in lams
    ]
    data = load_dataset(specs[0], args.data_dir)
    print(
        f"{args.dataset} {args.model.upper()} ({args.loss}), {len(specs)} members (lam "
        f"{lams[0]}..{lams[-1]} x {args.seeds} seed(s)), {len(data.y_train)} training samples, "
        f"batch {specs[0].batch_size}, torch {torch.__version__}, {describe(args.device)}"
    )
    stacked_epoch(specs, data, args.device)  # warm-up: kernels chosen, caches filled
    stacked, sequential, gemms, largest = [], [], [], [0.0] * len(specs)
    for _ in range(args.repeats):  # sgemm in each alternation too: on a shared machine it moves with them
        if args.model == "ffnn":
            gemms.append(sgemm_gflops(device=args.device, **gemm_size))
        rate, stacked_states = stacked_epoch(specs, data, args.device)
        stacked.append(rate)
        rate, solo_states = sequential_epochs(specs, data, args.device)
        sequential.append(rate)
        diffs = differences(stacked_states, solo_states)
        largest = [max(a, b) for a, b in zip(largest, diffs, strict=True)]
    a, b = statistics.median(stacked), statistics.median(sequential)
    print(
        f"stacked (StackedRun)      : median {a:9.0f} model-samples/s  "
        f"(runs: {', '.join(f'{v:.0f}' for v in stacked)})"
    )
    print(
        f"sequential (train_pass)   : median {b:9.0f} model-samples/s  "
        f"(runs: {', '.join(f'{v:.0f}' for v in sequential)})"
    )
    if args.model == "ffnn":  # 6 FLOPs per weight counts a CNN's convolutions wrong
        flops = step_flops(start_run(specs[0], data=data, device="cpu", options=OPTIONS).model)
        gemm = statistics.median(gemms)
        print(f"stacked step: {a * flops / 1e9:.1f} GFLOP/s of model arithmetic (6 per weight), "
              f"sgemm here {gemm:.1f} GFLOP/s (median; runs: {', '.join(f'{g:.1f}' for g in gemms)})")
        print(f"stacked fraction of sgemm: {a * flops / 1e9 / gemm:.2f} (target >= 0.8)")
    print(f"ratio stacked / sequential: {a / b:.2f}x (target >= 2x)")
    print(
        "largest weight difference stacked vs solo after one epoch, per member: "
        + ", ".join(f"lam {s.lam} seed {s.seed}: {d:.2g}" for s, d in zip(specs, largest, strict=True))
    )


if __name__ == "__main__":
    with OPTIONS.applied():
        main()
