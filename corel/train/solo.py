"""The solo loop: ``train_step`` -> ``run_epoch`` -> ``fit``.

The paper's protocol is the default: Adam, lr 1e-4, batch 128, 150 epochs, and
the reported test accuracy is the one at the epoch of best validation accuracy.
Batches are drawn by index from in-memory tensors (no per-sample DataLoader).

Precision follows the data: float32 by default, float64 for a dataset cast with
``Dataset.astype(torch.float64)`` (the model is then built and trained in float64).

Determinism: for a given seed on CPU a run is bit-for-bit reproducible, and a
run resumed from a checkpoint ends with the same weights as an uninterrupted
one, because the checkpoint carries the shuffling generator's state and the
global RNG state (dropout) along with model, head and optimizer state.

Its neighbours, each with one job: the checkpoint format (:mod:`corel.train.checkpoints`), the
"not learning" judgement (:mod:`corel.train.guards`), the progress types and callbacks
(:mod:`corel.train.callbacks`), the device (:mod:`corel.device`); their public names are
importable from here too. The stacked loop is :mod:`corel.train.stacked`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from corel.data import Dataset, load_dataset
from corel.device import (
    Batches,
    effective_precision,
    ieee_float32,
    pick_device,
    to_device,
)
from corel.encoders.finetune import (
    FROZEN_OUTPUTS,
    frozen_outputs_heard,
    frozen_outputs_kept,
    optimizer_groups,
    warmed_up_lr,
)
from corel.encoders.paper import dropout_generator, dropout_stream, has_dropout
from corel.encoders.record import EncoderRecord
from corel.losses import check_labels
from corel.models import Classifier, build_classifier
from corel.spec import ExperimentSpec
from corel.train.callbacks import Callback, EpochMetrics
from corel.train.checkpoints import (
    CHECKPOINT_FORMAT,
    check_resumable,
    check_same_encoder,
    load_model_state,
    model_state,
    optimizer_state,
    recorded_features,
    restore_rng,
    rng_state,
)
from corel.train.graphs import GraphedSteps
from corel.train.guards import CHANCE_EPOCHS, ChanceGuard, chance_accuracy
from corel.train.optim import adam
from corel.train.options import EngineOptions
from corel.train.record import Record
from corel.train.steps import graphed_steps, pass_mode, solo_step

__all__ = [
    "EVAL_BATCH",
    "FitResult",
    "Run",
    "accuracy",
    "build_model",
    "fit",
    "make_optimizer",
    "pass_totals",
    "represent",
    "run_epoch",
    "start_run",
    "train_pass",
    "train_step",
]

EVAL_BATCH = 2048


def train_step(
    model: Classifier, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
    precision: str = "fp32",
) -> tuple[float, int]:
    """One Adam step on a batch in ``precision`` ("fp32" or "bf16"); returns (loss, number
    of correct predictions)."""
    loss, sim = solo_step(model, optimizer, x, y, check=True, precision=precision)
    return float(loss), int((sim.argmax(1) == y).sum())


@torch.inference_mode()
def represent(model: Classifier, x: torch.Tensor, batch_size: int = EVAL_BATCH) -> torch.Tensor:
    """Representations of every row of x, in eval mode, on the model's device (rows held
    on the host are copied there a chunk at a time)."""
    was_training = model.training
    model.eval()
    device = model.head.W.device
    try:
        with ieee_float32(device):
            return torch.cat([model.encoder(x[i : i + batch_size].to(device, non_blocking=True))
                              for i in range(0, len(x), batch_size)])
    finally:
        model.train(was_training)


@torch.inference_mode()
def accuracy(model: Classifier, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose argmax similarity is the true class."""
    if len(y) == 0:
        return float("nan")
    return accuracy_of(model, represent(model, x), y)


@torch.inference_mode()
def accuracy_of(model: Classifier, h: torch.Tensor, y: torch.Tensor) -> float:
    """:func:`accuracy` from the rows' representations ``h``."""
    if len(y) == 0:
        return float("nan")
    with ieee_float32(model.head.W.device):
        preds = model.head.similarities(h).argmax(1)
    return float((preds == y).float().mean())


@dataclass
class Run:
    """Mutable state of one training run; ``checkpoint()`` snapshots it."""

    spec: ExperimentSpec
    data: Dataset
    model: Classifier
    optimizer: torch.optim.Optimizer
    shuffle: torch.Generator
    device: torch.device
    epoch: int = 0
    record: Record = field(default_factory=Record)
    # The engine's switches for this run (CUDA graphs, corel.native): the caller's.
    options: EngineOptions = field(default_factory=EngineOptions, repr=False, compare=False)
    # The training step as a CUDA graph (corel.train.graphs), made on the first pass that takes one.
    graphed: GraphedSteps | None = field(default=None, repr=False, compare=False)
    # The model's dropout stream (corel.encoders.paper.dropout_stream); None without dropout.
    dropout: torch.Generator | None = field(default=None, repr=False, compare=False)
    # The best epoch's representations of the validation and test splits (on the host), as
    # its evaluation computed them: the final latent spaces, not computed again. Empty until
    # an epoch of this process improves (a resumed run's earlier best is not here).
    best_latents: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def history(self) -> list[EpochMetrics]:
        return self.record.history

    @property
    def best_epoch(self) -> int:
        return self.record.best_epoch

    @property
    def best_val_accuracy(self) -> float:
        return self.record.best_val_accuracy

    @property
    def test_accuracy(self) -> float | None:
        return self.record.test_accuracy

    @property
    def best_state(self) -> dict[str, torch.Tensor] | None:
        return self.record.best_state

    @property
    def precision(self) -> str:
        """The precision this run trains in (the spec's, where the device can)."""
        return effective_precision(self.device, self.spec.precision)

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume or serve: loadable with ``weights_only=True``."""
        return {
            "format": CHECKPOINT_FORMAT,
            "spec": self.spec.model_dump_json(),
            "epoch": self.epoch,
            "input_shape": list(self.data.input_shape),
            "num_classes": self.data.num_classes,
            "class_names": list(self.data.class_names),
            "preprocessing": json.dumps(self.data.preprocessing),
            "model": model_state(self.model),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(self.shuffle, self.device, self.dropout),
            **self.record.to_checkpoint(),
        }

    def best_checkpoint(self) -> dict[str, Any]:
        """A serving checkpoint whose model weights are those of the best-validation epoch."""
        ckpt = self.checkpoint()
        ckpt["model"] = self.best_state if self.best_state is not None else ckpt["model"]
        ckpt["epoch"] = self.best_epoch
        del ckpt["optimizer"], ckpt["rng"]
        ckpt["best"] = {k: v for k, v in ckpt["best"].items() if k != "model"}
        return ckpt


@dataclass
class FitResult:
    spec: ExperimentSpec
    model: Classifier  # with the best-validation weights loaded
    history: list[EpochMetrics]
    best_epoch: int
    best_val_accuracy: float
    test_accuracy: float | None
    stopped: bool
    run: Run
    # Why a stacked group's member failed to learn (a solo run raises NotLearningError).
    failed: str | None = None
    # A pruned member (corel.train.pruning): the rung it left at and why.
    pruned: dict[str, Any] | None = None

    def latent(self, split: str) -> torch.Tensor:
        """The best model's representations of a split (``train``, ``validation``, ``test``):
        those its best epoch's evaluation computed where this process has them, else
        computed now, reading the frozen outputs the run's epochs kept (a fine-tuned tower's
        frozen lower part is not run again for rows it has seen). Over MiniLM fine-tuned on
        its last 2 layers the final latent spaces took 98 s with neither, 33 s with the kept
        outputs alone."""
        if split in self.run.best_latents:
            return self.run.best_latents[split]
        x = {"train": self.run.data.x_train, "validation": self.run.data.x_val,
             "test": self.run.data.x_test}[split]
        kept = FROZEN_OUTPUTS if self.run.options.keep_frozen_outputs else None
        with frozen_outputs_kept(self.model, kept):
            return represent(self.model, x)

    @classmethod
    def from_run(cls, run: Run, stopped: bool, failed: str | None = None,
                 pruned: dict[str, Any] | None = None) -> FitResult:
        """The result of a finished (or stopped) run, with the best epoch's weights loaded.
        Its CUDA graph goes (training is over): the graph's memory pool is not held for as
        long as the result is (a worker embeds and stores latents after it); a run trained
        further captures a new one."""
        run.graphed = None
        if run.best_state is not None:
            load_model_state(run.model, run.best_state)
        return cls(
            spec=run.spec,
            model=run.model,
            history=list(run.history),
            best_epoch=run.best_epoch,
            best_val_accuracy=run.best_val_accuracy,
            test_accuracy=run.test_accuracy,
            stopped=stopped,
            run=run,
            failed=failed,
            pruned=pruned,
        )


def train_pass(run: Run, callbacks: Sequence[Callback] = ()) -> tuple[float, int] | None:
    """One pass over the training set in a seeded order: (summed loss, correct).

    Batches are gathered rows of the in-memory tensors; the order comes from the
    run's own generator, so it is reproducible and resumable. None if a callback
    asked to stop.

    Per step it does only the step and two writes: the labels are validated once for
    the pass, each step's loss and predictions go into buffers on the device, and the
    pass adds them up at its end (:func:`pass_totals`), so nothing waits for a GPU
    until the pass ends.
    """
    model, data = run.model, run.data
    model.train()
    n = len(data.y_train)
    check_labels(data.y_train, n, data.num_classes)
    batch = run.spec.batch_size
    batches = Batches(data.x_train, data.y_train, run.device, batch, torch.randperm(n, generator=run.shuffle))
    losses: list[torch.Tensor] = []
    predicted = torch.empty(n, dtype=torch.int64, device=run.device)
    per_epoch = -(-n // batch)
    first_step = run.epoch * per_epoch
    tower_group = run.optimizer.param_groups[0] if getattr(model.encoder, "tower", None) is not None else None
    # A fine-tuned encoder's steps read their batch's lengths and kept rows on the host: no graph.
    mode = "off" if tower_group is not None else pass_mode(run.options, run.device, data.x_train)
    if mode == "capture" and run.dropout is not None:
        mode = "off"  # the dropout stream is a generator a CUDA graph would have to register
    graphed = graphed_steps(mode, run.graphed, partial(_indexed_step, run))
    if graphed is not None:
        run.graphed = graphed

    def steps() -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """(start, loss, similarities) of each step, the loss kept past the next step."""
        if graphed is not None:  # by row indices, replayed from a CUDA graph (corel.train.graphs)
            for start in range(0, n, batch):
                loss, sim = graphed(batches.order[start : start + batch])
                yield start, loss.clone(), sim
        else:
            for start, xb, yb in batches:
                if tower_group is not None:  # a fine-tuned encoder's warm-up (corel.encoders.finetune)
                    tower_group["lr"] = warmed_up_lr(run.spec, first_step + start // batch, per_epoch)
                yield start, *solo_step(model, run.optimizer, xb, yb, check=False,
                                        precision=run.precision)

    with ieee_float32(run.device), dropout_stream(run.dropout):
        for step, (start, loss, sim) in enumerate(steps()):
            losses.append(loss)
            # Training accuracy from the similarities the loss used (before this step).
            torch.argmax(sim, 1, out=predicted[start : start + batch])
            if any(cb.on_batch_end(step) for cb in callbacks):
                return None
    total_loss, correct = pass_totals(torch.stack(losses), predicted, batches.labels, batch)
    return float(total_loss), int(correct)


def _indexed_step(run: Run, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.steps.solo_step` on the rows ``idx`` of the run's training data (held on its
    device)."""
    x, y = run.data.x_train, run.data.y_train
    return solo_step(run.model, run.optimizer, x.index_select(0, idx), y.index_select(0, idx),
                     check=False, precision=run.precision)


def pass_totals(
    losses: torch.Tensor, predicted: torch.Tensor, labels: torch.Tensor, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed loss, correct) of a pass from its per-step batch means ``losses`` (steps,
    ...) and its predictions ``predicted`` (..., n) of the rows ``labels`` (n,) or (..., n),
    in order: each batch mean times its batch's size, added up in float64 (as Python floats
    would). A stack's members are each added up as a row of their own, as a solo run's are:
    a member's total does not depend on how many members share its stack (summing down the
    columns of a (steps, members) tensor rounds by its width)."""
    n = labels.shape[-1]
    sizes = torch.full((losses.shape[0],), float(batch_size), dtype=torch.float64, device=losses.device)
    sizes[-1] = n - batch_size * (losses.shape[0] - 1)
    weighted = losses.double() * (sizes if losses.dim() == 1 else sizes.unsqueeze(1))
    return weighted.movedim(0, -1).contiguous().sum(-1), (predicted == labels).sum(-1)


def run_epoch(run: Run, callbacks: Sequence[Callback] = ()) -> EpochMetrics | None:
    """Train one epoch, then validate (and test, when validation improves)."""
    started = time.perf_counter()
    with frozen_outputs_kept(run.model, FROZEN_OUTPUTS if run.options.keep_frozen_outputs else None), \
            frozen_outputs_heard(_frozen_progress(run)):
        passed = train_pass(run, callbacks)
        if passed is None:
            return None
        total_loss, correct = passed
        model, data = run.model, run.data
        n = len(data.y_train)
        run.epoch += 1
        if model.head.uses_class_means:  # a pair-based loss predicts with the class means
            model.head.set_class_means(represent(model, data.x_train), data.y_train)
        val_h = represent(model, data.x_val)
        val_acc = accuracy_of(model, val_h, data.y_val)
        test_acc = None
        if run.record.improves(val_acc):
            test_h = represent(model, data.x_test)
            test_acc = accuracy_of(model, test_h, data.y_test)
            run.best_latents = {"validation": val_h.cpu(), "test": test_h.cpu()}
    return run.record.observe(
        run.epoch, train_loss=total_loss / n, train_accuracy=correct / n, val_accuracy=val_acc,
        seconds=time.perf_counter() - started, test_accuracy=test_acc,
        state=lambda: model_state(model))


def _frozen_progress(run: Run) -> Callable[[int], None] | None:
    """A fine-tuned run's frozen blocks' outputs, as they are computed (its first epoch in
    a process: 200 s over MiniLM on 2 cores, which showed no phase), reported to the
    options' ``on_features`` as a count over every split's rows."""
    report, record = run.options.on_features, EncoderRecord.of(run.data.preprocessing)
    if report is None or not run.spec.fine_tunes:
        return None
    name = f"{record.name if record is not None else 'the encoder'} (its frozen blocks)"
    total = len(run.data.y_train) + len(run.data.y_val) + len(run.data.y_test)
    done = 0

    def heard(rows: int) -> None:
        nonlocal done
        done += rows
        report(name, min(done, total), total)

    return heard


def start_run(
    spec: ExperimentSpec | dict[str, Any],
    *,
    data: Dataset | None = None,
    checkpoint: dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    options: EngineOptions | None = None,
) -> Run:
    """Build data, model and optimizer for a spec, fresh or from a checkpoint; ``options``:
    the engine's switches (:class:`EngineOptions`; default: the product's)."""
    if not isinstance(spec, ExperimentSpec):
        spec = ExperimentSpec.model_validate(spec)
    if checkpoint is not None:
        check_resumable(checkpoint, spec)
    dev = pick_device(device)
    options = options or EngineOptions()
    if data is None:
        data = load_dataset(spec, data_dir, features_dir=options.features_dir,
                            on_features=options.on_features, features_path=recorded_features(checkpoint),
                            features_store=options.features_store)
    if spec.fine_tunes and len(data.y_train) < spec.batch_size:
        raise ValueError(f"fine-tuning needs at least one full batch of training rows: this dataset gives "
                         f"{len(data.y_train)}, batch_size is {spec.batch_size}; lower batch_size to at most "
                         f"{len(data.y_train)}")
    if checkpoint is not None:
        check_same_encoder(checkpoint, data.preprocessing)
    data = to_device(data, dev)
    torch.manual_seed(spec.seed)
    model = build_model(spec, data, dev)
    optimizer = make_optimizer(model, spec.lr, spec.encoder_lr if spec.encoder_lr is not None else spec.lr / 10,
                               decay=fewshot_decay(spec, len(data.y_train)))
    shuffle = torch.Generator().manual_seed(spec.seed)
    dropout = dropout_generator(spec.seed, dev) if has_dropout(model) else None
    run = Run(spec, data, model, optimizer, shuffle, dev, options=options, dropout=dropout,
              record=Record(keep_last=spec.fewshot is not None))
    if checkpoint is not None:
        _restore(run, checkpoint)
    return run


def build_model(spec: ExperimentSpec, data: Dataset, device: torch.device) -> Classifier:
    """The spec's classifier for ``data``, on ``device``, in the data's precision.

    Initialised from the global RNG (seed it first) in float32 and then cast, so that a
    float64 model starts from exactly the float32 model's initial weights.
    """
    model = build_classifier(spec, data.input_shape, data.num_classes, data.preprocessing)
    if data.dtype != torch.float32:
        model = model.to(data.dtype)
    if spec.fewshot is not None and isinstance(model.head.W, nn.Parameter):  # at the shots' class means
        from corel.fewshot import class_means

        with torch.no_grad():
            model.head.W.copy_(class_means(data.x_train.flatten(1).to(model.head.W.dtype), data.y_train,
                                           data.num_classes))
    return model.to(device)


def fewshot_decay(spec: ExperimentSpec, rows: int) -> float:
    """A few-shot member's weight decay on its class vectors (its draw's ``l2`` over the
    ``rows`` it trains on, :func:`corel.fewshot.class_vector_decay`); 0 for any other run."""
    if spec.fewshot is None or not spec.fewshot.l2:
        return 0.0
    from corel.fewshot import class_vector_decay

    return class_vector_decay(spec.loss, spec.fewshot.l2, rows)


def make_optimizer(model: Classifier, lr: float, encoder_lr: float | None = None,
                   decay: float = 0.0) -> torch.optim.Adam:
    """The run's optimiser: :func:`adam` over the model's parameters; with a fine-tuned
    pretrained encoder, Adam over its groups (:func:`corel.encoders.finetune.optimizer_groups`:
    its tower's trainable parameters at ``encoder_lr``, the rest at ``lr``); with ``decay``
    (a few-shot member's, :func:`fewshot_decay`), Adam with that weight decay on the head's
    class vectors, as the protocol trains the member alone (:func:`corel.fewshot.decayed_adam`)."""
    if decay:
        from corel.fewshot import decayed_adam

        return decayed_adam([(n, p) for n, p in model.named_parameters() if p.requires_grad], lr, decay)
    groups = optimizer_groups(model, lr, encoder_lr)
    if groups is None:
        return adam(model.parameters(), lr)
    return torch.optim.Adam(groups, lr=lr)


def _restore(run: Run, ckpt: dict[str, Any]) -> None:
    load_model_state(run.model, ckpt["model"])
    run.optimizer.load_state_dict(optimizer_state(ckpt["optimizer"]))
    run.epoch = int(ckpt["epoch"])
    run.record = Record.from_checkpoint(ckpt, keep_last=run.spec.fewshot is not None)
    restore_rng(ckpt, run.shuffle, run.device, run.dropout)


def fit(
    spec: ExperimentSpec | dict[str, Any],
    callbacks: Iterable[Callback] = (),
    *,
    data: Dataset | None = None,
    checkpoint: dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    chance_epochs: int = CHANCE_EPOCHS,
    options: EngineOptions | None = None,
) -> FitResult:
    """Train ``spec.epochs`` epochs (continuing from ``checkpoint`` if given).

    Each callback's ``on_epoch_end(metrics, run)`` sees every finished epoch and
    may call ``run.checkpoint()`` to persist a resumable state. The returned
    model holds the weights of the best-validation epoch, and ``test_accuracy``
    is the test accuracy measured at that epoch.

    A run that :func:`not_learning` judges failed (at chance for ``chance_epochs`` or
    more epochs in a row, or with a non-finite loss) raises :class:`NotLearningError`,
    after the callbacks have seen that epoch; ``chance_epochs=0`` trains on regardless.

    ``options``: the engine's switches (:class:`EngineOptions`: CUDA graphs, corel.native),
    in force for this call only.
    """
    options = options or EngineOptions()
    run = start_run(spec, data=data, checkpoint=checkpoint, device=device, data_dir=data_dir,
                    options=options)
    cbs = [*callbacks, ChanceGuard(chance_accuracy(run.data.y_val), chance_epochs,
                                   len(run.data.y_val))]
    stopped = False
    with options.applied():
        while run.epoch < run.spec.epochs:
            metrics = run_epoch(run, cbs)
            if metrics is None or any(cb.on_epoch_end(metrics, run) for cb in cbs):
                stopped = True
                break
    return FitResult.from_run(run, stopped)
