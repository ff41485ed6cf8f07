"""Why a Gaussian-COREL run fails to train: its geometry, epoch by epoch.

Trains one spec with corel's own loop (``corel.train.start_run`` / ``run_epoch``)
and prints, after each epoch, on a fixed sample of training rows:

* |h| (mean norm of the representations) and |w_k| (mean norm of the class vectors);
* d_own = mean |h - w_y|^2 and d_other = mean over k != y of |h - w_k|^2;
* the attraction and repulsion terms of the loss, lam * gamma * d_own and
  (1 - lam) * logsumexp_k(-gamma d_k), as they enter the batch mean;
* the gradient norms of the encoder and of W on that sample; gamma; train/val accuracy.

    python bench/gaussian_diagnosis.py --dataset fashion-mnist --lam 0.15 --epochs 5
    python bench/gaussian_diagnosis.py --dataset ag-news --data-dir ../shared/datasets \
        --lam 0.85 --epochs 30 --lr 0.001 --batch-size 32
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from corel.cli import add_spec_options, spec_from_args
from corel.data import load_dataset
from corel.train import run_epoch, start_run

SAMPLE = 2048


def geometry(run, x: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    model = run.model
    head = model.head
    model.zero_grad(set_to_none=True)
    model.train()
    h = model.encoder(x)
    sim = head.similarities(h)
    loss = head.loss(sim, h, y)
    loss.backward()
    enc_grad = torch.sqrt(sum((p.grad.square().sum() for p in model.encoder.parameters()
                               if p.grad is not None), torch.zeros(())))
    w_grad = head.W.grad.norm() if head.W.grad is not None else torch.zeros(())
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        d = torch.cdist(h, head.W).square()
        own = d.gather(1, y[:, None]).squeeze(1)
        others = (d.sum(1) - own) / (d.shape[1] - 1)
        out = {
            "|h|": float(h.norm(dim=1).mean()),
            "|w|": float(head.W.norm(dim=1).mean()),
            "d_own": float(own.mean()),
            "d_other": float(others.mean()),
            "loss": float(loss),
            "grad_enc": float(enc_grad),
            "grad_W": float(w_grad),
        }
        lam = getattr(head, "lam", None)
        if head.name == "gaussian" and lam is not None:
            gamma = float(head.gamma)
            out["attract"] = float(lam * gamma * own.mean())
            out["repulse"] = float((1 - lam) * torch.logsumexp(sim, 1).mean())
            out["gamma"] = gamma
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_spec_options(p)
    p.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--smoke"]:  # tiny sizes, a few seconds: that the benchmark runs
        argv = ["--dataset", "digits", "--epochs", "2"]
    args = p.parse_args(argv)
    spec = spec_from_args(args)
    data = load_dataset(spec, args.data_dir)
    run = start_run(spec, data=data)
    g = torch.Generator().manual_seed(1)
    pick = torch.randperm(len(data.y_train), generator=g)[:SAMPLE]
    xs, ys = data.x_train[pick], data.y_train[pick]
    cols = ["epoch", "train", "val", "|h|", "|w|", "d_own", "d_other", "attract", "repulse",
            "loss", "grad_enc", "grad_W", "gamma"]
    print(f"# {spec.model_dump_json()}")
    print(" ".join(f"{c:>9}" for c in cols))

    def show(row: dict[str, float]) -> None:
        print(" ".join(f"{row.get(c, float('nan')):>9.4g}" for c in cols), flush=True)

    show({"epoch": 0, **geometry(run, xs, ys)})
    while run.epoch < spec.epochs:
        m = run_epoch(run)
        assert m is not None
        show({"epoch": m.epoch, "train": m.train_accuracy, "val": m.val_accuracy,
              **geometry(run, xs, ys)})
    print(f"# best epoch {run.best_epoch}: val {run.best_val_accuracy:.4f} test {run.test_accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
