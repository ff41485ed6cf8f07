"""Each loss declared once: what the rest of corel and the service read about it.

A declaration holds a loss's facts: its name (as specs and the API write it), its display
names, the similarity its head scores representations with, the spec fields it reads,
the geometry its representation is clustered and searched in, whether it has class
vectors, below which lambda it is known not to train, its own options (default and range)
and the grid ``corel reproduce --peers`` tunes it over. The spec's allowed names, the
sweep grid's parameters, the dashboard's and the reports' names, the serving and export
similarity and the clustering default all come from here; the head that trains it is
``corel.losses.LOSSES[name]``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from corel.geometry import GEOMETRIES, Geometry

SIMILARITIES = ("dot", "cosine", "gaussian")
SHARED_PARAMETERS = ("lam", "gamma", "learn_gamma", "alpha")
"""Spec fields with one range for every loss that reads them (ExperimentSpec declares it)."""
OPTION_FIELDS = ("margin", "scale", "scale_neg", "temperature", "miner")
"""Spec fields whose default and range are each loss's own (its declaration's ``options``):
null in a spec means the loss's default."""
PARAMETERS = SHARED_PARAMETERS + OPTION_FIELDS
"""Every spec field a loss may read."""
MINERS = ("none", "all", "hard", "semihard", "easy")
"""Triplet mining (pytorch-metric-learning's TripletMarginMiner ``type_of_triplets``)."""


@dataclass(frozen=True)
class Option:
    """A loss's own parameter: the spec field, its default and the range it must lie in."""

    field: str
    default: float | str
    low: float | None = None
    high: float | None = None
    low_inclusive: bool = False
    high_inclusive: bool = True
    choices: tuple[str, ...] = ()
    kwarg: str = ""
    """The head's keyword argument (pytorch-metric-learning's name); the field's by default."""
    doc: str = ""

    def __post_init__(self) -> None:
        if self.field not in OPTION_FIELDS:
            raise ValueError(f"option {self.field!r}: the spec field must be one of {', '.join(OPTION_FIELDS)}")

    @property
    def keyword(self) -> str:
        return self.kwarg or self.field

    def allowed(self) -> str:
        """The allowed values in words: "a number in [0, 90)", "one of none, all, ..."."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return (f"a number in {'[' if self.low_inclusive and self.low is not None else '('}{lo}, "
                f"{hi}{']' if self.high_inclusive and self.high is not None else ')'}")

    def check(self, loss: str, value: Any, *, name: str = "") -> None:
        """ValueError naming the field (or ``name``, the head's keyword), the loss and the
        allowed values unless ``value`` fits."""
        if self.choices:
            ok = isinstance(value, str) and value in self.choices
        else:
            ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                  and (self.low is None or value > self.low or (self.low_inclusive and value == self.low))
                  and (self.high is None or value < self.high or (self.high_inclusive and value == self.high)))
        if not ok:
            got = f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else repr(value)
            raise ValueError(f"{name or self.field} for loss {loss!r} must be {self.allowed()}; got {got}")

    def json_schema(self) -> dict[str, Any]:
        """The field's values for this loss, in JSON Schema (null: the default)."""
        if self.choices:
            return {"enum": [*self.choices, None]}
        schema: dict[str, Any] = {"type": "number"}
        if self.low is not None:
            schema["minimum" if self.low_inclusive else "exclusiveMinimum"] = self.low
        if self.high is not None:
            schema["maximum" if self.high_inclusive else "exclusiveMaximum"] = self.high
        return {"anyOf": [schema, {"type": "null"}]}


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
    """The shared spec fields the loss reads (lam, gamma, learn_gamma, alpha)."""
    geometry: Geometry
    """The clustering report's and retrieval's default (:mod:`corel.geometry`)."""
    class_vectors: bool = True
    """False for a pair-based loss: it predicts with the nearest class mean of the training
    representations (computed after every epoch and kept with the checkpoint)."""
    min_lam: float | None = None
    """Below this lambda the loss has no minimum: accepted, with a warning."""
    in_paper: bool = False
    """One of the four losses Kenyon-Dean et al. (2019) compare."""
    options: tuple[Option, ...] = ()
    """The loss's own parameters (margin, scale, ...), each with its default and range."""
    stackable: bool = True
    """Whether sweeps may train members of this loss stacked (corel.vectorized)."""
    source: str = "corel"
    """Where the loss comes from: ``corel`` or ``pytorch-metric-learning``."""
    grid: Mapping[str, tuple[float | str, ...]] = field(default_factory=dict, hash=False)
    """The values ``corel reproduce --peers`` tunes the loss over, by spec field (the others
    at their defaults); empty: its defaults alone."""

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"loss {self.name!r}: similarity must be one of {', '.join(SIMILARITIES)}")
        unknown = [p for p in self.params if p not in SHARED_PARAMETERS]
        if unknown:
            raise ValueError(f"loss {self.name!r}: unknown parameters {unknown}; allowed: "
                             f"{', '.join(SHARED_PARAMETERS)} (and options: {', '.join(OPTION_FIELDS)})")
        if self.geometry not in GEOMETRIES:
            raise ValueError(f"loss {self.name!r}: geometry must be {' or '.join(GEOMETRIES)}")
        for name, values in self.grid.items():
            if name not in self.grid_params or not values:
                raise ValueError(f"loss {self.name!r}: its grid varies {name!r}; it may vary "
                                 f"{', '.join(self.grid_params) or 'nothing'}, each over one value "
                                 "or more")
            option = self.option(name)
            if option is not None:
                for value in values:
                    option.check(self.name, value)

    @property
    def fields(self) -> tuple[str, ...]:
        """Every spec field this loss reads: its shared parameters and its options."""
        return self.params + tuple(o.field for o in self.options)

    @property
    def grid_params(self) -> tuple[str, ...]:
        """The parameters a sweep's grid varies for this loss."""
        return tuple(p for p in self.fields if p != "learn_gamma")

    def option(self, field: str) -> Option | None:
        return next((o for o in self.options if o.field == field), None)

    @property
    def prediction(self) -> str:
        """How the served model predicts: ``class vectors`` or ``nearest class mean``."""
        return "class vectors" if self.class_vectors else "nearest class mean"

    def describe(self) -> dict[str, Any]:
        """The declaration as ``GET /losses`` lists it."""
        return {"name": self.name, "display": self.display, "short": self.short,
                "similarity": self.similarity, "geometry": self.geometry,
                "class_vectors": self.class_vectors, "prediction": self.prediction,
                "params": list(self.params), "min_lam": self.min_lam, "in_paper": self.in_paper,
                "stackable": self.stackable, "source": self.source,
                "options": [{"field": o.field, "default": o.default, "allowed": o.allowed(),
                             "keyword": o.keyword, "doc": o.doc} for o in self.options]}

    def label(self, lam: float) -> str:
        """"Gaussian-COREL, lambda = 0.8"; the name alone for a loss without lambda."""
        return self.display if "lam" not in self.params else f"{self.display}, λ = {lam:g}"


_PML = "pytorch-metric-learning"
_SCALE_DOC = "the logits' scale s"

# The tuning grids (``grid``) are around pytorch-metric-learning's defaults (the paper's
# lambdas for COREL): two values of the parameter that most changes a run, the others at
# their defaults. Two values, not more, so that `corel reproduce --peers`'s whole table fits
# a 2-core machine's session; the scales and temperatures move the logits' sharpness, which
# for a 128-d FFNN from scratch matters more than the margins (Musgrave et al. tune them the
# same way, one at a time). CCE has no parameter.

DECLARATIONS: dict[str, LossDeclaration] = {d.name: d for d in (
    LossDeclaration("cce", "CCE", "CCE", "dot", (), "euclidean", in_paper=True),
    LossDeclaration("center", "Center loss", "Center", "dot", ("lam", "alpha"), "euclidean",
                    in_paper=True, grid={"lam": (0.1, 0.5)}),
    LossDeclaration("cosine", "Cosine-COREL", "Cosine-COREL", "cosine", ("lam",), "cosine",
                    in_paper=True, grid={"lam": (0.5, 0.85)}),
    LossDeclaration("gaussian", "Gaussian-COREL", "Gaussian-COREL", "gaussian",
                    ("lam", "gamma", "learn_gamma"), "euclidean", min_lam=0.5, in_paper=True,
                    grid={"lam": (0.5, 0.85)}),
    # pytorch-metric-learning's losses (Musgrave et al., 2020), with its defaults. Those with
    # a class (or proxy) matrix predict with it, as COREL does; the pair-based ones with the
    # nearest class mean. They stack as COREL's do: each member with its own options.
    LossDeclaration("arcface", "ArcFace", "ArcFace", "cosine", (), "cosine",
                    source=_PML, grid={"scale": (16.0, 64.0)}, options=(
                        Option("margin", 28.6, 0.0, 90.0, low_inclusive=True, high_inclusive=False,
                               doc="additive angular margin, in degrees"),
                        Option("scale", 64.0, 0.0, 1024.0, doc=_SCALE_DOC))),
    LossDeclaration("cosface", "CosFace", "CosFace", "cosine", (), "cosine",
                    source=_PML, grid={"scale": (16.0, 64.0)}, options=(
                        Option("margin", 0.35, 0.0, 2.0, low_inclusive=True, high_inclusive=False,
                               doc="additive cosine margin"),
                        Option("scale", 64.0, 0.0, 1024.0, doc=_SCALE_DOC))),
    LossDeclaration("normsoftmax", "NormalizedSoftmax", "NormSoftmax", "cosine", (), "cosine",
                    source=_PML, grid={"temperature": (0.05, 0.2)}, options=(
                        Option("temperature", 0.05, 0.0, 10.0, doc="softmax temperature"),)),
    LossDeclaration("proxyanchor", "ProxyAnchor", "ProxyAnchor", "cosine", (), "cosine",
                    source=_PML, grid={"scale": (16.0, 32.0)}, options=(
                        Option("margin", 0.1, 0.0, 1.0, low_inclusive=True, doc="margin delta"),
                        Option("scale", 32.0, 0.0, 1024.0, kwarg="alpha",
                               doc="scaling factor alpha (pytorch-metric-learning's alpha)"))),
    LossDeclaration("supcon", "SupCon", "SupCon", "cosine", (), "cosine", class_vectors=False,
                    source=_PML, grid={"temperature": (0.1, 0.5)}, options=(
                        Option("temperature", 0.1, 0.0, 10.0, doc="softmax temperature"),)),
    LossDeclaration("triplet", "Triplet (mined)", "Triplet", "cosine", (), "cosine",
                    class_vectors=False, source=_PML, grid={"margin": (0.05, 0.2)},
                    options=(
                        Option("margin", 0.05, 0.0, 2.0, low_inclusive=True,
                               doc="margin between anchor-negative and anchor-positive distances "
                                   "(the miner's margin too)"),
                        Option("miner", "semihard", choices=MINERS,
                               doc="which violating triplets train (TripletMarginMiner's "
                                   "type_of_triplets); none: every triplet of the batch. Time: "
                                   "every miner costs the same (the kept triplets are counted "
                                   "from each anchor's sorted distances, never listed); a "
                                   "Triplet step costs about 2 to 3.5 times a COREL step on a "
                                   "CPU at batch 64 to 256. A sweep stacks members that share "
                                   "a miner (their margins may differ)"))),
    LossDeclaration("multisimilarity", "MultiSimilarity", "MultiSim", "cosine", (), "cosine",
                    class_vectors=False, source=_PML,
                    grid={"scale_neg": (10.0, 50.0)}, options=(
                        Option("scale", 2.0, 0.0, 1024.0, kwarg="alpha",
                               doc="weight of positive pairs (pytorch-metric-learning's alpha)"),
                        Option("scale_neg", 50.0, 0.0, 1024.0, kwarg="beta",
                               doc="weight of negative pairs (pytorch-metric-learning's beta)"),
                        Option("margin", 0.5, -1.0, 1.0, low_inclusive=True, high_inclusive=True,
                               kwarg="base", doc="similarity threshold (pytorch-metric-learning's base)"))),
)}

PAPER_LOSSES: tuple[str, ...] = tuple(d.name for d in DECLARATIONS.values() if d.in_paper)
PEER_LOSSES: tuple[str, ...] = tuple(d.name for d in DECLARATIONS.values() if d.source == _PML)
LOSS_NAMES: tuple[str, ...] = tuple(DECLARATIONS)
"""The losses corel ships with; :func:`loss_names` includes those registered since."""

def loss_names() -> tuple[str, ...]:
    """Every loss declared now, built-in and registered."""
    return tuple(DECLARATIONS)


def declaration(name: str) -> LossDeclaration:
    """The loss's declaration; ValueError naming the allowed losses otherwise."""
    try:
        return DECLARATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(DECLARATIONS)}") from None


def short_name(name: str) -> str:
    """The loss's name in report tables; the name itself for an unknown one (an old row)."""
    decl = DECLARATIONS.get(name)
    return decl.short if decl else name


def declare(decl: LossDeclaration) -> None:
    """Add a loss to the catalog (``corel.losses.register_loss`` does this with its head)."""
    if decl.name in DECLARATIONS:
        raise ValueError(f"loss {decl.name!r} is already declared")
    DECLARATIONS[decl.name] = decl


def undeclare(name: str) -> None:
    """Remove a registered loss (for tests); the built-in ones stay."""
    if name in LOSS_NAMES:
        raise ValueError(f"loss {name!r} is built in; it cannot be removed")
    DECLARATIONS.pop(name, None)
