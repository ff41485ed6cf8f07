"""Fine-tuning a pretrained encoder with COREL losses, against the field's own tools, in one
run and on the same data.

1. Text: all-MiniLM-L6-v2 (the offline package) fine-tuned on AG News (the shared test
   split, corel's own split; ``--rows`` training rows, ``--epochs`` epochs, ``--batch``
   rows a step, the same for everyone):

   * corel, Cosine-COREL and Gaussian-COREL, the whole encoder trained; then Cosine-COREL
     with only its last ``--blocks`` transformer layers trained (the rest frozen, their
     outputs computed once per row and kept: corel.encoders.finetune);
   * sentence-transformers' ``SentenceTransformerTrainer`` with its losses for labelled
     data, ``BatchHardTripletLoss`` and ``BatchAllTripletLoss`` (its defaults, the
     ``GROUP_BY_LABEL`` batch sampler its documentation advises for them), the whole
     encoder trained; then its best loss with the same lower layers frozen
     (``requires_grad`` off: what a user of the trainer does to train the last layers).

   Both sides train at the same encoder learning rate (``--encoder-lr``) with the same
   warm-up (a tenth of the steps); corel's head (the paper's two hidden layers and the class
   vectors, new) at ``--lr``. For each: MAP@R and precision@1 of the test rows against the
   training rows (cosine for the trainer's vectors and Cosine-COREL's, Euclidean for
   Gaussian-COREL's), the test accuracy of a logistic regression on the vectors (and of
   corel's own head), training samples/s (the training passes only: what each spends
   before its first step, loading included, is not counted for either), and the frozen
   encoder alone for reference.

2. Images: EfficientNet-Lite0 (ImageNet weights, the offline package) fine-tuned on a fixed
   Fashion-MNIST subset (``--images`` training images, a quarter as many test images, at the
   encoder's 96 pixels) with pytorch-metric-learning's SupConLoss, where no trainer exists:
   corel (its ``supcon`` loss, equal to pml's) against a plain PyTorch loop over the same
   network, the same initial weights, the same batches and the same frozen stages, with
   ``pml.losses.SupConLoss``; then corel with the whole encoder trained.

Its last lines read ``finetune MAP@R corel / sentence-transformers: A / B`` (A: corel's
configuration the ratio is taken for, Cosine-COREL on the last ``--blocks`` layers; B: the
trainer's best) and ``ratio corel / sentence-transformers samples/s: R`` (against the
trainer's run with the best MAP@R).

``--device cuda``: the full sizes (all 5,320 AG News training rows, the whole of
Fashion-MNIST) unless given, in bf16 for both sides. ``--smoke``: 32 rows, one epoch, 32
images, one corel and one trainer row fewer (half a minute). Run: ``.venv/bin/python bench/finetune.py [--data-dir ../shared/datasets]``.
Needs the test extra (sentence-transformers' trainer needs ``datasets`` and ``accelerate``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from corel.data import ag_news_texts, load_dataset
from corel.encoders.finetune import FROZEN_OUTPUTS, frozen_outputs_kept, warmed_up_lr
from corel.loss_catalog import declaration
from corel.retrieval import retrieval_metrics
from corel.spec import ExperimentSpec
from corel.train import start_run, train_pass

EVAL_BATCH = 16


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def scores(test: torch.Tensor, y_test: np.ndarray, train: torch.Tensor, y_train: np.ndarray,
           geometry: str) -> dict[str, float]:
    found = retrieval_metrics(test.float().cpu(), y_test, train.float().cpu(), y_train, geometry)  # type: ignore[arg-type]
    logreg = LogisticRegression(max_iter=3000).fit(train.float().cpu().numpy(), y_train)
    return {"map": found["mean_average_precision_at_r"], "p1": found["precision_at_1"],
            "logreg": float(logreg.score(test.float().cpu().numpy(), y_test))}


def row(name: str, s: dict[str, float], rate: float | None, head: float | None = None) -> str:
    speed = f"{rate:8.1f}" if rate is not None else "       -"
    own = f"{100 * head:5.1f} %" if head is not None else "      -"
    return (f"{name:<58} {s['map']:.3f}  {s['p1']:.3f}  {100 * s['logreg']:5.1f} %  {own}  {speed}")


HEADER = f"{'':<58} MAP@R  P@1    logreg   head     samples/s"


# --- corel --------------------------------------------------------------------------------

def by_length(x: torch.Tensor) -> list[torch.Tensor]:
    """Row indices in batches of EVAL_BATCH, shortest texts first (as sentence-transformers'
    encode orders them), so that neither side pads more than the other."""
    order = torch.argsort(x[:, 1].sum(1), stable=True)
    return list(order.split(EVAL_BATCH))


def corel_scores(model: Any, data: Any, geometry: str, device: str) -> tuple[dict[str, float], float]:
    """Scores of a trained corel model's h, and its head's test accuracy (a pair-based loss
    predicts with the training rows' class means, as corel's epochs set them)."""
    h_train, _ = corel_vectors(model, data.x_train, device)
    if model.head.uses_class_means:
        model.head.set_class_means(h_train.to(device, model.head.W.dtype), data.y_train.to(device))
    h_test, predicted = corel_vectors(model, data.x_test, device)
    y_test = data.y_test.numpy()
    s = scores(h_test, y_test, h_train, data.y_train.numpy(), geometry)
    return s, float((predicted.numpy() == y_test).mean())


def corel_vectors(model: Any, x: torch.Tensor, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's output h and the head's predictions, rows in order."""
    model.eval()
    out = torch.empty(len(x), model.head.W.shape[1], dtype=torch.float32)
    predicted = torch.empty(len(x), dtype=torch.int64)
    batches = by_length(x) if x.dim() == 3 and x.shape[1] == 2 else list(torch.arange(len(x)).split(64))
    with torch.no_grad():
        for idx in batches:
            h = model.encoder(x[idx].to(device))
            out[idx] = h.float().cpu()
            predicted[idx] = model.head.similarities(h).argmax(1).cpu()
    return out, predicted


def corel_run(fields: dict[str, Any], data: Any, device: str) -> tuple[Any, float, float]:
    """A corel run's model, its training seconds and samples/s (the passes only, the frozen
    lower part's outputs computed afresh within them)."""
    spec = ExperimentSpec(**fields)
    run = start_run(spec, data=data, device=device)
    FROZEN_OUTPUTS.clear()
    sync(device)
    started = time.perf_counter()
    with frozen_outputs_kept(run.model):
        for _ in range(spec.epochs):
            train_pass(run)
    sync(device)
    seconds = time.perf_counter() - started
    return run.model, seconds, len(data.y_train) * spec.epochs / seconds


# --- sentence-transformers --------------------------------------------------------------

def st_run(loss_name: str, texts: list[str], labels: np.ndarray, args: argparse.Namespace,
           frozen_layers: int) -> tuple[Any, float, float]:
    """sentence-transformers' trainer on the same rows: the model, its training seconds
    and samples/s (from its first step's start to its last's end)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.training_args import BatchSamplers
    from transformers import TrainerCallback

    from corel.encoders.files import installed

    model = SentenceTransformer(str(installed("minilm", "text")), device=args.device, local_files_only=True)
    if frozen_layers:
        transformer: Any = model[0].auto_model
        for module in [transformer.embeddings, *transformer.encoder.layer[:frozen_layers]]:
            for p in module.parameters():
                p.requires_grad_(False)
    loss = getattr(losses, loss_name)(model)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, *a: Any, **k: Any) -> None:
            sync(args.device)
            times.append(time.perf_counter())

        def on_train_end(self, *a: Any, **k: Any) -> None:
            sync(args.device)
            times.append(time.perf_counter())

    steps = -(-len(texts) // args.batch) * args.epochs
    with tempfile.TemporaryDirectory() as out:
        arguments = Arguments(
            output_dir=out, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch,
            learning_rate=args.encoder_lr, warmup_steps=max(steps // 10, 1), seed=0, data_seed=0,
            batch_sampler=BatchSamplers.GROUP_BY_LABEL, save_strategy="no", report_to=[], logging_steps=10**6,
            disable_tqdm=True, use_cpu=args.device == "cpu", bf16=args.device != "cpu",
            dataloader_num_workers=0)
        train = Dataset.from_dict({"sentence": texts, "label": [int(v) for v in labels]})
        trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=train, loss=loss,
                                             callbacks=[Clock()])
        trainer.train()
    seconds = times[-1] - times[0]
    return model, seconds, len(texts) * args.epochs / seconds


def st_vectors(model: Any, texts: list[str]) -> torch.Tensor:
    model.eval()
    out: torch.Tensor = model.encode(texts, batch_size=EVAL_BATCH, convert_to_tensor=True, show_progress_bar=False)
    return out.float().cpu()


def text(args: argparse.Namespace) -> tuple[float, float, float, float]:
    base = {"dataset": "ag-news", "encoder": "minilm", "encoder_mode": "finetune", "train_subset": args.rows,
            "epochs": args.epochs, "batch_size": args.batch, "lr": args.lr, "encoder_lr": args.encoder_lr,
            "warmup": 0.1, "precision": "bf16" if args.device != "cpu" else "fp32", "seed": 0}
    split = ag_news_texts(ExperimentSpec(dataset="ag-news", train_subset=args.rows), args.data_dir)
    data = load_dataset(ExperimentSpec(**{**base, "loss": "cosine"}), args.data_dir)
    if args.test_rows:
        data = dataclasses.replace(data, x_test=data.x_test[: args.test_rows], y_test=data.y_test[: args.test_rows])
        split = dataclasses.replace(split, test=(split.test[0][: args.test_rows], split.test[1][: args.test_rows]))
    y_train, y_test = data.y_train.numpy(), data.y_test.numpy()
    assert len(split.train[0]) == len(y_train) and (split.train[1] == y_train).all()
    layers = 6
    print(f"AG News: {len(y_train)} training rows, {len(y_test)} test rows; {args.epochs} epochs, "
          f"batch {args.batch}, encoder lr {args.encoder_lr}, head lr {args.lr}, device {args.device}, "
          f"{torch.get_num_threads()} threads")
    print(HEADER)

    from sentence_transformers import SentenceTransformer

    from corel.encoders.files import installed

    frozen = SentenceTransformer(str(installed("minilm", "text")), device=args.device, local_files_only=True)
    print(row("all-MiniLM-L6-v2 frozen, alone", scores(st_vectors(frozen, split.test[0]), y_test,
                                                        st_vectors(frozen, split.train[0]), y_train, "cosine"), None),
          flush=True)

    results: dict[str, tuple[float, float]] = {}

    def corel_row(label: str, fields: dict[str, Any]) -> None:
        model, _, rate = corel_run({**base, **fields}, data, args.device)
        s, head = corel_scores(model, data, declaration(fields["loss"]).geometry, args.device)
        results[label] = (s["map"], rate)
        print(row(label, s, rate, head), flush=True)

    def st_row(label: str, loss: str, frozen_layers: int = 0) -> None:
        model, _, rate = st_run(loss, split.train[0], y_train, args, frozen_layers)
        s = scores(st_vectors(model, split.test[0]), y_test, st_vectors(model, split.train[0]), y_train, "cosine")
        results[label] = (s["map"], rate)
        print(row(label, s, rate), flush=True)

    corel_row("corel Cosine-COREL, whole encoder", {"loss": "cosine"})
    if not args.smoke:  # (the smoke run: each code path once)
        corel_row("corel Gaussian-COREL, whole encoder", {"loss": "gaussian"})
    kept = f"corel Cosine-COREL, last {args.blocks} layers (rest kept)"
    corel_row(kept, {"loss": "cosine", "trainable_blocks": args.blocks})
    if not args.smoke:
        st_row("sentence-transformers BatchHardTripletLoss, whole encoder", "BatchHardTripletLoss")
    st_row("sentence-transformers BatchAllTripletLoss, whole encoder", "BatchAllTripletLoss")
    best_st = max((k for k in results if k.startswith("sentence")), key=lambda k: results[k][0])
    loss = best_st.split()[1].rstrip(",")
    st_row(f"sentence-transformers {loss}, last {args.blocks} layers", loss, layers - args.blocks)
    trainer = max((k for k in results if k.startswith("sentence")), key=lambda k: results[k][0])
    print(f"corel's figure: {kept}; the trainer's: {trainer}")
    return results[kept][0], results[trainer][0], results[kept][1], results[trainer][1]


# --- images -------------------------------------------------------------------------------

def plain_loop(model: Any, x: torch.Tensor, y: torch.Tensor, spec: ExperimentSpec, device: str) -> float:
    """A plain PyTorch fine-tuning loop: pml's SupConLoss on the model's output, Adam with
    the encoder's parameters at ``encoder_lr`` after corel's warm-up, the same batches as
    corel's (the run's seeded order). Returns samples/s."""
    from pytorch_metric_learning import losses

    loss_fn = losses.SupConLoss(temperature=0.1)
    tower = {id(p) for p in model.tower.parameters()}
    groups: list[dict[str, Any]] = [
        {"params": [p for p in model.tower.parameters() if p.requires_grad], "lr": spec.encoder_lr},
        {"params": [p for p in model.parameters() if id(p) not in tower], "lr": spec.lr}]
    optimizer = torch.optim.Adam(groups)
    groups = optimizer.param_groups
    shuffle = torch.Generator().manual_seed(spec.seed)
    model.train()
    sync(device)
    started = time.perf_counter()
    step = 0
    for _ in range(spec.epochs):
        order = torch.randperm(len(y), generator=shuffle)
        for idx in order.split(spec.batch_size):
            groups[0]["lr"] = warmed_up_lr(spec, step, -(-len(y) // spec.batch_size))  # corel's warm-up
            step += 1
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device != "cpu"):
                loss = loss_fn(model(x[idx].to(device)).float(), y[idx].to(device))
            loss.backward()
            optimizer.step()
    sync(device)
    return len(y) * spec.epochs / (time.perf_counter() - started)


def images(args: argparse.Namespace) -> None:
    spec_fields = {"dataset": "fashion-mnist", "encoder": "efficientnet-lite0", "encoder_mode": "finetune",
                   "loss": "supcon", "epochs": args.epochs, "batch_size": args.batch, "lr": args.lr,
                   "encoder_lr": args.encoder_lr, "trainable_blocks": args.image_blocks, "seed": 0,
                   "precision": "bf16" if args.device != "cpu" else "fp32"}
    data = load_dataset(ExperimentSpec(**spec_fields), args.data_dir)
    if args.images:
        part = max(args.images // 4, 10)
        data = dataclasses.replace(data, x_train=data.x_train[: args.images], y_train=data.y_train[: args.images],
                                   x_val=data.x_val[:part], y_val=data.y_val[:part],
                                   x_test=data.x_test[:part], y_test=data.y_test[:part])
    y_train, y_test = data.y_train.numpy(), data.y_test.numpy()
    print(f"\nFashion-MNIST: {len(y_train)} training images, {len(y_test)} test images at 96 pixels; "
          f"SupCon (temperature 0.1), {args.epochs} epochs, batch {args.batch}; EfficientNet-Lite0's "
          f"last {args.image_blocks} of 7 stages trained unless said")
    print(HEADER)
    spec = ExperimentSpec(**spec_fields)
    torch.manual_seed(spec.seed)
    start = start_run(spec, data=data, device=args.device)
    plain = copy.deepcopy(start.model.encoder)
    plain_rate = plain_loop(plain, data.x_train, data.y_train, spec, args.device)
    with torch.no_grad():
        plain.eval()
        v_test = torch.cat([plain(c.to(args.device)).float().cpu() for c in data.x_test.split(64)])
        v_train = torch.cat([plain(c.to(args.device)).float().cpu() for c in data.x_train.split(64)])
    plain_scores = scores(v_test, y_test, v_train, y_train, "cosine")
    print(row("plain PyTorch loop, pml SupConLoss", plain_scores, plain_rate), flush=True)
    results = {}
    for label, fields in ((f"corel supcon, last {args.image_blocks} stages (rest kept)", {}),
                          ("corel supcon, whole encoder", {"trainable_blocks": None})):
        model, _, rate = corel_run({**spec_fields, **fields}, data, args.device)
        s, head = corel_scores(model, data, "cosine", args.device)
        results[label] = (s["map"], rate)
        print(row(label, s, rate, head), flush=True)
    first = next(iter(results))
    print(f"image finetune MAP@R corel / plain loop: {results[first][0]:.3f} / {plain_scores['map']:.3f}")
    print(f"image ratio corel / plain loop samples/s: {results[first][1] / plain_rate:.2f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("COREL_DATA_DIR", "../shared/datasets")))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=None, help="AG News training rows (CPU: 1000; GPU: all)")
    parser.add_argument("--test-rows", type=int, default=None, help="AG News test rows (default: all 1140)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="corel's head")
    parser.add_argument("--encoder-lr", type=float, default=1e-4, help="the encoder's, both sides")
    parser.add_argument("--blocks", type=int, default=2, help="the last transformer layers trained (of 6)")
    parser.add_argument("--images", type=int, default=None, help="Fashion-MNIST training images (CPU: 1000)")
    parser.add_argument("--image-blocks", type=int, default=2, help="EfficientNet-Lite0's last stages trained")
    parser.add_argument("--skip-images", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gpu = args.device != "cpu"
    if args.smoke:
        args.rows, args.test_rows, args.epochs, args.images = args.rows or 32, args.test_rows or 32, 1, 32
    args.rows = args.rows or (None if gpu else 1000)
    args.images = args.images or (None if gpu else 1000)
    torch.manual_seed(0)
    if not args.skip_images:
        images(args)
    corel_map, st_map, corel_rate, st_rate = text(args)
    print(f"finetune MAP@R corel / sentence-transformers: {corel_map:.3f} / {st_map:.3f}")
    print(f"ratio corel / sentence-transformers samples/s: {corel_rate / st_rate:.2f}")


if __name__ == "__main__":
    main()
