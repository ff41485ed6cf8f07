"""corel's losses, each a head (:class:`LossHead`): class vectors, a similarity and a loss.

Where each one is:

* :mod:`corel.losses.head`: :class:`LossHead`, what every head is, and :func:`check_labels`.
* :mod:`corel.losses.ar`: the attractive-repulsive losses of Kenyon-Dean et al. (2019):
  :class:`CCE`, :class:`CosineCOREL`, :class:`GaussianCOREL` (with
  :func:`spread_class_vectors`), and the AR loss as a function, :func:`attractive_repulsive`.
* :mod:`corel.losses.baselines`: the paper's baseline :class:`CenterLoss` (Wen et al., 2016)
  and its term, :func:`center_loss_term`.
* :mod:`corel.losses.peers`: pytorch-metric-learning's losses: :class:`ArcFace`,
  :class:`CosFace`, :class:`NormalizedSoftmax`, :class:`ProxyAnchor` (class or proxy
  vectors), :class:`SupCon`, :class:`TripletMargin`, :class:`MultiSimilarity` (pair-based,
  predicting with the nearest class mean).
* here: :data:`LOSSES`, the head of each loss by name; :func:`build_loss`, a head from spec
  fields; :func:`register_loss`, a loss of one's own. Each loss's facts (names, similarity,
  options) are its declaration in :mod:`corel.loss_catalog`.
"""

from __future__ import annotations

from typing import Any

from corel.loss_catalog import DECLARATIONS, LossDeclaration, declaration, declare, undeclare
from corel.losses.ar import (
    CCE,
    INIT_CONFIDENCE,
    REPULSIONS,
    CosineCOREL,
    GaussianCOREL,
    attractive_repulsive,
    spread_class_vectors,
)
from corel.losses.baselines import CenterLoss, center_loss_term, class_counts
from corel.losses.head import LossHead, check_labels
from corel.losses.peers import (
    ArcFace,
    CosFace,
    MultiSimilarity,
    NormalizedSoftmax,
    ProxyAnchor,
    SupCon,
    TripletMargin,
    arcface_loss,
    cosface_loss,
    multisimilarity_loss,
    normsoftmax_loss,
    proxyanchor_loss,
    supcon_loss,
    triplet_loss,
)

__all__ = [
    "CCE",
    "INIT_CONFIDENCE",
    "LOSSES",
    "REPULSIONS",
    "ArcFace",
    "CenterLoss",
    "CosFace",
    "CosineCOREL",
    "GaussianCOREL",
    "LossHead",
    "MultiSimilarity",
    "NormalizedSoftmax",
    "ProxyAnchor",
    "SupCon",
    "TripletMargin",
    "arcface_loss",
    "attractive_repulsive",
    "build_loss",
    "center_loss_term",
    "check_labels",
    "class_counts",
    "cosface_loss",
    "multisimilarity_loss",
    "normsoftmax_loss",
    "proxyanchor_loss",
    "register_loss",
    "spread_class_vectors",
    "supcon_loss",
    "triplet_loss",
    "unregister_loss",
]

LOSSES: dict[str, type[LossHead]] = {
    "cce": CCE,
    "center": CenterLoss,
    "cosine": CosineCOREL,
    "gaussian": GaussianCOREL,
    "arcface": ArcFace,
    "cosface": CosFace,
    "normsoftmax": NormalizedSoftmax,
    "proxyanchor": ProxyAnchor,
    "supcon": SupCon,
    "triplet": TripletMargin,
    "multisimilarity": MultiSimilarity,
}


if set(LOSSES) != set(DECLARATIONS):  # a head for every declared loss, and no other
    raise ImportError(f"corel.losses: heads {sorted(LOSSES)} differ from the declared losses "
                      f"{sorted(DECLARATIONS)} (corel.loss_catalog)")


def register_loss(decl: LossDeclaration, head: type[LossHead]) -> None:
    """Add a loss to corel in one place: its declaration and the head that trains it.

    From then on the spec accepts and validates it, training, sweeps, serving, export, the
    reports and ``GET /losses`` know it. A package can register its losses in every process
    (API, workers) through an entry point of the group ``corel.losses`` naming a function
    that calls this.
    """
    if not (isinstance(head, type) and issubclass(head, LossHead)):
        raise ValueError(f"the head of loss {decl.name!r} must be a LossHead subclass; got {head!r}")
    declare(decl)
    LOSSES[decl.name] = head


def unregister_loss(name: str) -> None:
    """Remove a registered loss (for tests); the built-in ones stay."""
    undeclare(name)
    LOSSES.pop(name, None)


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="corel.losses"):
        ep.load()()


def build_loss(name: str, num_classes: int, dim: int, **params: Any) -> LossHead:
    """Build a loss head by registry name; ``params`` are spec fields.

    The shared parameters a loss does not read (``lam`` for CCE, ``gamma`` for
    Cosine-COREL, ...) are ignored, so one spec can be passed to any loss; a loss's own
    options (margin, scale, ...) that are None or absent take the loss's default, and are
    passed under the head's keyword (ProxyAnchor's ``scale`` is its ``alpha``).
    """
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(LOSSES)}")
    decl = declaration(name)
    kwargs = {k: v for k, v in params.items() if k in decl.params}
    for option in decl.options:
        value = params.get(option.field)
        kwargs[option.keyword] = option.default if value is None else value
    return LOSSES[name](num_classes, dim, **kwargs)


_load_entry_points()
