"""Synchronous successive halving inside a stacked group.

Every member of a stacked group reaches each epoch at the same moment, so the group can
judge them all at once: at each rung (``min_epochs``, then times ``eta``, below the
spec's epochs) it keeps the best ``1/eta`` of its configurations by the metric, and the
others leave the stack. With two metrics it keeps the configurations on the best Pareto
fronts, front by front, until ``1/eta`` are kept (within the last front taken, the first
metric decides). A configuration trained under several seeds (a ``lam x seed`` grid) is
judged by its seeds' mean, and its seeds stay or go together.

:func:`corel.train.stacked.fit_group` rebuilds the stack from the survivors' own
checkpoints (their weights, optimizer moments, records and data-order streams), so a
survivor goes on exactly as it would have in the unpruned stack.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from corel.geometry import Geometry
from corel.retrieval import retrieval_metrics
from corel.spec import ExperimentSpec

METRICS = ("val_accuracy", "val_map_at_r")
"""What a rung judges members by: validation accuracy, and validation MAP@R (half the
validation rows queries, half reference, in the loss's geometry)."""


@dataclass(frozen=True)
class Prune:
    """How a stacked group prunes: ``metric`` (one or both of :data:`METRICS`), ``eta`` (keep
    the best 1/eta at each rung) and ``min_epochs`` (the first rung)."""

    metric: tuple[str, ...] = ("val_accuracy",)
    eta: int = 3
    min_epochs: int = 2

    @classmethod
    def of(cls, value: Prune | Mapping[str, Any], epochs: int, members: int) -> Prune:
        """``value`` checked against a group of ``members`` members trained ``epochs`` epochs;
        a ValueError that says what is wrong and what is allowed."""
        if isinstance(value, Prune):
            fields: dict[str, Any] = {"metric": list(value.metric), "eta": value.eta,
                                      "min_epochs": value.min_epochs}
        else:
            fields = dict(value)
        unknown = set(fields) - {"metric", "eta", "min_epochs"}
        if unknown:
            raise ValueError(f"prune: unknown field(s) {', '.join(sorted(unknown))}; "
                             "allowed: metric, eta, min_epochs")
        metric = fields.get("metric", "val_accuracy")
        names = [metric] if isinstance(metric, str) else list(metric)
        if not names or len(names) > 2 or len(set(names)) != len(names) or any(m not in METRICS for m in names):
            raise ValueError(f"prune.metric is {metric!r}; give one of {', '.join(METRICS)}, or both "
                             "as a list (pruning on their Pareto front)")
        eta, min_epochs = fields.get("eta", 3), fields.get("min_epochs", 2)
        if isinstance(eta, bool) or not isinstance(eta, int) or eta < 2:
            raise ValueError(f"prune.eta is {eta!r}; it must be an integer of at least 2 (3 keeps "
                             "the best third at each rung)")
        if isinstance(min_epochs, bool) or not isinstance(min_epochs, int) or min_epochs < 1:
            raise ValueError(f"prune.min_epochs is {min_epochs!r}; it must be an integer of at least 1")
        if min_epochs >= epochs:
            raise ValueError(f"prune.min_epochs is {min_epochs}, but the runs train {epochs} epochs; "
                             f"the first rung must come before the last epoch: at most {epochs - 1}")
        if members < 2:
            raise ValueError("pruning needs a group of at least 2 members; this one has "
                             f"{members}")
        return cls(tuple(names), eta, min_epochs)

    def rungs(self, epochs: int) -> list[int]:
        """The epochs after which the group is judged: min_epochs, times eta, ..., below ``epochs``."""
        out, rung = [], self.min_epochs
        while rung < epochs:
            out.append(rung)
            rung *= self.eta
        return out


def configuration(spec: ExperimentSpec) -> str:
    """What a member is, but for its seed: the members of one configuration are judged
    together."""
    return json.dumps(spec.model_dump(mode="json", exclude={"seed"}), sort_keys=True)


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))


def pareto_fronts(scores: Sequence[Sequence[float]]) -> list[list[int]]:
    """Indices of ``scores`` (higher is better on every axis) by non-dominated front, best
    first; each front in index order."""
    left = list(range(len(scores)))
    fronts = []
    while left:
        front = [i for i in left if not any(_dominates(scores[j], scores[i]) for j in left if j != i)]
        fronts.append(front)
        left = [i for i in left if i not in front]
    return fronts


def keep(scores: Sequence[Sequence[float]], configs: Sequence[str], eta: int) -> tuple[list[int], dict[int, str]]:
    """Which members stay (indices, in order), and why each other one goes.

    ``scores[i]``: member i's figures on the rung's metrics; ``configs[i]``: its
    configuration (:func:`configuration`). Configurations are judged by their members'
    mean; ``ceil(n / eta)`` of the ``n`` configurations stay (at least one)."""
    names = list(dict.fromkeys(configs))
    means = [[sum(col) / len(col) for col in zip(*[scores[i] for i in range(len(configs)) if configs[i] == c],
                                                   strict=True)] for c in names]
    wanted = max(1, math.ceil(len(names) / eta))
    kept: list[int] = []
    for front in pareto_fronts(means):
        room = wanted - len(kept)
        if room <= 0:
            break
        kept += sorted(front, key=lambda c: (-means[c][0], c))[:room]
    chosen = {names[c] for c in kept}
    worst_kept = min(means[c][0] for c in kept)
    survivors = [i for i, c in enumerate(configs) if c in chosen]
    why = {}
    for i, c in enumerate(configs):
        if c not in chosen:
            mine = means[names.index(c)]
            why[i] = (f"kept {len(kept)} of {len(names)} configurations (1/{eta}); its mean "
                      + ", ".join(f"{m:.4f}" for m in mine)
                      + f" against the kept ones' lowest {worst_kept:.4f} on the first metric")
    return survivors, why


def map_at_r(h: torch.Tensor, y: torch.Tensor, geometry: Geometry) -> float:
    """MAP@R of representations ``h`` with every other row a query, the rest the reference."""
    q, r = slice(0, None, 2), slice(1, None, 2)
    found = retrieval_metrics(h[q], y[q], h[r], y[r], geometry)
    return float(found["mean_average_precision_at_r"])
