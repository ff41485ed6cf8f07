"""Pruned sweeps: corel's synchronous successive halving inside the stack, against the tuners.

One grid, 3 losses x 3 lambdas x 3 seeds (27 members), the paper's FFNN on Fashion-MNIST,
``--epochs`` epochs (27), trained four ways in one run:

(a) corel, stacked, unpruned: ``corel.train.fit_sweep`` (a stacked group per loss, the
    groups in lockstep);
(b) corel, stacked, pruned: the same with ``prune={"eta": 3, "min_epochs": 2}`` on
    validation accuracy, judged across the three groups at each rung (2, 6, 18), seeds of a
    configuration judged by their mean and kept or dropped together;
(c) Ray Tune, ``ASHAScheduler`` (grace period 2, reduction factor 3, one bracket, max_t the
    epochs) on the same grid (``tune.grid_search``), reused actors, each trial corel's own
    single-run loop (``corel.train.fit``, so the per-epoch work is the same), run with each
    ``--ray-concurrency`` (``max_concurrent_trials``; the 2 cores split among the trials)
    and the fastest kept;
(d) Optuna, ``SuccessiveHalvingPruner`` (min resource 2, reduction factor 3) with a
    ``GridSampler`` over the same grid, one trial after another, the same trial function.

For each: wall time, member-epochs trained, and the best configuration (loss, lambda) by
its seeds' mean test accuracy (at each member's best validation epoch) among the members
trained to the last epoch. The last three lines are the issue's:
``pruned / unpruned wall: X`` (target at most 0.4), ``member-epochs pruned / unpruned: Y``
(target at most 1/3) and ``ratio corel pruned / ray tune asha: Z``: how many times faster
corel's pruned sweep finished than Ray Tune's ASHA (Ray's wall / corel's; target at least 3), against Ray's fastest concurrency whatever best it
found; the line before it says whether that run found corel's best, and the ratio against
the fastest Ray run that did.

Run: ``.venv/bin/python bench/pruned_sweep.py`` (needs the ``bench`` extra: ``ray[tune]``,
``optuna``; ``make install`` installs it). ``--train-subset N`` trains on N of the 55,000
training images, ``--eval-rows N`` evaluates on the first N validation and test rows (each epoch
evaluates every member on both: most of a small run's time); ``--smoke``: a few seconds per system on
512 images, 4 epochs, one seed, 1,000 validation and test rows (figures mean nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import tempfile
import time
import warnings
from collections import defaultdict
from typing import Any

import torch

from corel.data import Dataset, load_dataset
from corel.spec import ExperimentSpec
from corel.train import Callback, fit, fit_sweep

LOSSES = ("cce", "cosine", "gaussian")
LAMS = (0.1, 0.5, 0.9)
SEEDS = (0, 1, 2)
ETA, MIN_EPOCHS = 3, 2


def grid(args: argparse.Namespace) -> list[ExperimentSpec]:
    return [ExperimentSpec(dataset="fashion-mnist", loss=loss, lam=lam, seed=seed, epochs=args.epochs,
                           lr=args.lr, train_subset=args.train_subset)
            for loss in LOSSES for lam in LAMS for seed in SEEDS[:args.seeds]]


def seeds_of(specs: list[ExperimentSpec]) -> list[int]:
    return sorted({s.seed for s in specs})


def best_configuration(finished: list[tuple[str, float, float]]) -> tuple[tuple[str, float], float]:
    """``finished``: (loss, lam, test accuracy) of each member trained to the last epoch; the
    configuration with the highest mean over its seeds, and that mean."""
    by: dict[tuple[str, float], list[float]] = defaultdict(list)
    for loss, lam, acc in finished:
        by[(loss, lam)].append(acc)
    means = {c: statistics.fmean(v) for c, v in by.items()}
    best = max(sorted(means), key=lambda c: means[c])
    return best, means[best]


def label(config: tuple[str, float]) -> str:
    return f"{config[0]} lam {config[1]}"


def first_eval_rows(data: Dataset, n: int) -> Dataset:
    """``data`` with the first ``n`` rows of its validation and test splits: every system
    evaluates each epoch on both, which is most of a small run's time."""
    rows = None if data.rows is None else {**data.rows, "val": data.rows["val"][:n], "test": data.rows["test"][:n]}
    return dataclasses.replace(data, x_val=data.x_val[:n], y_val=data.y_val[:n], x_test=data.x_test[:n],
                               y_test=data.y_test[:n], rows=rows)


def corel_sweep(specs: list[ExperimentSpec], data: Dataset, prune: dict[str, Any] | None) -> dict[str, Any]:
    started = time.perf_counter()
    results = fit_sweep(specs, data=data, prune=prune, chance_epochs=0)
    wall = time.perf_counter() - started
    epochs = specs[0].epochs
    finished = [(r.spec.loss, r.spec.lam, r.test_accuracy or 0.0) for r in results
                if r.pruned is None and len(r.history) == epochs]
    best, acc = best_configuration(finished)
    rungs = sorted({r.pruned["rung"] for r in results if r.pruned})
    return {"wall": wall, "member_epochs": sum(len(r.history) for r in results), "best": best,
            "best_test": acc, "finished": len(finished), "rungs": rungs, "means": {
                c: statistics.fmean(a for lo, la, a in finished if (lo, la) == c)
                for c in {(lo, la) for lo, la, _ in finished}}}


class _Reports(Callback):
    """Hands each epoch's validation accuracy to a tuner (``report(epoch, val, best test)``);
    stops the run when the tuner says so."""

    def __init__(self, report):
        self.report, self.test = report, None

    def on_epoch_end(self, metrics, run):
        if metrics.test_accuracy is not None:
            self.test = metrics.test_accuracy
        return bool(self.report(metrics.epoch, metrics.val_accuracy, self.test))


def one_trial(config: dict[str, Any], data: Dataset, base: dict[str, Any], report) -> int:
    """corel's single-run loop on one grid point; the epochs it trained."""
    spec = ExperimentSpec(**base, loss=config["loss"], lam=config["lam"], seed=config["seed"])
    result = fit(spec, [_Reports(report)], data=data, chance_epochs=0)
    return len(result.history)


def ray_asha(specs: list[ExperimentSpec], data: Dataset, concurrency: int, threads: int) -> dict[str, Any]:
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # no progress tables between the figures
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    epochs = specs[0].epochs
    base = {"dataset": "fashion-mnist", "epochs": epochs, "lr": specs[0].lr,
            "train_subset": specs[0].train_subset}
    per_trial = max(1, threads // concurrency)

    def trainable(config: dict[str, Any], data: Dataset) -> None:
        torch.set_num_threads(per_trial)
        one_trial(config, data, base, lambda epoch, val, test: tune.report(
            {"val_accuracy": val, "test_accuracy": test, "epoch": epoch}))

    ray.init(num_cpus=threads, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, configure_logging=True)
    try:
        with tempfile.TemporaryDirectory() as storage:
            started = time.perf_counter()
            tuner = tune.Tuner(
                tune.with_resources(tune.with_parameters(trainable, data=data), {"cpu": threads / concurrency}),
                param_space={"loss": tune.grid_search(list(LOSSES)), "lam": tune.grid_search(list(LAMS)),
                             "seed": tune.grid_search(seeds_of(specs))},
                tune_config=tune.TuneConfig(
                    metric="val_accuracy", mode="max", max_concurrent_trials=concurrency, reuse_actors=True,
                    scheduler=ASHAScheduler(time_attr="training_iteration", max_t=epochs,
                                            grace_period=MIN_EPOCHS, reduction_factor=ETA, brackets=1)),
                run_config=tune.RunConfig(storage_path=storage, verbose=0),
            )
            grid_results = tuner.fit()
            wall = time.perf_counter() - started
    finally:
        ray.shutdown()
    finished, member_epochs = [], 0
    for k in range(len(grid_results)):
        result = grid_results[k]
        assert result.metrics is not None and result.config is not None, result.error
        trained = int(result.metrics["training_iteration"])
        member_epochs += trained
        if trained == epochs:
            finished.append((result.config["loss"], result.config["lam"], result.metrics["test_accuracy"]))
    best, acc = best_configuration(finished)
    return {"wall": wall, "member_epochs": member_epochs, "best": best, "best_test": acc,
            "finished": len(finished), "concurrency": concurrency}


def optuna_sha(specs: list[ExperimentSpec], data: Dataset, threads: int) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    epochs = specs[0].epochs
    base = {"dataset": "fashion-mnist", "epochs": epochs, "lr": specs[0].lr,
            "train_subset": specs[0].train_subset}
    torch.set_num_threads(threads)
    trained: dict[int, tuple[int, float | None]] = {}

    def objective(trial: optuna.Trial) -> float:
        config = {"loss": trial.suggest_categorical("loss", list(LOSSES)),
                  "lam": trial.suggest_categorical("lam", list(LAMS)),
                  "seed": trial.suggest_categorical("seed", seeds_of(specs))}
        seen: dict[str, Any] = {"val": 0.0}

        def report(epoch: int, val: float, test: float | None) -> bool:
            trial.report(val, epoch)
            seen.update(val=max(seen["val"], val), test=test)
            return trial.should_prune()

        n = one_trial(config, data, base, report)
        trained[trial.number] = (n, seen.get("test"))
        if n < epochs:
            raise optuna.TrialPruned()
        return seen["val"]

    sampler = optuna.samplers.GridSampler({"loss": list(LOSSES), "lam": list(LAMS), "seed": seeds_of(specs)}, seed=0)
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=MIN_EPOCHS, reduction_factor=ETA)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.optimize(objective, n_trials=len(specs))
    wall = time.perf_counter() - started
    finished = [(t.params["loss"], t.params["lam"], trained[t.number][1]) for t in study.trials
                if t.state == optuna.trial.TrialState.COMPLETE]
    best, acc = best_configuration(finished)  # type: ignore[arg-type]
    return {"wall": wall, "member_epochs": sum(n for n, _ in trained.values()), "best": best,
            "best_test": acc, "finished": len(finished)}


def show(name: str, r: dict[str, Any], members: int) -> None:
    print(f"{name:<34} wall {r['wall']:8.1f} s  member-epochs {r['member_epochs']:4d}  "
          f"finished {r['finished']:2d} of {members}  best {label(r['best'])} "
          f"(test {100 * r['best_test']:.2f} %)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="Adam's step (default 1e-3: the paper's 1e-4 needs its 150 epochs)")
    parser.add_argument("--train-subset", type=int, default=None,
                        help="train on N of the training images (default: all 55,000)")
    parser.add_argument("--ray-concurrency", default="1,2",
                        help="max_concurrent_trials values to run Ray Tune with; the fastest counts")
    parser.add_argument("--skip", default="", help="comma-separated: ray, optuna (not run)")
    parser.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR"))
    parser.add_argument("--seeds", type=int, default=len(SEEDS), choices=range(1, len(SEEDS) + 1),
                        help="seeds per configuration (default 3: 27 members)")
    parser.add_argument("--eval-rows", type=int, default=0,
                        help="the first N rows of the validation and test splits (0: all, the paper's)")
    parser.add_argument("--smoke", action="store_true",
                        help="512 images, 4 epochs, one seed, 1,000 validation and test rows, Ray one "
                             "trial at a time: that it runs (figures mean nothing)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.epochs, args.train_subset, args.ray_concurrency, args.seeds = 4, 512, "1", 1
        args.eval_rows = 1000
    threads = torch.get_num_threads()
    specs = grid(args)
    data = load_dataset(specs[0], args.data_dir)
    if args.eval_rows:
        data = first_eval_rows(data, args.eval_rows)
    skip = set(filter(None, args.skip.split(",")))
    print(f"Fashion-MNIST FFNN, {len(specs)} members ({len(LOSSES)} losses x lam {LAMS} x {args.seeds} seeds), "
          f"{len(data.y_train)} training images, {args.epochs} epochs, lr {args.lr}, batch "
          f"{specs[0].batch_size}, {threads} torch threads, torch {torch.__version__}; "
          f"halving: eta {ETA}, first rung at epoch {MIN_EPOCHS}")
    whole = corel_sweep(specs, data, None)
    show("corel stacked, unpruned", whole, len(specs))
    pruned = corel_sweep(specs, data, {"metric": "val_accuracy", "eta": ETA, "min_epochs": MIN_EPOCHS})
    show("corel stacked, pruned (eta 3)", pruned, len(specs))
    gap = 100 * (whole["best_test"] - whole["means"].get(pruned["best"], float("nan")))
    print(f"pruned best is the unpruned best: {'yes' if pruned['best'] == whole['best'] else 'no'} "
          f"({label(pruned['best'])}: {gap:.2f} points below the unpruned best in the unpruned sweep; "
          f"target at most 0.5; rungs at epochs {pruned['rungs']})")
    rays = []
    if "ray" not in skip:
        for k in (int(v) for v in args.ray_concurrency.split(",")):
            r = ray_asha(specs, data, k, threads)
            show(f"ray tune asha, {k} concurrent", r, len(specs))
            rays.append(r)
        torch.set_num_threads(threads)  # Ray's workers ran in other processes; this one is unchanged
    if "optuna" not in skip:
        show("optuna successive halving", optuna_sha(specs, data, threads), len(specs))
    if rays:
        ray = min(rays, key=lambda r: r["wall"])  # the ratio's peer: Ray's fastest, whatever it found
        print(f"ray tune asha's fastest ({ray['concurrency']} concurrent) found corel's unpruned best: "
              f"{'yes' if ray['best'] == whole['best'] else 'no'} ({label(ray['best'])})")
        same = [r for r in rays if r["best"] == whole["best"]]
        if same:
            first = min(same, key=lambda r: r["wall"])
            print(f"ratio corel pruned / ray tune asha's fastest run to the same best ({first['concurrency']} "
                  f"concurrent): {first['wall'] / pruned['wall']:.2f}")
        else:
            print("no ray tune asha run found corel's unpruned best")
    print(f"pruned / unpruned wall: {pruned['wall'] / whole['wall']:.3f}")
    print(f"member-epochs pruned / unpruned: {pruned['member_epochs'] / whole['member_epochs']:.3f}")
    if rays:
        print(f"ratio corel pruned / ray tune asha: {ray['wall'] / pruned['wall']:.2f}")


if __name__ == "__main__":
    main()
