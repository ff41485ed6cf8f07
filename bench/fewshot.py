"""Few labelled examples per class on AG News: corel's heads on frozen all-MiniLM-L6-v2
features against MTEB's linear probe, on the same seeded draws, in one run (corel.fewshot).

AG News as shipped here is its test split alone (7,600 rows, 1,900 per class, in
``../shared/datasets``), so the pool the shots are drawn from and the evaluation rows both
come from it: per class, half for evaluation, the other half the pool (corel.fewshot's
``draw_splits``). For each N of ``--shots`` and each of ``--splits`` draws, every method
trains on the N x 4 shots alone and is scored on the same 3,800 evaluation rows:

* ``probe``: scikit-learn's ``LogisticRegression(max_iter=100)`` (MTEB's protocol);
* ``selftrain``: the shots and the pool's other 3,768 to 3,544 rows, unlabeled
  (``corel.fewshot.self_train``): Cosine-COREL's class vectors start at the shots' class
  means and move to the means of the rows they attract, then the probe is fitted on the
  shots and the rows each class holds most surely. The one method that reads more than the
  shots (the pool's texts, never their labels): ``fewshot N=8 corel best on the shots
  alone`` names the best of the others;
* each of corel's eleven losses as a head over the features, full-batch Adam
  (``--lr``, ``--steps``), its class vectors starting at the shots' class means, over the
  features themselves (``--layer none``) or a linear map of them that starts as the identity
  (``--layer linear``); the dot-product and Gaussian heads with the probe's penalty on their
  class vectors (``--l2``, default 1: CCE's objective is then the probe's).

* ``finetune-cosine``: corel fine-tuning MiniLM itself on the draw's shots
  (``corel.fewshot.finetune_fewshot``): its last ``--finetune-blocks`` blocks (default 2)
  with Cosine-COREL's head over its output (``--finetune-loss``), the class vectors starting
  at the shots' class means, full-batch Adam for ``--finetune-steps`` steps (default 30; the
  blocks at ``--finetune-lr``, 1e-4, the head at 1e-2), scored by the head; each frozen
  lower block's output of a row is computed once and shared by every draw; at each N of
  ``--finetune`` (default 8) on the first ``--finetune-splits`` draws (default all);
  ``--finetune-batch 16 --finetune-warmup 0.1`` trains on SetFit's schedule instead (16 shots
  a step, AdamW warmed up over a tenth of the steps, then decayed linearly): at N=8, with
  ``--finetune-blocks 6 --finetune-steps 80 --finetune-lr 2e-5``, 82.5 on the 10 draws
  against the defaults' 81.5, and 82.8 with ``--finetune-average 0.5`` (the weights averaged
  over the last half of the steps; docs/benchmarks.md);

* ``setfit``: SetFit itself (PyPI's ``setfit``, in the bench extra) on the same MiniLM files,
  offline, with its defaults as its paper ran them: ``CosineSimilarityLoss``,
  ``num_iterations=20``, 1 epoch, batch 16, a logistic-regression head; at each N of
  ``--setfit`` (default 8: one draw of N=64 takes about 12 minutes on 2 cores) on the first
  ``--setfit-splits`` draws (default all); ``--first-draw K`` runs SetFit and the fine-tune from
  draw K on (each draw with its own seed, as in one run), so that a comparison too long for one
  sitting (SetFit's N=64 takes 12-18 minutes a draw here) can be finished a few draws at a time.

It prints the table per N (mean, sd, min, max in percent, the paired difference against the
best method and its t-test's p-value, seconds), then one line per N,
``fewshot N=8 corel best / setfit / probe: A / B / C`` (corel best: the best corel method's mean, fine-tuned or a head; ``-``
where SetFit did not run) and ``fewshot N=8 corel best method: M`` (with corel's best on the
draws SetFit ran, where it ran fewer), ``fewshot N=8 corel best on the shots alone: M A`` (every
method but ``selftrain``), ``fewshot N=8 best head on frozen features / probe: M A / B`` (to the
hundredth, with the paired difference and its p-value), ``fewshot corel protocol seconds at N=8: S`` (every head on every
draw) and ``fewshot time ratio setfit / corel: R`` (SetFit's seconds against every corel head's,
on the draws SetFit ran), and ``fewshot N=8 finetune-cosine seconds: S`` (its draws'
training and scoring). ``--smoke``: 240 rows, N of 2 and 4, 2 draws, 20 steps, SetFit on
one draw of N=2 with one iteration, the fine-tune on one draw of N=2 with two steps.

Run: ``.venv/bin/python bench/fewshot.py [--data-dir ../shared/datasets] [--splits 10]
[--shots 8,16,64] [--layer none] [--setfit 8] [--setfit-splits 10]``. Needs the encoders and
bench extras (``pip install -e '.[encoders,bench]'``: SetFit is in the latter).
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import ttest_rel

from corel.encoders import model_inputs, run_preprocessing
from corel.encoders.files import installed
from corel.fewshot import (
    PROBE,
    SELFTRAIN,
    TUNED,
    FewShotResult,
    HeadSettings,
    Splits,
    TuneSettings,
    draw_splits,
    finetune_fewshot,
    run_fewshot,
)
from corel.losses import LOSSES

SETFIT = "setfit"


def ag_news_test(data_dir: Path, rows: int | None = None) -> tuple[list[str], np.ndarray, list[str]]:
    """AG News's test split as the encoders read it (title + ' ' + description), its labels
    (0..3) and class names; ``rows``: the first rows of each class only."""
    folder = data_dir / "ag_news"
    names = [line.strip() for line in (folder / "classes.txt").read_text().splitlines() if line.strip()]
    texts, labels = [], []
    with open(folder / "test.csv", newline="", encoding="utf-8") as fh:
        for label, title, description in csv.reader(fh):
            texts.append(f"{title} {description}")
            labels.append(int(label) - 1)
    y = np.asarray(labels, dtype=np.int64)
    if rows is not None:
        keep = np.sort(np.concatenate([np.flatnonzero(y == k)[: rows // len(names)] for k in range(len(names))]))
        texts, y = [texts[i] for i in keep], y[keep]
    return texts, y, names


def setfit_results(texts: list[str], y: np.ndarray, rows: Splits, shots: list[int], splits: int,
                   iterations: int, seed: int, first: int = 0) -> list[FewShotResult]:
    """SetFit on MiniLM's files, trained on ``splits`` draws from draw ``first`` at each N of
    ``shots`` (each with its draw's seed) and scored on the protocol's evaluation rows; its
    seconds are the training's and the evaluation rows' prediction."""
    import tempfile

    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    out = []
    evaluation = [texts[i] for i in rows.evaluation]
    for n in shots:
        for s, train in enumerate(rows.draws[n][first:first + splits], start=first):
            started = time.perf_counter()
            model = SetFitModel.from_pretrained(str(installed("minilm", "text")), local_files_only=True)
            with tempfile.TemporaryDirectory() as tmp:
                args = TrainingArguments(output_dir=tmp, batch_size=16, num_iterations=iterations, num_epochs=1,
                                         report_to="none", save_strategy="no", show_progress_bar=False,
                                         seed=seed * 1000 + s)
                data = Dataset.from_dict({"text": [texts[i] for i in train], "label": [int(y[i]) for i in train]})
                Trainer(model=model, args=args, train_dataset=data).train()
            guessed = np.asarray(model.predict(evaluation, show_progress_bar=False))
            accuracy = float((guessed == y[rows.evaluation]).mean())
            out.append(FewShotResult(SETFIT, n, s, accuracy, time.perf_counter() - started))
            print(f"setfit N={n} draw {s}: {100 * accuracy:.1f} in {out[-1].seconds:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("COREL_DATA_DIR") or "../shared/datasets")
    ap.add_argument("--shots", default="8,16,64", help="examples per class, comma-separated")
    ap.add_argument("--splits", type=int, default=10, help="seeded draws per N (1 to 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=HeadSettings.lr)
    ap.add_argument("--steps", type=int, default=HeadSettings.steps)
    ap.add_argument("--layer", default=HeadSettings.layer, help="none or linear")
    ap.add_argument("--init", default=HeadSettings.init, help="means or random")
    ap.add_argument("--l2", type=float, default=HeadSettings.l2,
                    help="the probe's penalty on the dot-product and Gaussian heads' class vectors (0: none)")
    ap.add_argument("--methods", default=",".join([PROBE, SELFTRAIN, *LOSSES]))
    ap.add_argument("--features-dir", default=os.environ.get("COREL_FEATURES_DIR"),
                    help="keep MiniLM's features there (a second run reads them); default: in memory")
    ap.add_argument("--finetune", default="8", help="the Ns corel fine-tunes MiniLM at, comma-separated ('' for none)")
    ap.add_argument("--finetune-splits", type=int, help="fine-tuned on the first K draws (default: all)")
    ap.add_argument("--finetune-loss", default=TuneSettings.loss)
    ap.add_argument("--finetune-blocks", type=int, default=TuneSettings.blocks)
    ap.add_argument("--finetune-steps", type=int, default=TuneSettings.steps)
    ap.add_argument("--finetune-lr", type=float, default=TuneSettings.encoder_lr, help="the blocks' rate")
    ap.add_argument("--finetune-batch", type=int, default=TuneSettings.batch,
                    help="shots a step (SetFit's schedule: 16); default every shot every step")
    ap.add_argument("--finetune-warmup", type=float, default=TuneSettings.warmup,
                    help="AdamW, the rates warmed up over this fraction of the steps then decayed linearly "
                         "(SetFit's schedule: 0.1); default Adam at constant rates")
    ap.add_argument("--finetune-average", type=float, default=TuneSettings.average,
                    help="the weights averaged over the steps from this fraction of them on (0.5: the last "
                         "half); default the last step's weights")
    ap.add_argument("--setfit", default="8", help="the Ns SetFit runs at, comma-separated ('' for none)")
    ap.add_argument("--setfit-splits", type=int, help="SetFit on the first K draws (default: all)")
    ap.add_argument("--setfit-iterations", type=int, default=20, help="SetFit's num_iterations (default 20)")
    ap.add_argument("--first-draw", type=int, default=0,
                    help="SetFit and the fine-tune from this draw on (default 0): a long comparison a few draws "
                         "at a time, each draw with its own seed as in one run")
    ap.add_argument("--smoke", action="store_true", help="240 rows, N 2 and 4, 2 draws, 20 steps")
    args = ap.parse_args(argv)
    rows = None
    if args.smoke:
        rows, args.shots, args.splits, args.steps = 240, "2,4", 2, 20
        args.setfit, args.setfit_splits, args.setfit_iterations = "2", 1, 1
        args.finetune, args.finetune_splits, args.finetune_steps = "2", 1, 2
    shots = [int(n) for n in args.shots.split(",") if n]
    if not 0 <= args.first_draw < args.splits:
        raise SystemExit(f"--first-draw {args.first_draw}: a draw's index, 0 to {args.splits - 1}")
    texts, y, names = ag_news_test(Path(args.data_dir), rows)
    started = time.perf_counter()
    x = model_inputs(texts, run_preprocessing("minilm", "text"), args.features_dir, keep=True)
    print(f"AG News test split: {len(texts)} texts, {len(names)} classes; frozen all-MiniLM-L6-v2 features "
          f"in {time.perf_counter() - started:.1f} s; torch {torch.__version__}, {torch.get_num_threads()} threads")
    settings = HeadSettings(lr=args.lr, steps=args.steps, layer=args.layer, init=args.init, l2=args.l2)
    print(f"heads: full-batch Adam lr {settings.lr:g}, {settings.steps} steps, class vectors at init "
          f"{settings.init!r}, layer {settings.layer!r}, l2 {settings.l2:g}; {args.splits} draws per N, seed {args.seed}")
    methods = [m for m in args.methods.split(",") if m]
    report = run_fewshot(x.numpy(), y, methods=methods, shots=shots, splits=args.splits, seed=args.seed,
                         class_names=names, settings=settings)
    tune_shots = [int(n) for n in args.finetune.split(",") if n.strip()]
    draws = draw_splits(y, shots, args.splits, args.seed, names)  # the protocol's own rows
    if tune_shots:
        if any(n not in shots for n in tune_shots):
            raise SystemExit(f"--finetune {args.finetune}: each N must be one of --shots {args.shots}")
        tune = TuneSettings(loss=args.finetune_loss, blocks=args.finetune_blocks, steps=args.finetune_steps,
                            encoder_lr=args.finetune_lr, batch=args.finetune_batch, warmup=args.finetune_warmup,
                            average=args.finetune_average)
        steps = (f"{'full-batch' if tune.batch is None else f'{tune.batch} shots a step,'} "
                 f"{'Adam' if tune.warmup is None else f'AdamW warmed up over {tune.warmup:g} then decayed,'}")
        averaged = "" if tune.average is None else f", the weights averaged from {tune.average:g} of the steps on"
        print(f"{tune.method}: MiniLM's last {tune.blocks} blocks and {tune.loss}'s head, {steps} "
              f"{tune.steps} steps (blocks at {tune.encoder_lr:g}, head at {tune.lr:g}){averaged}, scored by the head")
        report.results.extend(finetune_fewshot(
            texts, y, draws, tune_shots, settings=tune, seed=args.seed, draws=args.finetune_splits,
            first=args.first_draw,
            on_result=lambda r: print(f"{r.method} N={r.shots} draw {r.split}: {100 * r.accuracy:.1f} "
                                      f"in {r.seconds:.1f} s", flush=True)))
    print(report.table())
    summary = report.summary()
    setfit_shots = [int(n) for n in args.setfit.split(",") if n.strip()]
    unknown = [n for n in setfit_shots if n not in shots]
    if unknown:
        raise SystemExit(f"--setfit {unknown[0]}: not one of --shots {args.shots}")
    peer = setfit_results(texts, y, draws, setfit_shots, args.setfit_splits or args.splits - args.first_draw,
                          args.setfit_iterations, args.seed, args.first_draw) if setfit_shots else []
    for n in shots:
        heads = [r for r in summary if r["shots"] == n and r["method"] != PROBE]
        best = max(heads, key=lambda r: r["mean"]) if heads else None
        probe = next((r for r in summary if r["shots"] == n and r["method"] == PROBE), None)
        ran = [r for r in peer if r.shots == n]
        shown = f"{100 * best['mean']:.1f}" if best else "-"
        probed = f"{100 * probe['mean']:.1f}" if probe else "-"
        theirs = f"{100 * float(np.mean([r.accuracy for r in ran])):.1f}" if ran else "-"
        print(f"fewshot N={n} corel best / setfit / probe: {shown} / {theirs} / {probed}")
        said = f"fewshot N={n} corel best method: {best['method'] if best else '-'}"
        if ran and len(ran) < args.splits:  # corel's on the same draws beside SetFit's
            theirs = {r.split for r in ran}
            mine = np.array([r.accuracy for r in report.results
                             if best and r.method == best["method"] and r.shots == n and r.split in theirs])
            said += (f"; setfit ran {len(ran)} of {args.splits} draws, corel's best on those "
                     f"{100 * float(mine.mean()) if len(mine) else float('nan'):.1f}")
        print(said)
        alone = [r for r in heads if r["method"] != SELFTRAIN]
        if alone and len(alone) < len(heads):  # the best that reads the shots alone, as SetFit does
            top = max(alone, key=lambda r: r["mean"])
            print(f"fewshot N={n} corel best on the shots alone: {top['method']} {100 * top['mean']:.1f}")
        frozen = [r for r in alone if not r["method"].startswith(TUNED)]
        if frozen and probe:  # the target "the best head on frozen features at least the probe", to the hundredth
            top = max(frozen, key=lambda r: r["mean"])
            mine, theirs = report.paired(top["method"], PROBE, n)
            p = ttest_rel(mine, theirs).pvalue if len(mine) > 1 and float(np.ptp(mine - theirs)) > 0 else float("nan")
            print(f"fewshot N={n} best head on frozen features / probe: {top['method']} {100 * top['mean']:.2f} / "
                  f"{100 * probe['mean']:.2f} (paired difference {100 * float((mine - theirs).mean()):+.2f}, p {p:.3g})")
    first = shots[0]
    heads = [r for r in summary if r["shots"] == first and r["method"] != PROBE and not r["method"].startswith(TUNED)]
    seconds = sum(r["seconds"] for r in heads)
    print(f"fewshot corel protocol seconds at N={first}: {seconds:.2f} (every head on every draw)")
    for row in (r for r in summary if r["method"].startswith(TUNED)):
        print(f"fewshot N={row['shots']} {row['method']} seconds: {row['seconds']:.1f} ({row['splits']} draw{'s' if row['splits'] != 1 else ''}, "
              f"training and scoring the evaluation rows)")
    if peer:
        n = peer[0].shots
        ran = [r for r in peer if r.shots == n]
        mine = sum(r.seconds for r in report.results if r.shots == n and r.method != PROBE
                   and not r.method.startswith(TUNED) and r.split in {p.split for p in ran})
        print(f"fewshot time ratio setfit / corel: {sum(r.seconds for r in ran) / mine:.1f} (N={n}, {len(ran)} "
              f"draws: SetFit {sum(r.seconds for r in ran):.1f} s, every corel head {mine:.2f} s)")


if __name__ == "__main__":
    main()
