"""Which specs can be trained together as one stacked model (:mod:`corel.stacked`): those
that differ only in the loss's parameters (lam, gamma, alpha)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corel.checkpoints import LOCATIONS
from corel.loss_catalog import declaration
from corel.spec import UPLOADED, ExperimentSpec

__all__ = ["LOSS_PARAMETERS", "as_spec", "check_group", "group_key", "group_specs"]

# What may differ inside a group: the loss parameters, which only enter the loss.
LOSS_PARAMETERS = ("lam", "gamma", "alpha")


def group_key(spec: ExperimentSpec) -> tuple[tuple[str, Any], ...] | None:
    """Specs with equal keys can be trained as one :class:`StackedRun`; None: train it alone.

    The key is every spec field except lam, gamma and alpha (and the file locations
    dataset_path and word_vectors, except for uploaded data whose path names the data).
    Text specs are not vectorized (their models use dropout), nor losses whose declaration
    is not ``stackable`` (pytorch-metric-learning's: their parameters are not lambda).
    """
    if spec.modality == "text" or not declaration(spec.loss).stackable:
        return None
    exclude = set(LOSS_PARAMETERS) | set(LOCATIONS)
    if spec.dataset in UPLOADED:
        exclude.discard("dataset_path")
    return tuple(spec.model_dump(exclude=exclude).items())


def group_specs(specs: Sequence[ExperimentSpec]) -> list[list[int]]:
    """Indices of ``specs`` grouped by :func:`group_key`, in order of first appearance.

    Specs that cannot be vectorized form groups of one.
    """
    groups: dict[Any, list[int]] = {}
    for i, spec in enumerate(specs):
        key = group_key(spec)
        groups.setdefault(("alone", i) if key is None else ("key", key), []).append(i)
    return list(groups.values())


def as_spec(spec: ExperimentSpec | dict[str, Any]) -> ExperimentSpec:
    return spec if isinstance(spec, ExperimentSpec) else ExperimentSpec.model_validate(spec)


def check_group(specs: Sequence[ExperimentSpec]) -> None:
    if not specs:
        raise ValueError("a group needs at least one spec")
    keys = [group_key(s) for s in specs]
    if keys[0] is None:
        raise ValueError(
            f"{specs[0].dataset} ({specs[0].modality}) specs cannot be trained stacked; "
            "train them alone with corel.training.fit"
        )
    for i, key in enumerate(keys):
        if key != keys[0]:
            differ = [
                name for (name, a), (_, b) in zip(keys[0], key or (), strict=False) if a != b
            ] or ["modality"]
            raise ValueError(
                f"spec {i} differs from spec 0 in {', '.join(differ)}; only lam, gamma and "
                "alpha may differ inside a group (see corel.grouping.group_specs)"
            )
