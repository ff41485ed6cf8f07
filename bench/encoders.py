"""COREL heads on a frozen pretrained encoder (all-MiniLM-L6-v2) against the encoder alone,
and the feature cache's worth, in one run on AG News (the shared test split in
``../shared/datasets``, split by corel's own 70/15/15 seed; queries: the test rows,
reference: the training rows).

1. The frozen encoder alone: MAP@R and precision@1 of its 384-d vectors (cosine), and a
   logistic regression's test accuracy on them.
2. Every loss of the catalog as a head on it (the paper's two hidden layers, then the loss's
   head), ``--seeds`` seeds each, trained as one sweep (``corel.train.fit_sweep``): the
   features computed once, the members of each loss as one stacked group, the groups in
   lockstep over the same batches (:mod:`corel.train.lockstep`); per loss the test
   accuracy, MAP@R of the head's representation and K-Means accuracy on it, mean +- std over
   the seeds, with paired t-tests (by seed) of MAP@R against Cosine- and Gaussian-COREL; and
   the wall time of the whole sweep, the embedding pass included; then ``<encoder> head sweep
   floor seconds``: what the sweep's FFNNs' matrix products alone take on this CPU (every
   member's forward and backward products over every training batch of every epoch, as the
   stacked groups form them, timed over 30 steps), under which no loop can go.
3. The same sweep as eleven separate experiments without the feature cache (each embeds the
   data again, then trains its seeds one after another): ``--baseline K`` runs the first K
   of them for real (default: all eleven) and counts any others at the median of those run,
   saying so; the ratio of the two wall times.

4. For images, each of ``--image-encoders`` (EfficientNet-Lite0 at 96 pixels, -Lite2 at 128)
   frozen on a fixed Fashion-MNIST subset (``--images N`` training images, a quarter as many
   validation and test images): raw pixels and the encoder alone, then every loss's head, as
   for the texts (Lite0's ``image frozen head MAP@R``, ``image head sweep seconds``).

Each of ``--text-encoders`` (MiniLM, then WordLlama: static token embeddings) gets the
sweep of 2.; the first also the separate experiments of 3. A table then gives each
encoder's row: features per second, the encoder alone, the best head, the sweep's seconds;
and ``ratio wordllama / minilm texts/s``.

Its last lines read ``frozen head MAP@R: X`` (the best text head's mean), ``head sweep
seconds: S`` and ``head sweep warm seconds: W`` (the first encoder's sweep again, in a fresh
feature memory, its features read from the store the first sweep put them in: a
:class:`corel.encoders.kept.FolderStore`), then ``head sweep warm seconds, each loss's group
in turn`` (the warm sweep again with each group taking its own passes) and their ratio. ``--smoke``: the first 150 rows as a text table, 40 images, one seed, two
epochs, one separate experiment (a few seconds beyond the encoders' load).

Run: ``.venv/bin/python bench/encoders.py [--data-dir ../shared/datasets] [--seeds 3]
[--epochs 40] [--baseline 11]``. Needs the encoders extra (``pip install -e '.[encoders]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats
from sklearn.linear_model import LogisticRegression

from corel.clustering import cluster
from corel.data import load_dataset
from corel.encoders import features, model_inputs, run_preprocessing
from corel.encoders.kept import FolderStore
from corel.encoders.record import EncoderRecord
from corel.loss_catalog import LOSS_NAMES, declaration
from corel.retrieval import retrieval_metrics
from corel.spec import ExperimentSpec
from corel.train import EngineOptions, FitResult, NotLearningError, fit, fit_sweep, represent

REFERENCES = ("cosine", "gaussian")


def forget_features() -> None:
    """This process's feature memory emptied: the next load embeds again."""
    features.clear()


def smoke_table(data_dir: Path, rows: int) -> Path:
    """The first ``rows`` AG News rows as a text table (corel.tables' .npz format)."""
    names = ["World", "Sports", "Business", "Sci/Tech"]
    with open(data_dir / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        read = list(csv.reader(fh))[:rows]
    path = Path(tempfile.mkdtemp()) / "ag-news-head.npz"
    np.savez(path, texts=np.array([f"{r[1]} {r[2]}" for r in read]),
             y=np.array([int(r[0]) - 1 for r in read]), class_names=np.array(names))
    return path


def scores(result: FitResult, data: Any) -> dict[str, float]:
    geometry = declaration(result.spec.loss).geometry
    h_train = represent(result.model, data.x_train).cpu()
    h_test = represent(result.model, data.x_test).cpu()
    retrieval = retrieval_metrics(h_test, data.y_test, h_train, data.y_train, geometry)
    kmeans = cluster(h_test, data.y_test, metric=geometry, seed=result.spec.seed)
    return {"test_accuracy": float(result.test_accuracy or float("nan")),
            "map_at_r": retrieval["mean_average_precision_at_r"], "kmeans": kmeans["accuracy"]}


def train(specs: list[ExperimentSpec], data: Any, chance_epochs: int, lockstep: bool = True) -> list[FitResult | None]:
    """Every spec, as one sweep (``corel.train.fit_sweep``): the members of each loss as one
    stacked group, the groups in lockstep over the same batches (``lockstep``; else each
    group's pass in turn); None for a run the not-learning guard stopped (its reason printed)."""
    results = fit_sweep(specs, data=data, chance_epochs=chance_epochs, options=EngineOptions(lockstep=lockstep))
    out: list[FitResult | None] = []
    for spec, result in zip(specs, results, strict=True):
        out.append(result if result.failed is None else None)
        if result.failed:
            print(f"  {spec.loss} seed {spec.seed} did not learn: {result.failed}")
    return out


def mean_std(values: list[float]) -> str:
    if not values:
        return "failed"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):5.1f} +- {100 * sd:4.1f}"


def alone(data: Any) -> str:
    """The inputs alone (the frozen features, or pixels flattened): MAP@R and precision@1
    (cosine), logistic regression."""
    x_train, x_test = data.x_train.flatten(1), data.x_test.flatten(1)
    found = retrieval_metrics(x_test, data.y_test, x_train, data.y_train, "cosine")
    logreg = LogisticRegression(max_iter=2000).fit(x_train.numpy(), data.y_train.numpy())
    accuracy = float(logreg.score(x_test.numpy(), data.y_test.numpy()))
    return (f"MAP@R {found['mean_average_precision_at_r']:.3f}, precision@1 {found['precision_at_1']:.3f}, "
            f"logistic regression {100 * accuracy:.1f} %")


def report(specs: list[ExperimentSpec], results: list[FitResult | None], data: Any) -> tuple[float, str]:
    """Every loss's row (mean +- std over seeds, paired t-tests of MAP@R against both COREL
    losses); returns the best head's mean MAP@R and its loss."""
    per_loss: dict[str, list[dict[str, float]]] = {loss: [] for loss in LOSS_NAMES}
    by_seed: dict[str, dict[int, float]] = {loss: {} for loss in LOSS_NAMES}
    for spec, result in zip(specs, results, strict=True):
        if result is not None:
            s = scores(result, data)
            per_loss[spec.loss].append(s)
            by_seed[spec.loss][spec.seed] = s["map_at_r"]
    print(f"{'loss':<16}{'test accuracy %':>18}{'MAP@R %':>18}{'K-Means acc %':>18}"
          f"{'p vs Cosine':>13}{'p vs Gaussian':>15}")
    best = (0.0, "")
    for loss, rows in per_loss.items():
        cells = [mean_std([r[k] for r in rows]) for k in ("test_accuracy", "map_at_r", "kmeans")]
        tests = []
        for ref in REFERENCES:
            seeds = sorted(set(by_seed[loss]) & set(by_seed[ref]))
            if loss == ref or len(seeds) < 2:
                tests.append("-")
            else:
                p = stats.ttest_rel([by_seed[loss][s] for s in seeds], [by_seed[ref][s] for s in seeds]).pvalue
                tests.append("-" if np.isnan(p) else f"{p:.3f}")
        print(f"{declaration(loss).short:<16}{cells[0]:>18}{cells[1]:>18}{cells[2]:>18}{tests[0]:>13}{tests[1]:>15}")
        if rows:
            best = max(best, (statistics.mean(r["map_at_r"] for r in rows), loss))
    print(f"best head: {declaration(best[1]).short if best[1] else '-'}")
    return best


def sweep_specs(base: dict[str, Any], seeds: int, lam: float) -> list[ExperimentSpec]:
    return [ExperimentSpec(**base, loss=loss, seed=seed, **({"lam": lam} if "lam" in declaration(loss).params else {}))
            for loss in LOSS_NAMES for seed in range(seeds)]


def images(data_dir: Path, rows: int, seeds: int, epochs: int, lr: float, lam: float,
           chance_epochs: int, encoder: str = "efficientnet-lite0") -> dict[str, Any]:
    """An image encoder frozen on a fixed Fashion-MNIST subset: the first ``rows`` training
    images, a quarter as many validation and test images; its summary row."""
    import dataclasses

    from corel.data import with_image_features

    pixels = load_dataset(ExperimentSpec(dataset="fashion-mnist"), data_dir if data_dir.is_dir() else None)
    part = max(rows // 4, 10)
    pixels = dataclasses.replace(
        pixels, x_train=pixels.x_train[:rows], y_train=pixels.y_train[:rows], x_val=pixels.x_val[:part],
        y_val=pixels.y_val[:part], x_test=pixels.x_test[:part], y_test=pixels.y_test[:part])
    one = dataclasses.replace(pixels, x_train=pixels.x_train[:1], y_train=pixels.y_train[:1],
                              x_val=pixels.x_val[:1], y_val=pixels.y_val[:1], x_test=pixels.x_test[:1],
                              y_test=pixels.y_test[:1])
    with_image_features(one, encoder)  # its load is not the sweep's
    forget_features()
    started = time.perf_counter()
    data = with_image_features(pixels, encoder)
    embedded = time.perf_counter() - started
    base = {"dataset": "fashion-mnist", "encoder": encoder, "lr": lr, "epochs": epochs}
    specs = sweep_specs(base, seeds, lam)
    results = train(specs, data, chance_epochs)
    seconds = time.perf_counter() - started
    n = len(pixels.y_train) + len(pixels.y_val) + len(pixels.y_test)
    size = EncoderRecord.of(data.preprocessing).field("image_size")  # type: ignore[union-attr]
    print(f"Fashion-MNIST subset, frozen {encoder}: {len(data.y_train)} training, {len(data.y_val)} validation, "
          f"{len(data.y_test)} test images at {size} pixels; {n} embedded once in {embedded:.1f} s "
          f"({n / embedded:.0f} images/s)")
    print(f"raw pixels: {alone(pixels)}")
    by_itself = alone(data)
    print(f"frozen {encoder} alone: {by_itself}")
    best = report(specs, results, data)
    if encoder == "efficientnet-lite0":
        print(f"image frozen head MAP@R: {best[0]:.3f}")
        print(f"image head sweep seconds: {seconds:.1f}")
    return {"encoder": encoder, "rate": f"{n / embedded:.0f} images/s", "alone": by_itself,
            "best": f"{best[0]:.3f} ({declaration(best[1]).short if best[1] else '-'})", "seconds": seconds}


def products_floor(specs: list[ExperimentSpec], data: Any) -> tuple[float, float]:
    """What the sweep's FFNNs' matrix products alone take on this CPU, forward and backward,
    as the stacked groups form them (``baddbmm`` over the members, the inputs shared): every
    member, every training batch of every epoch, and nothing else (no loss, no optimiser step,
    no evaluation): a floor under the sweep's seconds that no loop can go below here. The
    seconds, and the rate the products ran at (GFLOP/s)."""
    spec = specs[0]
    members, dim, hidden, batch = len(specs), int(data.x_train[0].numel()), spec.hidden, spec.batch_size
    batch = min(batch, len(data.y_train))
    gen = torch.Generator().manual_seed(0)
    W1 = torch.randn(members, hidden, dim, generator=gen).requires_grad_()
    W2 = torch.randn(members, hidden, hidden, generator=gen).requires_grad_()
    b1 = torch.zeros(members, hidden, requires_grad=True)
    b2 = torch.zeros(members, hidden, requires_grad=True)
    x = torch.randn(batch, dim, generator=gen)

    def step() -> None:
        h = torch.baddbmm(b1.unsqueeze(1), x.expand(members, batch, dim), W1.transpose(1, 2)).relu()
        torch.baddbmm(b2.unsqueeze(1), h, W2.transpose(1, 2)).sum().backward()

    for _ in range(3):
        step()
    timed = 30
    started = time.perf_counter()
    for _ in range(timed):
        step()
    per_step = (time.perf_counter() - started) / timed
    steps = len(data.y_train) / batch * spec.epochs  # the last, shorter batch as its share of one
    # multiply-adds: the first layer's forward and weight gradient (its input takes none), the
    # second's forward, input and weight gradients; 2 FLOP each
    flops = 2 * members * batch * (2 * dim * hidden + 3 * hidden * hidden)
    return per_step * steps, flops / per_step / 1e9


def text_sweep(base: dict[str, Any], data_dir: Path, seeds: int, lam: float, chance_epochs: int,
               store: FolderStore | None = None) -> tuple[dict[str, Any], list[ExperimentSpec], float, float]:
    """Every loss's heads over a frozen text encoder, the features computed first (from no
    cache; put into ``store``); its summary row, the specs, the best head's MAP@R and the
    sweep's seconds."""
    model_inputs(["loaded first"], run_preprocessing(base["encoder"], "text"))  # its load is not the sweep's
    forget_features()
    computed = features.COMPUTED["texts"]
    started = time.perf_counter()
    data = load_dataset(ExperimentSpec(**base), data_dir, features_store=store)
    embedded = time.perf_counter() - started
    specs = sweep_specs(base, seeds, lam)
    results = train(specs, data, chance_epochs)
    seconds = time.perf_counter() - started
    texts = features.COMPUTED["texts"] - computed
    print(f"AG News, frozen {base['encoder']}: {len(data.y_train)} training, {len(data.y_val)} validation, "
          f"{len(data.y_test)} test rows; {texts} texts embedded once in {embedded:.2f} s "
          f"({texts / embedded:.0f} texts/s)")
    by_itself = alone(data)
    print(f"frozen encoder alone: {by_itself}")
    best = report(specs, results, data)
    print(f"{base['encoder']} head sweep seconds: {seconds:.1f} ({len(specs)} heads, features included)")
    floor, rate = products_floor(specs, data)
    print(f"{base['encoder']} head sweep floor seconds: {floor:.1f} (the {len(specs)} FFNNs' matrix products "
          f"alone, forward and backward, at this CPU's {rate:.0f} GFLOP/s for them)")
    row = {"encoder": base["encoder"], "rate": f"{texts / embedded:.0f} texts/s", "texts_per_s": texts / embedded,
           "alone": by_itself, "best": f"{best[0]:.3f} ({declaration(best[1]).short if best[1] else '-'})",
           "seconds": seconds}
    return row, specs, best[0], seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR") or "../shared/datasets")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--lam", type=float, default=0.85, help="lambda of the AR losses (default 0.85)")
    ap.add_argument("--baseline", type=int, default=len(LOSS_NAMES),
                    help="how many of the eleven separate experiments to run for real")
    ap.add_argument("--images", type=int, default=2000,
                    help="Fashion-MNIST training images for the image encoders (0: no image part)")
    ap.add_argument("--text-encoders", default="minilm,wordllama",
                    help="frozen text encoders, each its sweep (the first also against separate experiments)")
    ap.add_argument("--image-encoders", default="efficientnet-lite0,efficientnet-lite2")
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 150 rows, 1 seed, 2 epochs")
    args = ap.parse_args(argv)
    data_dir = Path(args.data_dir)
    names = [n for n in args.text_encoders.split(",") if n]
    base: dict[str, Any] = {"dataset": "ag-news", "encoder": names[0], "lr": args.lr, "epochs": args.epochs}
    chance_epochs = 5  # the service's default guard (COREL_CHANCE_EPOCHS)
    if args.smoke:  # two epochs on 22 validation rows: no verdict on learning
        args.seeds, args.epochs, args.baseline, chance_epochs, args.images = 1, 2, 1, 0, 40
        base = {**base, "dataset": "text", "dataset_path": str(smoke_table(data_dir, 150)), "epochs": 2}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.seeds} seeds, {args.epochs} "
          f"epochs, lr {args.lr:g}, batch 128, lam {args.lam:g} (the AR losses)")

    # Each sweep: one embedding pass, then every loss's heads. The first encoder's features
    # also go into a store (a folder, as a shared mount would be; the service's is its
    # artifact store), which its sweep then reads a second time: the warm sweep.
    rows = []
    store = FolderStore(tempfile.mkdtemp(prefix="corel-features-store-"))
    for name in names:
        row, swept, best_map, seconds = text_sweep({**base, "encoder": name}, data_dir, args.seeds, args.lam,
                                                   chance_epochs, store if name == names[0] else None)
        rows.append(row)
        if name == names[0]:
            specs, best, sweep_seconds = swept, best_map, seconds
            forget_features()  # another process, another host: only the store has them
            computed = features.COMPUTED["texts"]
            started = time.perf_counter()
            warm = load_dataset(ExperimentSpec(**{**base, "encoder": name}), data_dir, features_store=store)
            train(swept, warm, chance_epochs)
            warm_seconds = time.perf_counter() - started
            assert features.COMPUTED["texts"] == computed and warm.features_source == "from the store"
            # The same warm sweep with each loss's group taking its own passes, in turn.
            started = time.perf_counter()
            train(swept, warm, chance_epochs, lockstep=False)
            apart_seconds = time.perf_counter() - started
    if args.images:
        for name in (n for n in args.image_encoders.split(",") if n):
            rows.append(images(data_dir, args.images, args.seeds, args.epochs, args.lr, args.lam, chance_epochs,
                               name))
    print(f"{'encoder':<20}{'features':>16}  {'the encoder alone':<66}{'best head MAP@R':>26}{'sweep s':>9}")
    for row in rows:
        print(f"{row['encoder']:<20}{row['rate']:>16}  {row['alone']:<66}{row['best']:>26}{row['seconds']:>9.1f}")
    rates = {row["encoder"]: row.get("texts_per_s") for row in rows}
    if rates.get("minilm") and rates.get("wordllama"):
        print(f"ratio wordllama / minilm texts/s: {rates['wordllama'] / rates['minilm']:.1f}")

    # The same sweep as separate experiments, each embedding again, seeds one after another.
    walls = []
    for loss in LOSS_NAMES[: args.baseline]:
        forget_features()
        t0 = time.perf_counter()
        own = load_dataset(ExperimentSpec(**base), data_dir)
        for seed in range(args.seeds):
            with contextlib.suppress(NotLearningError):
                fit(next(s for s in specs if s.loss == loss and s.seed == seed), data=own,
                    chance_epochs=chance_epochs)
        walls.append(time.perf_counter() - t0)
    run = len(walls)
    separate = sum(walls) + (len(LOSS_NAMES) - run) * statistics.median(walls)
    note = "" if run == len(LOSS_NAMES) else (
        f" ({run} of {len(LOSS_NAMES)} run, median {statistics.median(walls):.1f} s each; the other "
        f"{len(LOSS_NAMES) - run} counted at that median)")
    print(f"separate experiments without the feature cache: {separate:.1f} s{note}")
    print(f"ratio separate / sweep wall time: {separate / sweep_seconds:.2f}")
    print(f"frozen head MAP@R: {best:.3f}")
    print(f"head sweep seconds: {sweep_seconds:.1f}")
    print(f"head sweep warm seconds: {warm_seconds:.1f} (the same sweep, its features read from the store)")
    print(f"head sweep warm seconds, each loss's group in turn: {apart_seconds:.1f} "
          f"(ratio in turn / in lockstep: {apart_seconds / warm_seconds:.2f})")


if __name__ == "__main__":
    main()
