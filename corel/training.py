"""The training loop: ``train_step`` -> ``run_epoch`` -> ``fit``.

The paper's protocol is the default: Adam, lr 1e-4, batch 128, 150 epochs, and
the reported test accuracy is the one at the epoch of best validation accuracy.
Batches are drawn by index from in-memory tensors (no per-sample DataLoader).

Precision follows the data: float32 by default, float64 for a dataset cast with
``Dataset.astype(torch.float64)`` (the model is then built and trained in float64).

Determinism: for a given seed on CPU a run is bit-for-bit reproducible, and a
run resumed from a checkpoint ends with the same weights as an uninterrupted
one, because the checkpoint carries the shuffling generator's state and the
global RNG state (dropout) along with model, head and optimizer state.
"""

from __future__ import annotations

import copy
import io
import itertools
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from corel.data import Dataset, load_dataset
from corel.loss_catalog import declaration
from corel.losses import _check_labels
from corel.models import Classifier, build_classifier
from corel.spec import ExperimentSpec

__all__ = [
    "CHANCE_EPOCHS",
    "CHECKPOINT_FORMAT",
    "Callback",
    "ChanceGuard",
    "EpochMetrics",
    "FitResult",
    "NotLearningError",
    "Run",
    "accuracy",
    "build_model",
    "chance_accuracy",
    "checkpoint_from_bytes",
    "checkpoint_to_bytes",
    "embed_all",
    "fit",
    "model_from_checkpoint",
    "not_learning",
    "pick_device",
    "run_epoch",
    "start_run",
    "train_pass",
    "train_step",
]

CHECKPOINT_FORMAT = 1
EVAL_BATCH = 2048
# The fewest epochs at chance in a row after which a run has failed (see not_learning).
CHANCE_EPOCHS = 5


@dataclass(frozen=True)
class EpochMetrics:
    """What one epoch produced. ``test_accuracy`` is measured only when validation improves."""

    epoch: int  # 1-based
    train_loss: float
    train_accuracy: float
    val_accuracy: float
    seconds: float
    is_best: bool
    test_accuracy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Callback:
    """Receives progress; return True from a hook to ask training to stop."""

    def on_epoch_end(self, metrics: EpochMetrics, run: Run) -> bool | None:
        return None

    def on_batch_end(self, step: int) -> bool | None:
        return None


class NotLearningError(ValueError):
    """Training stopped because the model is not learning (see :func:`not_learning`)."""


def chance_accuracy(labels: torch.Tensor) -> float:
    """The accuracy of always answering the most frequent class of ``labels``."""
    if len(labels) == 0:
        return float("nan")
    return float(torch.bincount(labels).max()) / len(labels)


_UNBOUNDED = ("{loss} with lam = {lam} < {least:g} has no minimum: its loss falls "
              "without bound as the representations move away from every class vector, so "
              "the repulsion wins and training diverges. Use lam >= {least:g}.")


def chance_ceiling(chance: float, n_val: int | None = None) -> float:
    """The highest validation accuracy still "at chance": 5% of the way from chance to
    perfect (0.145 for ten balanced classes), or two standard errors of an accuracy that
    is chance on ``n_val`` rows, whichever is more (a small validation set is noisy:
    0.2 above chance for 22 rows of three classes)."""
    margin = 0.05 * (1.0 - chance)
    if n_val:
        margin = max(margin, 2.0 * math.sqrt(chance * (1.0 - chance) / n_val))
    return chance + margin


def not_learning(
    history: Sequence[EpochMetrics], chance: float, spec: ExperimentSpec, epochs: int = CHANCE_EPOCHS,
    n_val: int | None = None,
) -> str | None:
    """Why a run has failed to train, or None while it has not.

    "At chance" is a validation accuracy at most :func:`chance_ceiling` (``n_val``: the
    number of validation rows, for the noise of a small set). A run has failed when

    * its training loss is not finite;
    * it is Gaussian-COREL with lam < 0.5, whose loss has no minimum, and either its
      training loss has been negative and falling for ``epochs`` epochs (a loss that
      cannot go below 0 at lam >= 0.5: the representations are running away, whatever
      the accuracy of the moment) or it has been at chance for that long;
    * it has been at chance for its last ``max(epochs, spec.epochs / 3)`` epochs: it
      never learned, or learned and then collapsed. (A slow start is not a failure:
      Center loss at lam 0.7 on AG News sits at chance for 10 of 40 epochs, then
      reaches 83%.)
    * it has finished, however few its epochs, and never got above chance: a run at
      chance is not a success, whatever its length.

    ``epochs=0`` turns the check off.
    """
    if not history or epochs <= 0 or math.isnan(chance):
        return None  # (no validation rows: nothing to judge by)
    last = history[-1]
    if not math.isfinite(last.train_loss):
        return (f"the training loss became {last.train_loss} at epoch {last.epoch}: training "
                f"diverged. Try a smaller learning rate (the paper's is 1e-4).")
    decl = declaration(spec.loss)
    least = decl.min_lam  # below it the loss has no minimum (the declaration says where)
    diverging = least is not None and spec.lam < least
    unbounded = _UNBOUNDED.format(loss=decl.display, lam=spec.lam, least=least or 0.0)
    if diverging and len(history) >= epochs:
        losses = [m.train_loss for m in history[-epochs:]]
        if losses[0] < 0 and all(b < a for a, b in itertools.pairwise(losses)):
            return (f"the model is not learning: its training loss has been negative and "
                    f"falling for {epochs} epochs (now {last.train_loss:.4g}), so the "
                    f"representations are running away. {unbounded}")
    patience = epochs if diverging else max(epochs, math.ceil(spec.epochs / 3))
    ceiling = chance_ceiling(chance, n_val)
    best = max(history, key=lambda m: m.val_accuracy)
    finished = len(history) >= spec.epochs
    if finished and best.val_accuracy <= ceiling:
        patience = len(history)
    elif len(history) < patience or any(m.val_accuracy > ceiling for m in history[-patience:]):
        return None
    span = f"{patience} epochs" if patience != 1 else "its one epoch"
    story = (f"validation accuracy has stayed at chance for {span} (at most "
             f"{max(m.val_accuracy for m in history[-patience:]):.3f}; always answering the most "
             f"frequent class scores {chance:.3f})")
    if best.val_accuracy > ceiling:
        story += f", after reaching {best.val_accuracy:.3f} at epoch {best.epoch}"
    if diverging:
        why = unbounded
    else:
        why = (f"Try a smaller learning rate (the paper's is 1e-4; this run's is {spec.lr:g})"
               + (" or another lam" if "lam" in decl.params else "") + ".")
    return f"the model is not learning: {story}. {why}"


class ChanceGuard(Callback):
    """Ends training with :class:`NotLearningError` once :func:`not_learning` says so."""

    def __init__(self, chance: float, epochs: int = CHANCE_EPOCHS, n_val: int | None = None) -> None:
        self.chance = chance
        self.epochs = epochs
        self.n_val = n_val

    def on_epoch_end(self, metrics: EpochMetrics, run: Run) -> bool | None:
        verdict = not_learning(run.history, self.chance, run.spec, self.epochs, self.n_val)
        if verdict is not None:
            raise NotLearningError(verdict)
        return None


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The given device, else CUDA when this machine has a GPU, else CPU."""
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_step(
    model: Classifier, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> tuple[float, int]:
    """One Adam step on a batch; returns (loss, number of correct predictions)."""
    loss, correct = _step(model, optimizer, x, y, check=True)
    return float(loss), int(correct)


def _step(
    model: Classifier, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
    check: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`train_step` with its results left as tensors on the model's device."""
    optimizer.zero_grad(set_to_none=True)
    loss, h, sim = model.loss(x, y, check=check)
    loss.backward()
    optimizer.step()
    model.head.after_batch(h.detach(), y)
    # Training accuracy from the similarities the loss used (before this step).
    correct = (sim.detach().argmax(1) == y).sum()
    return loss.detach(), correct


@torch.inference_mode()
def embed_all(model: Classifier, x: torch.Tensor, batch_size: int = EVAL_BATCH) -> torch.Tensor:
    """Representations of every row of x, in eval mode, on x's device."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat([model.encoder(x[i : i + batch_size]) for i in range(0, len(x), batch_size)])
    finally:
        model.train(was_training)


@torch.inference_mode()
def accuracy(model: Classifier, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows whose argmax similarity is the true class."""
    if len(y) == 0:
        return float("nan")
    preds = model.head.similarities(embed_all(model, x)).argmax(1)
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
    history: list[EpochMetrics] = field(default_factory=list)
    best_epoch: int = 0
    best_val_accuracy: float = -1.0
    test_accuracy: float | None = None
    best_state: dict[str, torch.Tensor] | None = None

    def checkpoint(self) -> dict[str, Any]:
        """Everything needed to resume or serve: loadable with ``weights_only=True``."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "shuffle": self.shuffle.get_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "format": CHECKPOINT_FORMAT,
            "spec": self.spec.model_dump_json(),
            "epoch": self.epoch,
            "input_shape": list(self.data.input_shape),
            "num_classes": self.data.num_classes,
            "class_names": list(self.data.class_names),
            "preprocessing": json.dumps(self.data.preprocessing),
            "model": _cpu_state(self.model.state_dict()),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng,
            "history": [m.to_dict() for m in self.history],
            "best": {
                "epoch": self.best_epoch,
                "val_accuracy": self.best_val_accuracy,
                "test_accuracy": self.test_accuracy,
                "model": self.best_state,
            },
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

    @classmethod
    def from_run(cls, run: Run, stopped: bool) -> FitResult:
        """The result of a finished (or stopped) run, with the best epoch's weights loaded."""
        if run.best_state is not None:
            run.model.load_state_dict(run.best_state)
        return cls(
            spec=run.spec,
            model=run.model,
            history=list(run.history),
            best_epoch=run.best_epoch,
            best_val_accuracy=run.best_val_accuracy,
            test_accuracy=run.test_accuracy,
            stopped=stopped,
            run=run,
        )


def _cpu_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


def train_pass(run: Run, callbacks: Sequence[Callback] = ()) -> tuple[float, int] | None:
    """One pass over the training set in a seeded order: (summed loss, correct).

    Batches are gathered rows of the in-memory tensors; the order comes from the
    run's own generator, so it is reproducible and resumable. None if a callback
    asked to stop.

    Per step it does only the step: the labels are validated once for the pass, and
    the loss and correct counts add up on the device (in float64, as Python floats
    would), so nothing waits for a GPU until the pass ends.
    """
    model, data = run.model, run.data
    model.train()
    n = len(data.y_train)
    _check_labels(data.y_train, n, data.num_classes)
    order = torch.randperm(n, generator=run.shuffle).to(run.device)
    x, y = data.x_train, data.y_train
    total_loss = torch.zeros((), dtype=torch.float64, device=run.device)
    correct = torch.zeros((), dtype=torch.int64, device=run.device)
    for step, start in enumerate(range(0, n, run.spec.batch_size)):
        idx = order[start : start + run.spec.batch_size]
        # index_select: the same rows as x[idx], gathered ~2.5x faster.
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        loss, ok = _step(model, run.optimizer, xb, yb, check=False)
        total_loss += loss.double() * len(idx)
        correct += ok
        if any(cb.on_batch_end(step) for cb in callbacks):
            return None
    return float(total_loss), int(correct)


def run_epoch(run: Run, callbacks: Sequence[Callback] = ()) -> EpochMetrics | None:
    """Train one epoch, then validate (and test, when validation improves)."""
    started = time.perf_counter()
    passed = train_pass(run, callbacks)
    if passed is None:
        return None
    total_loss, correct = passed
    model, data = run.model, run.data
    n = len(data.y_train)
    run.epoch += 1
    if model.head.uses_class_means:  # a pair-based loss predicts with the class means
        model.head.set_class_means(embed_all(model, data.x_train), data.y_train)
    val_acc = accuracy(model, data.x_val, data.y_val)
    is_best = val_acc > run.best_val_accuracy
    test_acc = None
    if is_best:
        test_acc = accuracy(model, data.x_test, data.y_test)
        run.best_epoch, run.best_val_accuracy, run.test_accuracy = run.epoch, val_acc, test_acc
        run.best_state = _cpu_state(model.state_dict())
    metrics = EpochMetrics(
        epoch=run.epoch,
        train_loss=total_loss / n,
        train_accuracy=correct / n,
        val_accuracy=val_acc,
        seconds=time.perf_counter() - started,
        is_best=is_best,
        test_accuracy=test_acc,
    )
    run.history.append(metrics)
    return metrics


def _to_device(data: Dataset, device: torch.device) -> Dataset:
    if device.type == "cpu":
        return data
    moved = copy.copy(data)
    for name in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test"):
        setattr(moved, name, getattr(data, name).to(device))
    return moved


def start_run(
    spec: ExperimentSpec | dict[str, Any],
    *,
    data: Dataset | None = None,
    checkpoint: dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> Run:
    """Build data, model and optimizer for a spec, fresh or from a checkpoint."""
    if not isinstance(spec, ExperimentSpec):
        spec = ExperimentSpec.model_validate(spec)
    if checkpoint is not None:
        # Where the files are is not part of a run's identity: a run resumed on
        # another machine reads the same data from another path.
        where = {"dataset_path", "word_vectors"}
        saved = ExperimentSpec.model_validate_json(checkpoint["spec"])
        if saved.model_dump(exclude=where) != spec.model_dump(exclude=where):
            raise ValueError("the checkpoint was made for a different spec; cannot resume from it")
    dev = pick_device(device)
    if data is None:
        data = load_dataset(spec, data_dir)
    data = _to_device(data, dev)
    torch.manual_seed(spec.seed)
    model = build_model(spec, data, dev)
    optimizer = make_optimizer(model, spec.lr)
    shuffle = torch.Generator().manual_seed(spec.seed)
    run = Run(spec, data, model, optimizer, shuffle, dev)
    if checkpoint is not None:
        _restore(run, checkpoint)
    return run


def build_model(spec: ExperimentSpec, data: Dataset, device: torch.device) -> Classifier:
    """The spec's classifier for ``data``, on ``device``, in the data's precision.

    Initialised from the global RNG (seed it first) in float32 and then cast, so that a
    float64 model starts from exactly the float32 model's initial weights.
    """
    model = build_classifier(spec, data.input_shape, data.num_classes)
    if data.dtype != torch.float32:
        model = model.to(data.dtype)
    return model.to(device)


def make_optimizer(model: Classifier, lr: float) -> torch.optim.Adam:
    """Adam (the paper's optimiser), fused into one kernel per step where torch has one."""
    try:
        return torch.optim.Adam(model.parameters(), lr=lr, fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.Adam(model.parameters(), lr=lr)


def _restore(run: Run, ckpt: dict[str, Any]) -> None:
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"unsupported checkpoint format {ckpt.get('format')!r}")
    run.model.load_state_dict(ckpt["model"])
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.epoch = int(ckpt["epoch"])
    run.history = [EpochMetrics(**m) for m in ckpt["history"]]
    best = ckpt["best"]
    run.best_epoch, run.best_val_accuracy = int(best["epoch"]), float(best["val_accuracy"])
    run.test_accuracy = best["test_accuracy"]
    run.best_state = best["model"]
    torch.set_rng_state(ckpt["rng"]["torch"])
    run.shuffle.set_state(ckpt["rng"]["shuffle"])
    if "cuda" in ckpt["rng"] and run.device.type == "cuda":
        torch.cuda.set_rng_state(ckpt["rng"]["cuda"], run.device)


def fit(
    spec: ExperimentSpec | dict[str, Any],
    callbacks: Iterable[Callback] = (),
    *,
    data: Dataset | None = None,
    checkpoint: dict[str, Any] | None = None,
    device: str | torch.device | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    chance_epochs: int = CHANCE_EPOCHS,
) -> FitResult:
    """Train ``spec.epochs`` epochs (continuing from ``checkpoint`` if given).

    Each callback's ``on_epoch_end(metrics, run)`` sees every finished epoch and
    may call ``run.checkpoint()`` to persist a resumable state. The returned
    model holds the weights of the best-validation epoch, and ``test_accuracy``
    is the test accuracy measured at that epoch.

    A run that :func:`not_learning` judges failed (at chance for ``chance_epochs`` or
    more epochs in a row, or with a non-finite loss) raises :class:`NotLearningError`,
    after the callbacks have seen that epoch; ``chance_epochs=0`` trains on regardless.
    """
    run = start_run(spec, data=data, checkpoint=checkpoint, device=device, data_dir=data_dir)
    cbs = [*callbacks, ChanceGuard(chance_accuracy(run.data.y_val), chance_epochs,
                                   len(run.data.y_val))]
    stopped = False
    while run.epoch < run.spec.epochs:
        metrics = run_epoch(run, cbs)
        if metrics is None or any(cb.on_epoch_end(metrics, run) for cb in cbs):
            stopped = True
            break
    return FitResult.from_run(run, stopped)


def checkpoint_to_bytes(checkpoint: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(checkpoint, buf)
    return buf.getvalue()


def checkpoint_from_bytes(blob: bytes) -> dict[str, Any]:
    """Load a checkpoint without unpickling arbitrary objects (``weights_only=True``)."""
    ckpt: dict[str, Any] = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    return ckpt


def model_from_checkpoint(
    checkpoint: dict[str, Any], device: str | torch.device | None = None
) -> tuple[ExperimentSpec, Classifier]:
    """Rebuild the classifier a checkpoint holds, in eval mode, for serving.

    The model has the precision it was trained in (the checkpoint's ``head.W``).
    """
    spec = ExperimentSpec.model_validate_json(checkpoint["spec"])
    model = build_classifier(spec, tuple(checkpoint["input_shape"]), int(checkpoint["num_classes"]))
    dtype = checkpoint["model"]["head.W"].dtype
    if dtype != torch.float32:
        model = model.to(dtype)
    model.load_state_dict(checkpoint["model"])
    return spec, model.to(pick_device(device)).eval()
