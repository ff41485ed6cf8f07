"""Few labelled examples per class: corel's heads on a frozen encoder's features against a
linear probe, on the same seeded splits.

The protocol (:func:`run_fewshot`): a labelled table's rows are cut once, per class, into an
evaluation half and a pool (:func:`draw_splits`); for each number of shots N and each of S
seeded draws, N rows per class are drawn from the pool, every method trains on them alone,
and every method is scored on the same evaluation rows. The methods:

* ``probe``: scikit-learn's ``LogisticRegression(max_iter=100)`` on the features, MTEB's
  linear probe;
* ``selftrain`` (:func:`self_train`): the shots and the pool's other rows, unlabeled (their
  features, never their labels): Cosine-COREL's class vectors start at the shots' class
  means and move to the means of the rows they attract, and the probe is fitted on the shots
  and the rows each class holds most surely. It is the one method that reads more than the
  shots; the report names it, so a comparison on the shots alone leaves it out;
* each of corel's losses by name (:data:`corel.losses.LOSSES`): its head over the features,
  trained full-batch with Adam (:class:`HeadSettings`), the class vectors starting at the
  shots' class means; a method's draws train as one stack where the head allows
  (:func:`train_heads`), each member as it would alone. A pair-based loss (SupCon, TripletMargin, MultiSimilarity) predicts
  with class means, so it needs ``layer="linear"`` to learn anything over frozen features.

:class:`FewShotReport` gives, per N and method, the mean, sd, min and max accuracy over the
draws, the paired differences against the best method with their p-values (a paired t-test
over the same draws), and the wall time.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from corel.data.fewshot import (
    MAX_SPLITS,
    SHOTS,
    SPLITS,
    SelfTrainSettings,
    Splits,
    as_fewshot,
    draw_splits,
    pseudo_labels,
    text_labels,
)
from corel.loss_catalog import declaration
from corel.losses import LOSSES, LossHead, build_loss, check_labels
from corel.spec import ExperimentSpec

__all__ = ["MAX_SPLITS", "PROBE", "SELFTRAIN", "SHOTS", "SPLITS", "TUNED", "FewShotReport", "FewShotResult",
           "Fitted", "HeadSettings", "SelfTrainSettings", "Splits", "TuneSettings", "as_fewshot", "class_means",
           "class_vector_decay", "decayed_adam", "draw_splits", "finetune_fewshot", "minibatches", "protocol_labels", "run_fewshot", "self_train",
           "train_head", "train_heads", "warmup_linear"]

PROBE = "probe"
"""The linear probe's name among the methods."""
SELFTRAIN = "selftrain"
"""The self-trained method's name among the methods: it reads the pool's unlabeled rows too
(:func:`self_train`)."""
LAYERS = ("none", "linear")
INITS = ("means", "random")


def protocol_labels(spec: ExperimentSpec, data_dir: Any = None) -> tuple[np.ndarray, list[str]]:
    """The labels of the rows :func:`as_fewshot` cuts for ``spec``'s dataset (its training and
    validation rows, in that order) and the class names, computing no inputs: no encoder's
    features, no word vectors. What a request for a few-shot protocol is checked against
    (:func:`draw_splits`) before any run starts."""
    from pathlib import Path

    from corel.data import load_dataset

    plain = spec.model_copy(update={"encoder": None, "encoder_mode": None, "encoder_path": None,
                                    "fewshot": None, "train_subset": None})
    root = Path(data_dir).expanduser() if data_dir is not None else None
    found = text_labels(plain, root)
    if found is not None:
        return found
    data = load_dataset(plain, root)
    return torch.cat([data.y_train, data.y_val]).numpy(), list(data.class_names)


@dataclass(frozen=True)
class HeadSettings:
    """How a head trains on the shots: full-batch Adam at ``lr`` for ``steps`` steps, its
    class vectors starting at the shots' class means (``init="means"``) or as the loss's own
    initialisation (``"random"``), over the features themselves (``layer="none"``) or over a
    square linear map of them that starts as the identity (``"linear"``). ``params``: spec
    fields for the losses (lam, gamma, ...; the spec's defaults otherwise).

    ``l2``: the linear probe's penalty on the class vectors, ``l2 |W|^2 / (2 n)`` added to the
    mean loss over the n rows trained on (Adam's weight decay of ``l2 / n`` on W: the same
    gradient), for the heads whose scores grow with their vectors' length (dot product and
    Gaussian: :func:`class_vector_decay`); 0 for none. With ``l2=1`` CCE's objective is
    scikit-learn's ``LogisticRegression`` at its default C = 1, MTEB's probe: without it the
    heads fit the shots too closely (on AG News over MiniLM, CCE 2.2, 2.5 and 1.5 points
    under the probe at 8, 16 and 64 shots; docs/benchmarks.md)."""

    lr: float = 1e-2
    steps: int = 100
    init: str = "means"
    layer: str = "none"
    params: dict[str, Any] = field(default_factory=dict)
    l2: float = 1.0

    def __post_init__(self) -> None:
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ValueError(f"lr must be a positive number; got {self.lr}")
        if not (self.l2 >= 0 and math.isfinite(self.l2)):
            raise ValueError(f"l2 must be a number of at least 0 (0: no penalty); got {self.l2}")
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1; got {self.steps}")
        if self.init not in INITS:
            raise ValueError(f"unknown init {self.init!r}; allowed: {', '.join(INITS)}")
        if self.layer not in LAYERS:
            raise ValueError(f"unknown layer {self.layer!r}; allowed: {', '.join(LAYERS)}")


def class_vector_decay(loss: str, l2: float, rows: int) -> float:
    """Adam's weight decay on loss ``loss``'s class vectors for the penalty ``l2 |W|^2 / (2 n)``
    over ``rows`` rows (:class:`HeadSettings`' ``l2``): ``l2 / rows`` for a head whose scores
    grow with the vectors' length (dot product, Gaussian), 0 for one that normalises them
    (cosine: the penalty would only shrink them, which speeds up Adam's steps on them) or
    has none (a pair-based loss)."""
    if not (l2 >= 0 and math.isfinite(l2)):
        raise ValueError(f"l2 must be a number of at least 0 (0: no penalty); got {l2}")
    if rows < 1:
        raise ValueError(f"rows must be at least 1; got {rows}")
    known = declaration(loss)
    return l2 / rows if l2 and known.class_vectors and known.similarity in ("dot", "gaussian") else 0.0


def decayed_adam(named: Sequence[tuple[str, torch.Tensor]], lr: float, decay: float) -> torch.optim.Adam:
    """Adam at ``lr`` over the named parameters, the class vectors (``head.W``) with weight
    decay ``decay`` and the rest without (one group where ``decay`` is 0)."""
    if not decay:
        return torch.optim.Adam([p for _, p in named], lr=lr)
    groups: list[dict[str, Any]] = [{"params": [p for name, p in named if name == "head.W"], "weight_decay": decay},
                                    {"params": [p for name, p in named if name != "head.W"]}]
    return torch.optim.Adam(groups, lr=lr)


def class_means(x: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Each class's mean row of ``x`` (a class with no rows: zeros)."""
    sums = torch.zeros(num_classes, x.shape[1], dtype=x.dtype).index_add_(0, y, x)
    counts = torch.bincount(y, minlength=num_classes).clamp_min(1).to(x.dtype)
    return sums / counts[:, None]


@dataclass
class Fitted:
    """A head trained on a draw's shots (over ``layer``): called on features, its predicted
    classes."""

    head: LossHead
    layer: nn.Module
    dtype: torch.dtype

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.head.predict(self.layer(features.to(self.dtype)))


def _build_head(loss: str, x: torch.Tensor, y: torch.Tensor, num_classes: int, params: dict[str, Any],
                init: str = "means", seed: int | None = None) -> LossHead:
    """Loss ``loss``'s head for features ``x`` (``params``: spec fields for the loss), its
    class vectors at the shots' class means where ``init`` says so; its parameters drawn
    from ``seed`` (None: from torch's generator as it stands)."""
    if seed is not None:
        torch.manual_seed(seed)
    fields = ExperimentSpec(dataset="digits").model_dump()
    head = build_loss(loss, num_classes, x.shape[1], **{**fields, **params}).to(x.dtype)
    if init == "means" and isinstance(head.W, nn.Parameter):
        with torch.no_grad():
            head.W.copy_(class_means(x, y, num_classes))
    return head


def _train_steps(forward: Callable[[], torch.Tensor], head: LossHead, y: torch.Tensor,
                 optimizer: torch.optim.Optimizer, steps: int,
                 after: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
    """``steps`` full-batch steps of ``head``'s loss on ``forward()``'s rows (labels ``y``):
    class means set before each step where the loss keeps them, its ``after_batch`` on the
    step's rows (or on ``after(rows)``, e.g. the rows again under the stepped layer)."""
    for _ in range(steps):
        h = forward()
        if head.uses_class_means:
            head.set_class_means(h.detach(), y)
        value = head(h, y)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        head.after_batch((after(h) if after is not None else h).detach(), y)


def train_head(loss: str, x: torch.Tensor, y: torch.Tensor, num_classes: int,
               settings: HeadSettings | None = None, seed: int = 0) -> Fitted:
    """Loss ``loss``'s head trained on features ``x`` (N, D) with labels ``y``, as
    :class:`HeadSettings` says; the :class:`Fitted` head predicts other features' classes."""
    settings = settings or HeadSettings()
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; allowed: {', '.join(LOSSES)}")
    head = _build_head(loss, x, y, num_classes, settings.params, settings.init, seed)
    layer: nn.Module = nn.Identity()
    if settings.layer == "linear":
        linear = nn.Linear(x.shape[1], x.shape[1], bias=False).to(x.dtype)
        with torch.no_grad():
            linear.weight.copy_(torch.eye(x.shape[1], dtype=x.dtype))
        layer = linear
    trained = [(f"layer.{name}", p) for name, p in layer.named_parameters() if p.requires_grad]
    trained += [(f"head.{name}", p) for name, p in head.named_parameters() if p.requires_grad]
    if trained:
        optimizer = decayed_adam(trained, settings.lr, class_vector_decay(loss, settings.l2, len(y)))
        _train_steps(lambda: layer(x), head, y, optimizer, settings.steps,
                     (lambda _: layer(x)) if settings.layer == "linear" else None)
    with torch.no_grad():
        if head.uses_class_means:
            head.set_class_means(layer(x), y)
    return Fitted(head, layer, x.dtype)


class _Unchecked(nn.Module):
    """A head's training loss without its label check (a data-dependent branch, which
    ``torch.vmap`` cannot run; the protocol checks its labels once)."""

    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.head = head

    def forward(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.head.loss_and_similarities(h, labels, check=False)[0]  # type: ignore[operator]
        return loss


def _stacks(head: LossHead, settings: HeadSettings) -> bool:
    """Whether members of this head train as one stack: over the features themselves, with
    no hook that moves state between steps (Center loss's centers, class means)."""
    return (settings.layer == "none" and not head.uses_class_means
            and type(head).after_batch is LossHead.after_batch)


def train_heads(loss: str, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], num_classes: int,
                settings: HeadSettings | None = None, seeds: Sequence[int] | None = None
                ) -> list[Fitted]:
    """:func:`train_head` for M members at once (one per draw: features ``xs[m]`` of the same
    shape, labels ``ys[m]``, seed ``seeds[m]``), trained as one stack where the head allows
    (:func:`torch.vmap` over the members' class vectors and rows, one Adam over the stacked
    parameters: Adam is elementwise, so each member steps as it would alone); otherwise one
    after another. Each member ends as :func:`train_head` would train it alone."""
    settings = settings or HeadSettings()
    seeds = list(seeds) if seeds is not None else list(range(len(xs)))
    if not (len(xs) == len(ys) == len(seeds)) or not xs:
        raise ValueError(f"need one labels array and seed per member; got {len(xs)} features, "
                         f"{len(ys)} labels, {len(seeds)} seeds")
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; allowed: {', '.join(LOSSES)}")
    shapes = {tuple(x.shape) for x in xs}
    heads = [_build_head(loss, x, y, num_classes, settings.params, settings.init, seed) for x, y, seed in zip(xs, ys, seeds, strict=True)]
    if len(shapes) > 1 or not _stacks(heads[0], settings):
        return [train_head(loss, x, y, num_classes, settings, seed) for x, y, seed in zip(xs, ys, seeds, strict=True)]
    for y in ys:
        check_labels(y, len(y), num_classes)
    model = _Unchecked(heads[0])
    params = {name: torch.stack([dict(_Unchecked(h).named_parameters())[name].detach() for h in heads])
              .requires_grad_(True) for name, _ in model.named_parameters()}
    buffers = {name: torch.stack([dict(_Unchecked(h).named_buffers())[name] for h in heads])
               for name, _ in model.named_buffers()}
    x_all, y_all = torch.stack(list(xs)), torch.stack(list(ys))

    def member(p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, {**p, **b}, (x, y))

    stacked = torch.vmap(member)
    try:
        stacked(params, buffers, x_all, y_all)
    except Exception:  # a head whose kernels have no batching rule trains member by member
        return [train_head(loss, x, y, num_classes, settings, seed) for x, y, seed in zip(xs, ys, seeds, strict=True)]
    optimizer = decayed_adam(list(params.items()), settings.lr, class_vector_decay(loss, settings.l2, len(ys[0])))
    for _ in range(settings.steps):
        losses = stacked(params, buffers, x_all, y_all)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        optimizer.step()
    out = []
    for m, head in enumerate(heads):
        with torch.no_grad():
            for name, value in _Unchecked(head).named_parameters():
                value.copy_(params[name][m])
        out.append(Fitted(head, nn.Identity(), xs[m].dtype))
    return out


def _probe(x: np.ndarray, y: np.ndarray, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=100, random_state=seed).fit(x, y)
    return lambda rows: model.predict(rows)


def self_train(x: Any, y: Any, unlabeled: Any, num_classes: int, settings: SelfTrainSettings | None = None,
               seed: int = 0) -> Callable[[np.ndarray], np.ndarray]:
    """A classifier of features from the shots ``x`` (N, D) with labels ``y`` and the features
    of unlabeled rows ``unlabeled`` (U, D), as :class:`SelfTrainSettings` says: Cosine-COREL's
    class vectors, started at the shots' class means, are moved to the means of the rows they
    attract (the clusters the features already hold), and the linear probe is fitted on the
    shots with the unlabeled rows each class holds most surely
    (:func:`corel.data.fewshot.pseudo_labels` after one fit fewer; then the last fit). Called
    on features, it returns their predicted classes. Reads no label but ``y``'s."""
    settings = settings or SelfTrainSettings()
    if settings.refits < 1:
        raise ValueError(f"self_train ends with a fit of the probe: refits must be at least 1; got {settings.refits}")
    xs, xu = np.asarray(x, dtype=np.float64), np.asarray(unlabeled, dtype=np.float64)
    chosen, labels = pseudo_labels(xs, y, xu, num_classes, dataclasses.replace(settings, refits=settings.refits - 1),
                                   seed)
    return _probe(np.concatenate([xs, xu[chosen]]), np.concatenate([np.asarray(y), labels]), seed)


@dataclass(frozen=True)
class FewShotResult:
    """One method on one draw: its accuracy on the evaluation rows and its training time."""

    method: str
    shots: int
    split: int
    accuracy: float
    seconds: float


@dataclass
class FewShotReport:
    """Every method's result on every draw, and their summary (:meth:`summary`)."""

    results: list[FewShotResult]
    evaluation_rows: int
    seconds: float = 0.0

    def accuracies(self, method: str, shots: int) -> np.ndarray:
        """A method's accuracies at N shots, by draw."""
        found = sorted((r.split, r.accuracy) for r in self.results if r.method == method and r.shots == shots)
        return np.array([a for _, a in found])

    @property
    def shots(self) -> list[int]:
        return sorted({r.shots for r in self.results})

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(r.method for r in self.results))

    def ran(self, shots: int) -> list[str]:
        """The methods with a result at N shots (a costly one may run at fewer Ns, or on
        fewer draws)."""
        return list(dict.fromkeys(r.method for r in self.results if r.shots == shots))

    def best(self, shots: int) -> str:
        """The method with the highest mean accuracy at N shots (the first, on a tie)."""
        return max(self.ran(shots), key=lambda m: float(self.accuracies(m, shots).mean()))

    def paired(self, method: str, other: str, shots: int) -> tuple[np.ndarray, np.ndarray]:
        """Two methods' accuracies at N shots on the draws both ran, by draw."""
        mine = {r.split: r.accuracy for r in self.results if r.method == method and r.shots == shots}
        theirs = {r.split: r.accuracy for r in self.results if r.method == other and r.shots == shots}
        both = sorted(mine.keys() & theirs.keys())
        return np.array([mine[s] for s in both]), np.array([theirs[s] for s in both])

    def summary(self) -> list[dict[str, Any]]:
        """Per N and method: ``mean``, ``sd`` (over the draws; 0 for one), ``min``, ``max``,
        ``seconds`` (its training time over the draws), and against the best method at that
        N: ``diff`` (the mean of the paired differences, this minus the best, on the draws
        both ran) and ``p`` (a paired t-test's two-sided p-value; None for the best itself,
        one common draw, or equal figures)."""
        from scipy.stats import ttest_rel

        out = []
        for n in self.shots:
            best = self.best(n)
            for method in self.ran(n):
                acc = self.accuracies(method, n)
                mine, top = self.paired(method, best, n)
                diff = mine - top
                p = None
                if method != best and len(diff) > 1 and float(np.ptp(diff)) > 0:
                    p = float(ttest_rel(mine, top).pvalue)
                out.append({"shots": n, "method": method, "mean": float(acc.mean()),
                            "sd": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                            "min": float(acc.min()), "max": float(acc.max()),
                            "seconds": sum(r.seconds for r in self.results if r.method == method and r.shots == n),
                            "best": best, "diff": float(diff.mean()) if len(diff) else float("nan"), "p": p,
                            "splits": len(acc)})
        return out

    def table(self) -> str:
        """The summary as text, in percent: one block per N."""
        lines = []
        for n in self.shots:
            lines.append(f"N={n} per class ({self.evaluation_rows} evaluation rows)")
            lines.append(f"  {'method':<16}{'mean':>7}{'sd':>6}{'min':>7}{'max':>7}{'diff':>8}{'p':>9}{'s':>8}")
            for row in (r for r in self.summary() if r["shots"] == n):
                p = "best" if row["method"] == row["best"] else ("-" if row["p"] is None else f"{row['p']:.3g}")
                lines.append(f"  {row['method']:<16}{100 * row['mean']:>7.1f}{100 * row['sd']:>6.1f}"
                             f"{100 * row['min']:>7.1f}{100 * row['max']:>7.1f}{100 * row['diff']:>8.1f}{p:>9}"
                             f"{row['seconds']:>8.2f}")
        return "\n".join(lines)


def run_fewshot(features: Any, y: Any, *, methods: Sequence[str] | None = None,
                shots: Sequence[int] = SHOTS, splits: int = SPLITS, seed: int = 0,
                class_names: Sequence[str] | None = None, settings: HeadSettings | None = None,
                selftrain: SelfTrainSettings | None = None,
                on_result: Callable[[FewShotResult], None] | None = None) -> FewShotReport:
    """The few-shot protocol on a frozen encoder's ``features`` (N, D) and their labels:
    every method in ``methods`` (default: the probe, then every loss; ``selftrain`` where
    asked) on every draw of :func:`draw_splits`, scored on the same evaluation rows; the
    self-trained method reads the pool's rows but the draw's, unlabeled (``selftrain``: its
    settings). ``on_result`` hears each result as it comes."""
    started = time.perf_counter()
    x = torch.as_tensor(np.asarray(features), dtype=torch.float32)
    labels = np.asarray(y)
    if x.ndim != 2 or len(x) != len(labels):
        raise ValueError(f"features must be (rows, width) with one label per row; got {tuple(x.shape)} "
                         f"and {len(labels)} labels")
    chosen = list(methods) if methods is not None else [PROBE, *LOSSES]
    unknown = [m for m in chosen if m not in (PROBE, SELFTRAIN) and m not in LOSSES]
    if unknown or not chosen:
        raise ValueError(f"unknown method {unknown[0] if unknown else None!r}; allowed: {PROBE}, {SELFTRAIN}, "
                         f"{', '.join(LOSSES)}")
    rows = draw_splits(labels, shots, splits, seed, class_names)
    classes = int(labels.max()) + 1
    x_eval, y_eval = x[rows.evaluation], labels[rows.evaluation]
    x_np = x.numpy()
    results: list[FewShotResult] = []
    for n, draws in rows.draws.items():
        for method in chosen:
            t0 = time.perf_counter()
            if method == PROBE:
                guessed = [np.asarray(_probe(x_np[train], labels[train], seed)(x_np[rows.evaluation]))
                           for train in draws]
            elif method == SELFTRAIN:  # the pool's other rows, unlabeled
                guessed = [self_train(x_np[train], labels[train], x_np[np.setdiff1d(rows.pool, train)], classes,
                                      selftrain, seed)(x_np[rows.evaluation]) for train in draws]
            else:  # the draws' members as one stack where the head allows
                fitted = train_heads(method, [x[train] for train in draws],
                                     [torch.as_tensor(labels[train]) for train in draws], classes, settings,
                                     seeds=[seed * 1000 + s for s in range(len(draws))])
                guessed = [f(x_eval).numpy() for f in fitted]
            each = (time.perf_counter() - t0) / len(draws)  # the method's time, shared by its draws
            for s, found in enumerate(guessed):
                result = FewShotResult(method, n, s, float((found == y_eval).mean()), each)
                results.append(result)
                if on_result is not None:
                    on_result(result)
    return FewShotReport(results, len(rows.evaluation), time.perf_counter() - started)


SCORES = ("head", "probe")
TUNED = "finetune"
"""The prefix of a fine-tuned method's name: ``finetune-cosine`` is Cosine-COREL's."""


@dataclass(frozen=True)
class TuneSettings:
    """How the encoder is fine-tuned on a draw's shots (:func:`finetune_fewshot`): its last
    ``blocks`` blocks and loss ``loss``'s head over its output (the class vectors starting at
    the shots' class means under the pretrained encoder), full-batch Adam for ``steps`` steps,
    the blocks at ``encoder_lr`` and the head at ``lr``; scored by the head's own prediction
    (``score="head"``) or by the linear probe fitted on the fine-tuned encoder's vectors of the
    shots (``"probe"``, as SetFit scores). ``params``: spec fields for the loss (lam, gamma,
    ...).

    SetFit's schedule, where asked: ``batch`` shots a step (mini-batches in an order drawn from
    the draw's seed, each shot once before any shot twice; None: every shot every step) and
    ``warmup``, a fraction of the steps over which the rates rise linearly from nothing, then
    fall linearly to nothing at the last step, with AdamW (torch's weight decay, 0.01; None:
    Adam at constant rates). ``average``: the blocks' and the head's weights end as their mean
    over the steps from that fraction of them on (stochastic weight averaging; None: the last
    step's weights). At N=8 on AG News, all 6 of MiniLM's blocks so (``blocks=6, steps=80,
    encoder_lr=2e-5, batch=16, warmup=0.1``) gave 82.5 on the 10 draws against the defaults'
    81.5, and 82.8 with ``average=0.5`` (docs/benchmarks.md)."""

    loss: str = "cosine"
    blocks: int = 2
    steps: int = 30
    lr: float = 1e-2
    encoder_lr: float = 1e-4
    score: str = "head"
    params: dict[str, Any] = field(default_factory=dict)
    batch: int | None = None
    warmup: float | None = None
    average: float | None = None

    def __post_init__(self) -> None:
        if self.batch is not None and self.batch < 1:
            raise ValueError(f"batch must be at least 1 (or None: every shot every step); got {self.batch}")
        if self.warmup is not None and not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be a fraction of the steps, at least 0 and under 1 (or None: "
                             f"constant rates); got {self.warmup}")
        if self.average is not None and not 0 <= self.average < 1:
            raise ValueError(f"average must be the fraction of the steps after which the weights are averaged, "
                             f"at least 0 and under 1 (or None: the last step's weights); got {self.average}")
        if self.score not in SCORES:
            raise ValueError(f"unknown score {self.score!r}; allowed: {', '.join(SCORES)}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}; allowed: {', '.join(LOSSES)}")
        if self.blocks < 1:
            raise ValueError(f"blocks must be at least 1; got {self.blocks}")
        if self.steps < 0:
            raise ValueError(f"steps must be at least 0; got {self.steps}")
        for name in ("lr", "encoder_lr"):
            value = getattr(self, name)
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a positive number; got {value}")

    @property
    def method(self) -> str:
        return f"{TUNED}-{self.loss}"


def minibatches(rows: int, batch: int | None, steps: int, seed: int) -> list[torch.Tensor]:
    """Each step's rows (positions in ``range(rows)``): ``batch`` of them a step, in an order
    drawn from ``seed``, every row once before any row twice (a step may span two passes);
    every row every step where ``batch`` is None or at least ``rows``."""
    if batch is None or batch >= rows:
        return [torch.arange(rows)] * steps
    generator = torch.Generator().manual_seed(seed)
    order = torch.empty(0, dtype=torch.long)
    out = []
    for _ in range(steps):
        if len(order) < batch:
            order = torch.cat([order, torch.randperm(rows, generator=generator)])
        out.append(order[:batch])
        order = order[batch:]
    return out


def warmup_linear(steps: int, warmup: float | None) -> Callable[[int], float]:
    """The rate's factor at step ``i`` (from 0): rising linearly over the first ``warmup`` of
    the ``steps`` (at least one step), then falling linearly to 0 after the last; 1 throughout
    where ``warmup`` is None."""
    if warmup is None:
        return lambda i: 1.0
    warm = max(1, int(steps * warmup))
    return lambda i: (i + 1) / warm if i < warm else max(0.0, (steps - i) / max(steps - warm, 1))


def _scheduled_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, head: LossHead,
                     optimizer: torch.optim.Optimizer, settings: TuneSettings, seed: int) -> None:
    """``settings.steps`` steps on mini-batches of the shots (:func:`minibatches`) with the rates
    scheduled (:func:`warmup_linear`): each one :func:`_train_steps` step on its rows; with
    ``settings.average``, the trained weights end as their mean over the steps from that
    fraction on (:class:`TuneSettings`)."""
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(settings.steps, settings.warmup))
    trained = [p for p in (*model.parameters(), *head.parameters()) if p.requires_grad]
    first = None if settings.average is None else int(settings.steps * settings.average)
    averaged = [torch.zeros_like(p) for p in trained] if first is not None else []
    for i, idx in enumerate(minibatches(len(x), settings.batch, settings.steps, seed)):
        _train_steps(functools.partial(model, x[idx]), head, y[idx], optimizer, 1)
        schedule.step()
        if first is not None and i >= first:
            with torch.no_grad():  # the running mean of the weights after steps first..i
                for mean, p in zip(averaged, trained, strict=True):
                    mean.add_(p - mean, alpha=1.0 / (i - first + 1))
    if first is not None and settings.steps > first:
        with torch.no_grad():
            for mean, p in zip(averaged, trained, strict=True):
                p.copy_(mean)


def finetune_fewshot(texts: Sequence[str], y: Any, rows: Splits, shots: Sequence[int], *,
                     encoder: str = "minilm", encoder_path: Any = None, settings: TuneSettings | None = None,
                     seed: int = 0,
                     draws: int | None = None, kept: Any = None, first: int = 0,
                     on_result: Callable[[FewShotResult], None] | None = None) -> list[FewShotResult]:
    """The pretrained text ``encoder`` (a user's own: its files at ``encoder_path``) fine-tuned on each draw of ``rows`` (the
    ``draws`` draws of each N in ``shots`` from draw ``first``, default all from the first) with a COREL head, as :class:`TuneSettings` says, and
    scored by the head on the protocol's evaluation rows: one :class:`FewShotResult` per draw
    (method ``finetune-<loss>``; seconds: the training and the evaluation rows' prediction).

    The frozen lower part's output of each row is computed once and shared by every draw
    (``kept``: a :class:`corel.encoders.finetune.FrozenOutputs`, default a new one), so a
    draw runs only the trained blocks, over its shots and then over the evaluation rows.
    Each draw starts again from the pretrained weights, its dropout and head drawn from
    ``seed * 1000 + draw``."""
    from corel.encoders import load, run_preprocessing
    from corel.encoders.finetune import FineTuned, FrozenOutputs, frozen_outputs_kept

    settings = settings or TuneSettings()
    labels = np.asarray(y)
    if len(texts) != len(labels):
        raise ValueError(f"need one label per text; got {len(texts)} texts and {len(labels)} labels")
    if first < 0:
        raise ValueError(f"first must be a draw's index, at least 0; got {first}")
    missing = [n for n in shots if n not in rows.draws]
    if missing:
        raise ValueError(f"no draws of N={missing[0]} in these splits; they hold N of "
                         f"{', '.join(str(n) for n in rows.draws)}")
    enc = load(run_preprocessing(encoder, "text", "finetune", encoder_path), encoder_path)
    inputs = enc.family.inputs(list(texts), enc)
    kept = kept if kept is not None else FrozenOutputs()
    classes = int(labels.max()) + 1
    x_eval, y_eval = inputs[rows.evaluation], labels[rows.evaluation]
    out: list[FewShotResult] = []
    for n in shots:
        for s, train in enumerate(rows.draws[n][first:None if draws is None else first + draws], start=first):
            started = time.perf_counter()
            torch.manual_seed(seed * 1000 + s)
            model = FineTuned(enc.family.tower(enc, settings.blocks), nn.Identity())
            x, target = inputs[train], torch.as_tensor(labels[train])
            with frozen_outputs_kept(model, kept):
                model.eval()
                with torch.no_grad():
                    start = model(x)
                head = _build_head(settings.loss, start, target, classes, settings.params)
                optimizer = (torch.optim.Adam if settings.warmup is None else torch.optim.AdamW)([
                    {"params": [p for p in model.parameters() if p.requires_grad], "lr": settings.encoder_lr},
                    {"params": [p for p in head.parameters() if p.requires_grad], "lr": settings.lr}])
                model.train()
                if settings.batch is None and settings.warmup is None and settings.average is None:
                    _train_steps(functools.partial(model, x), head, target, optimizer, settings.steps)
                else:
                    _scheduled_steps(model, x, target, head, optimizer, settings, seed * 1000 + s)
                model.eval()
                with torch.no_grad():
                    tuned = model(x)
                    if head.uses_class_means:
                        head.set_class_means(tuned, target)
                    h_eval = model(x_eval)
                    if settings.score == "probe":
                        fitted = _probe(tuned.numpy(), labels[train], seed)
                        guessed = np.asarray(fitted(h_eval.numpy()))
                    else:
                        guessed = head.predict(h_eval).numpy()
            result = FewShotResult(settings.method, n, s, float((guessed == y_eval).mean()),
                                   time.perf_counter() - started)
            out.append(result)
            if on_result is not None:
                on_result(result)
    return out
