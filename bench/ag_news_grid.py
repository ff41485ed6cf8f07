"""Every loss at every lambda on AG News (FFNN): test accuracy, or the guard's verdict.

The acceptance grid of the Gaussian-COREL fix: each run either reaches at least 80% of
CCE's test accuracy or is flagged as failed to train (NotLearningError).

    python bench/ag_news_grid.py --data-dir ../shared/datasets --lr 0.001 --batch-size 32 --epochs 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corel.data import load_dataset
from corel.spec import ExperimentSpec
from corel.train import NotLearningError, fit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--lambdas", default="0.3,0.5,0.7,0.85")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: that the benchmark runs (its figures mean nothing)")
    args = p.parse_args(argv)
    smoke = {"train_subset": 512} if args.smoke else {}
    if args.smoke:
        args.epochs, args.lambdas, args.seeds = 1, "0.5", 1
    base = {"dataset": "ag-news", "model": "ffnn", "lr": args.lr, "batch_size": args.batch_size,
            "epochs": args.epochs, **smoke}
    data = load_dataset(ExperimentSpec(**base, loss="cce"), args.data_dir)
    lams = [float(x) for x in args.lambdas.split(",")]
    runs = [("cce", None)] + [(loss, lam) for loss in ("center", "cosine", "gaussian") for lam in lams]
    print(f"# AG News FFNN{', smoke' if args.smoke else ''}, lr {args.lr:g}, batch {args.batch_size}, {args.epochs} epochs, "
          f"{args.seeds} seed(s)")
    print("| loss | lambda | seed | test acc | of CCE | best epoch | outcome | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    cce: dict[int, float] = {}
    for seed in range(args.seeds):
        for loss, lam in runs:
            spec = ExperimentSpec(**base, loss=loss, seed=seed, **({} if lam is None else {"lam": lam}))
            started = time.perf_counter()
            try:
                result = fit(spec, data=data)
            except NotLearningError as exc:
                outcome, acc, best = f"failed: {str(exc)[:90]}...", None, "-"
            else:
                acc, best, outcome = result.test_accuracy, str(result.best_epoch), "trained"
            seconds = time.perf_counter() - started
            if loss == "cce" and acc is not None:
                cce[seed] = acc
            share = f"{acc / cce[seed]:.2f}" if acc is not None and seed in cce else "-"
            shown = "-" if acc is None else f"{100 * acc:.2f}"
            print(f"| {loss} | {lam if lam is not None else '-'} | {seed} | {shown} | {share} "
                  f"| {best} | {outcome} | {seconds:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
