"""The ``corel`` command line.

This module is the library's edge: unlike the rest of ``corel/`` it prints and
reads ``COREL_*`` environment variables. Service commands (``serve``, ``db``,
``worker``, and the HTTP clients) live in ``app.cli`` and join through the
``corel.commands`` entry point group; ``corel/`` never imports ``app``, so the
library commands work without the service extras.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from corel.encoder_catalog import DECLARATIONS as ENCODERS
from corel.geometry import GEOMETRIES
from corel.loss_catalog import OPTION_FIELDS, declaration, loss_names
from corel.spec import BUDGETS, DATASETS, MODELS, ExperimentSpec

if TYPE_CHECKING:
    from corel.train import EngineOptions

PRETRAINED = tuple(dict.fromkeys(d.name for d in ENCODERS.values() if d.pretrained and not d.custom))
"""The pretrained encoders installed with corel, as --encoder names them."""


def add_spec_options(p: argparse.ArgumentParser) -> None:
    fields = ExperimentSpec.model_fields
    p.add_argument("--dataset", required=True, choices=DATASETS, help=fields["dataset"].description)
    p.add_argument("--dataset-path", help=fields["dataset_path"].description)
    p.add_argument("--word-vectors", help=fields["word_vectors"].description)
    p.add_argument("--train-subset", type=int, help=fields["train_subset"].description)
    p.add_argument("--model", default="ffnn", choices=MODELS, help="encoder (default: ffnn)")
    p.add_argument("--loss", default="gaussian", choices=loss_names(),
                   help="loss (default: gaussian; their options: GET /losses or docs/losses.md)")
    p.add_argument("--lam", type=float, default=0.5, help=f"{fields['lam'].description} Default 0.5.")
    p.add_argument("--gamma", type=float, default=0.5, help=f"{fields['gamma'].description} Default 0.5.")
    p.add_argument("--learn-gamma", action="store_true", help=fields["learn_gamma"].description)
    p.add_argument("--alpha", type=float, default=0.25, help=f"{fields['alpha'].description} Default 0.25.")
    for option in OPTION_FIELDS:  # a loss's own: its default when left out
        p.add_argument(f"--{option.replace('_', '-')}", type=str if option == "miner" else float,
                       help=f"the loss's {option} (default: the loss's own)")
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layers (default 128)")
    p.add_argument("--encoder", help=f"{fields['encoder'].description} Installed with corel: "
                   f"{', '.join(PRETRAINED)}; your own: sentence-transformers or timm:<architecture> "
                   "with --encoder-path.")
    p.add_argument("--encoder-mode", choices=("frozen", "finetune"), help=fields["encoder_mode"].description)
    p.add_argument("--encoder-path", help=fields["encoder_path"].description)
    p.add_argument("--encoder-lr", type=float, help=fields["encoder_lr"].description)
    p.add_argument("--trainable-blocks", type=int, help=fields["trainable_blocks"].description)
    p.add_argument("--warmup", type=float, help=fields["warmup"].description)
    p.add_argument("--budget", choices=tuple(BUDGETS), help=fields["budget"].description)
    p.add_argument("--epochs", type=int, help="epochs (default: the budget's; without one 150, as in the paper)")
    p.add_argument("--batch-size", type=int, help="batch size (default: the budget's; without one 128)")
    p.add_argument("--lr", type=float, help="Adam learning rate (default: the budget's; without one 1e-4)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")


def spec_from_args(args: argparse.Namespace) -> ExperimentSpec:
    keys = [k for k in ExperimentSpec.model_fields if hasattr(args, k)]
    values: dict[str, Any] = {k: getattr(args, k) for k in keys}
    return ExperimentSpec.model_validate({k: v for k, v in values.items() if v is not None})


def build_parser() -> argparse.ArgumentParser:
    if entry_points(group="corel.losses"):
        # Plugins' losses register when corel.losses loads (their entry points), before
        # --loss's choices are read. Without any, torch stays unimported: the service's
        # commands (users, tokens, db, ...) start in a fraction of the time.
        import corel.losses  # noqa: F401
    parser = argparse.ArgumentParser(
        prog="corel",
        description="Clustering-oriented representation learning with attractive-repulsive loss.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = sub.add_parser(
        "train",
        help="train one model locally and report accuracy and clustering scores",
        description="Train one model with the paper's protocol (Adam, best-validation epoch) "
        "and print the best epoch, its test accuracy and the clustering scores of the "
        "test-set latent space.",
    )
    add_spec_options(train)
    train.add_argument(
        "--data-dir", default=os.environ.get("COREL_DATA_DIR"),
        help="directory holding datasets (default: $COREL_DATA_DIR, then system locations)",
    )
    train.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    train.add_argument("--checkpoint", help="write the best-validation checkpoint to this file")
    train.add_argument(
        "--metric", choices=GEOMETRIES,
        help="geometry for clustering (default: the loss's own, as its declaration has it)",
    )
    train.add_argument("--no-progress", action="store_true", help="do not draw progress bars")
    train.set_defaults(func=_train)

    few = sub.add_parser(
        "fewshot",
        help="few labels per class: every head on frozen features against a linear probe",
        description="The few-shot protocol (corel.fewshot) on a dataset's every row: per class half "
        "for evaluation and half the pool; for each N of --shots, --splits seeded draws of N pool "
        "rows per class; every method trains on a draw's rows alone and is scored on the same "
        "evaluation rows. Prints mean, sd, min and max accuracy per N and method, the paired "
        "difference against the best method and its p-value, and the seconds.",
    )
    fields = ExperimentSpec.model_fields
    few.add_argument("--dataset", required=True, choices=DATASETS, help=fields["dataset"].description)
    few.add_argument("--dataset-path", help=fields["dataset_path"].description)
    few.add_argument("--encoder", help=f"{fields['encoder'].description} Frozen (without one: the dataset's "
                     "inputs themselves, flattened).")
    few.add_argument("--encoder-path", help=fields["encoder_path"].description)
    few.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"),
                     help="directory holding datasets (default: $COREL_DATA_DIR, then system locations)")
    few.add_argument("--shots", default="8,16,64", help="examples per class, comma-separated (default 8,16,64)")
    few.add_argument("--splits", type=int, default=10, help="seeded draws per N, 1 to 100 (default 10)")
    few.add_argument("--seed", type=int, default=0, help="the draws' seed (default 0)")
    few.add_argument("--methods", help="comma-separated: probe, selftrain (the shots and the pool's other "
                     "rows, unlabeled) and loss names (default: the probe and every loss)")
    few.add_argument("--lr", type=float, default=1e-2, help="the heads' Adam learning rate (default 1e-2)")
    few.add_argument("--steps", type=int, default=100, help="the heads' full-batch steps (default 100)")
    few.add_argument("--layer", default="none", choices=("none", "linear"),
                     help="heads over the features (none) or a linear map of them from the identity")
    few.add_argument("--l2", type=float, default=1.0,
                     help="the probe's penalty on the dot-product and Gaussian heads' class vectors, "
                          "l2 |W|^2 / (2 n); 0 for none (default 1: scikit-learn's C = 1)")
    few.set_defaults(func=_fewshot)

    # Other packages add commands through the "corel.commands" entry point group: a
    # function that takes this parser's subparsers. The service registers serve, worker,
    # db, reproduce and watch that way; without its extra installed, its entry point
    # does not load and the library's commands stand alone.
    for entry in entry_points(group="corel.commands"):
        try:  # loading it, or registering, may import what a missing extra holds
            entry.load()(sub)
        except ImportError:
            continue
    if "serve" not in sub.choices:
        parser.epilog = (
            "The service's commands (serve, worker, db, reproduce, watch, ...) come with its "
            "extra, which is not installed here: pip install 'corel[service]' (from a checkout: "
            "pip install '.[service]').")
    return parser


def engine_options(environ: Mapping[str, str]) -> EngineOptions:
    """The training engine's switches from ``COREL_CUDA_GRAPHS`` (1, 0, eager), ``COREL_NATIVE``
    (on/off words) and ``COREL_NATIVE_DIR``, as the service's settings read them; the library
    itself reads no environment."""
    from corel.train import EngineOptions
    from corel.train.options import parse_cuda_graphs, parse_switch

    return EngineOptions(cuda_graphs=parse_cuda_graphs(environ.get("COREL_CUDA_GRAPHS", "")),
                         native=parse_switch(environ.get("COREL_NATIVE", ""), "COREL_NATIVE"),
                         native_dir=environ.get("COREL_NATIVE_DIR") or None)


def model_name(spec: ExperimentSpec) -> str:
    """How a run's model reads in a report: the paper's encoder, or the pretrained one and how
    it trains (``minilm (frozen) + ffnn``)."""
    if spec.encoder is None:
        return spec.model
    return f"{spec.encoder} ({spec.encoder_mode or 'frozen'}) + {spec.model}"


def _train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from corel.clustering import default_metric, evaluate_clustering
    from corel.train import Callback, EpochMetrics, RunView, checkpoint_to_bytes, fit, represent

    spec = spec_from_args(args)

    class Progress(Callback):
        def __init__(self, batches: int) -> None:
            self.batches = batches
            self.bar: Any = None

        def on_batch_end(self, step: int) -> None:
            if self.bar is None:
                self.bar = tqdm(total=self.batches, leave=True, disable=args.no_progress,
                                desc="epoch", unit="batch", file=sys.stderr)
            self.bar.update(1)

        def on_epoch_end(self, metrics: EpochMetrics, run: RunView) -> None:
            if self.bar is not None:
                self.bar.set_description(f"epoch {metrics.epoch}/{spec.epochs}")
                self.bar.set_postfix(loss=f"{metrics.train_loss:.4f}",
                                     train=f"{metrics.train_accuracy:.4f}",
                                     val=f"{metrics.val_accuracy:.4f}")
                self.bar.close()
                self.bar = None

    from corel.data import load_dataset

    data = load_dataset(spec, args.data_dir)
    progress = Progress(batches=-(-len(data.y_train) // spec.batch_size))
    result = fit(spec, [progress], data=data, device=args.device, options=engine_options(os.environ))
    metric = args.metric or default_metric(spec.loss)
    reps = represent(result.model, result.run.data.x_test).cpu()
    scores = evaluate_clustering(reps, data.y_test, metric=metric, seed=spec.seed)
    if args.checkpoint:
        with open(args.checkpoint, "wb") as fh:
            fh.write(checkpoint_to_bytes(result.run.best_checkpoint()))
    rows = [
        ("dataset / model / loss", f"{spec.dataset} / {model_name(spec)} / {spec.loss}"
         + (f" (lam={spec.lam})" if "lam" in declaration(spec.loss).params else "")),
        ("best epoch", f"{result.best_epoch} of {len(result.history)}"),
        ("validation accuracy", f"{result.best_val_accuracy:.4f}"),
        ("test accuracy", f"{result.test_accuracy:.4f}"),
    ]
    for algo, s in scores.items():
        sil = "n/a" if s["silhouette"] is None else f"{s['silhouette']:.4f}"
        rows.append((f"{algo} ({metric})",
                     f"acc {s['accuracy']:.4f}  ARI {s['ari']:.4f}  "
                     f"V {s['v_measure']:.4f}  silhouette {sil}"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _fewshot(args: argparse.Namespace) -> int:
    import torch

    from corel.data import load_dataset
    from corel.fewshot import HeadSettings, run_fewshot

    try:
        shots = [int(n) for n in args.shots.split(",") if n.strip()]
    except ValueError as exc:
        raise ValueError(f"--shots must be comma-separated integers; got {args.shots!r}") from exc
    values = {"dataset": args.dataset, "dataset_path": args.dataset_path, "encoder": args.encoder,
              "encoder_path": args.encoder_path}
    spec = ExperimentSpec.model_validate({k: v for k, v in values.items() if v is not None})
    data = load_dataset(spec, args.data_dir)
    x = torch.cat([data.x_train, data.x_val, data.x_test]).flatten(1)
    y = torch.cat([data.y_train, data.y_val, data.y_test])
    methods = [m for m in args.methods.split(",") if m] if args.methods else None
    print(f"{spec.dataset}: {len(y)} rows, {len(data.class_names)} classes, features of width {x.shape[1]}"
          f"{' (' + spec.encoder + ', frozen)' if spec.encoder else ''}")
    report = run_fewshot(x.float().numpy(), y.numpy(), methods=methods, shots=shots, splits=args.splits,
                         seed=args.seed, class_names=data.class_names,
                         settings=HeadSettings(lr=args.lr, steps=args.steps, layer=args.layer, l2=args.l2))
    print(report.table())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        # pydantic's ValidationError is a ValueError: a bad option is a usage error.
        print(f"corel: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
