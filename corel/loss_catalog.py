"""Each loss declared once: what the rest of corel and the service read about it.

A declaration holds a loss's facts: its name (as specs and the API write it), its display
names, the similarity its head scores representations with, the spec fields it reads,
the geometry its representation is clustered and searched in, whether it has class
vectors, and below which lambda it is known not to train. The spec's allowed names, the
sweep grid's parameters, the dashboard's and the reports' names, the serving and export
similarity and the clustering default all come from here; the head that trains it is
``corel.losses.LOSSES[name]``.
"""

from __future__ import annotations

from dataclasses import dataclass

SIMILARITIES = ("dot", "cosine", "gaussian")
PARAMETERS = ("lam", "gamma", "learn_gamma", "alpha")
"""Every spec field a loss may read (ExperimentSpec declares their ranges and defaults)."""


@dataclass(frozen=True)
class LossDeclaration:
    name: str
    display: str
    """As the dashboard and the figures write it ("Center loss")."""
    short: str
    """As the report tables write it ("Center")."""
    similarity: str
    """``dot``, ``cosine`` or ``gaussian`` (negative squared distance)."""
    params: tuple[str, ...]
    """The spec fields the loss reads; the others do not change a run of it."""
    geometry: str
    """The clustering report's and retrieval's default: ``cosine`` or ``euclidean``."""
    class_vectors: bool = True
    min_lam: float | None = None
    """Below this lambda the loss has no minimum: accepted, with a warning."""
    in_paper: bool = False
    """One of the four losses Kenyon-Dean et al. (2019) compare."""

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"loss {self.name!r}: similarity must be one of {', '.join(SIMILARITIES)}")
        unknown = [p for p in self.params if p not in PARAMETERS]
        if unknown:
            raise ValueError(f"loss {self.name!r}: unknown parameters {unknown}; allowed: {', '.join(PARAMETERS)}")
        if self.geometry not in ("euclidean", "cosine"):
            raise ValueError(f"loss {self.name!r}: geometry must be euclidean or cosine")

    @property
    def grid_params(self) -> tuple[str, ...]:
        """The numeric parameters a sweep's grid varies for this loss."""
        return tuple(p for p in self.params if p != "learn_gamma")

    def label(self, lam: float) -> str:
        """"Gaussian-COREL, lambda = 0.8"; the name alone for a loss without lambda."""
        return self.display if "lam" not in self.params else f"{self.display}, λ = {lam:g}"


DECLARATIONS: dict[str, LossDeclaration] = {d.name: d for d in (
    LossDeclaration("cce", "CCE", "CCE", "dot", (), "euclidean", in_paper=True),
    LossDeclaration("center", "Center loss", "Center", "dot", ("lam", "alpha"), "euclidean",
                    in_paper=True),
    LossDeclaration("cosine", "Cosine-COREL", "Cosine-COREL", "cosine", ("lam",), "cosine",
                    in_paper=True),
    LossDeclaration("gaussian", "Gaussian-COREL", "Gaussian-COREL", "gaussian",
                    ("lam", "gamma", "learn_gamma"), "euclidean", min_lam=0.5, in_paper=True),
)}

LOSS_NAMES: tuple[str, ...] = tuple(DECLARATIONS)
PAPER_LOSSES: tuple[str, ...] = tuple(d.name for d in DECLARATIONS.values() if d.in_paper)


def declaration(name: str) -> LossDeclaration:
    """The loss's declaration; ValueError naming the allowed losses otherwise."""
    try:
        return DECLARATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(DECLARATIONS)}") from None
