"""Which specs can be trained together as one stacked model (:mod:`corel.train.stacked`): those
that differ only in the loss's parameters (lam, gamma, alpha, and its own numeric options:
margin, scale, scale_neg, temperature) and the seed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from corel.loss_catalog import declaration
from corel.spec import MAX_GROUP, UPLOADED, ExperimentSpec
from corel.train.checkpoints import LOCATIONS

__all__ = ["LOSS_PARAMETERS", "MAX_GROUP", "MAY_DIFFER", "as_spec", "check_group", "group_key",
           "group_specs"]

# The loss parameters, which only enter the loss: the shared ones, and the numeric options of
# pytorch-metric-learning's losses (each member's own tensors under vmap, as lambda is). The
# triplet miner is not one: it decides which code runs, so a group's members share it.
LOSS_PARAMETERS = ("lam", "gamma", "alpha", "margin", "scale", "scale_neg", "temperature")
# What may differ inside a group: those, and the seed (each member's initial weights, which
# a stack holds per member anyway, and its data order: a group draws one per seed).
MAY_DIFFER = (*LOSS_PARAMETERS, "seed")


def group_key(spec: ExperimentSpec) -> tuple[tuple[str, Any], ...] | None:
    """Specs with equal keys can be trained as one :class:`StackedRun`; None: train it alone.

    The key is every spec field except the loss parameters (:data:`LOSS_PARAMETERS`) and the
    seed (and the file locations
    dataset_path and word_vectors, except for uploaded data whose path names the data; an
    encoder_path names the encoder: on one machine, other files are another encoder).
    Not vectorized: losses whose declaration is not ``stackable`` (a registered loss may say
    so), fine-tuned encoders, and a few-shot member whose class vectors are decayed (its
    draw's ``l2`` on a dot-product or Gaussian head). Text models with dropout are: each member draws its masks
    from its own stream, as alone (:mod:`corel.train.stacked`).
    """
    if not declaration(spec.loss).stackable or spec.fine_tunes:
        return None
    if spec.fewshot is not None and spec.fewshot.l2:
        from corel.fewshot import class_vector_decay

        if class_vector_decay(spec.loss, spec.fewshot.l2, 1):
            return None  # its class vectors' weight decay is an optimiser group of its own (corel.train.solo)
    exclude = set(MAY_DIFFER) | set(LOCATIONS)
    if spec.dataset in UPLOADED:
        exclude.discard("dataset_path")
    exclude.discard("encoder_path")  # on one machine, other files are another encoder
    return tuple((k, tuple(sorted(v.items())) if isinstance(v, dict) else v)  # a few-shot draw's fields
                 for k, v in spec.model_dump(exclude=exclude).items())


def group_specs(specs: Sequence[ExperimentSpec], max_members: int = MAX_GROUP) -> list[list[int]]:
    """Indices of ``specs`` grouped by :func:`group_key`, in order of first appearance, in
    groups of at most ``max_members``.

    Inside a group the members of one seed come together (seeds in order of first
    appearance), so that a group split by the limit keeps seeds whole where it can: members
    of a seed share their batches. Specs that cannot be vectorized form groups of one.
    """
    if max_members < 1:
        raise ValueError(f"max_members must be at least 1; got {max_members}")
    groups: dict[Any, list[int]] = {}
    for i, spec in enumerate(specs):
        key = group_key(spec)
        groups.setdefault(("alone", i) if key is None else ("key", key), []).append(i)
    out: list[list[int]] = []
    for members in groups.values():
        seeds = list(dict.fromkeys(specs[i].seed for i in members))
        members = sorted(members, key=lambda i: seeds.index(specs[i].seed))  # stable
        out.extend(members[k : k + max_members] for k in range(0, len(members), max_members))
    return out


def as_spec(spec: ExperimentSpec | dict[str, Any]) -> ExperimentSpec:
    return spec if isinstance(spec, ExperimentSpec) else ExperimentSpec.model_validate(spec)


def check_group(specs: Sequence[ExperimentSpec]) -> None:
    if not specs:
        raise ValueError("a group needs at least one spec")
    keys = [group_key(s) for s in specs]
    if keys[0] is None:
        why = ("its encoder is fine-tuned" if specs[0].fine_tunes
               else f"loss {specs[0].loss!r} is declared not stackable")
        raise ValueError(
            f"spec 0 cannot be trained stacked ({why}); "
            "train them alone with corel.train.solo.fit"
        )
    for i, key in enumerate(keys):
        if key != keys[0]:
            differ = [
                name for (name, a), (_, b) in zip(keys[0], key or (), strict=False) if a != b
            ] or ["modality"]
            raise ValueError(
                f"spec {i} differs from spec 0 in {', '.join(differ)}; only "
                f"{', '.join(MAY_DIFFER[:-1])} and {MAY_DIFFER[-1]} may differ inside a group (see corel.train.grouping.group_specs)"
            )
