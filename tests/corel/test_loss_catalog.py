"""corel.loss_catalog: each loss declared once, and the library reads the declaration:
the heads score with the declared similarity, take the declared parameters, and the
spec, the clustering default and the not-learning rule follow it."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

from corel import losses, similarity
from corel.clustering import default_metric
from corel.loss_catalog import (
    DECLARATIONS,
    LOSS_NAMES,
    PAPER_LOSSES,
    LossDeclaration,
    Option,
    declaration,
)
from corel.spec import ExperimentSpec, spec_warnings

# Its figures come out of torch's kernels: make test runs it once more on other kernels.
pytestmark = pytest.mark.kernels


def test_every_declared_loss_has_its_head_and_no_other():
    assert tuple(losses.LOSSES) == LOSS_NAMES == tuple(DECLARATIONS)
    assert set(PAPER_LOSSES) == {"cce", "center", "cosine", "gaussian"}
    for name, head in losses.LOSSES.items():
        assert head.name == name


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_a_head_scores_with_its_declared_similarity(name):
    torch.manual_seed(0)
    head = losses.build_loss(name, 5, 7, lam=0.8)
    h = torch.randn(11, 7, dtype=torch.float64)
    head = head.double()
    kind = declaration(name).similarity
    if kind == "dot":
        want = similarity.dot(h, head.W) + head.bias
    elif kind == "cosine":
        want = similarity.cosine(h, head.W)
    else:
        want = similarity.gaussian(h, head.W, float(head.gamma))
    torch.testing.assert_close(head.similarities(h), want)
    assert default_metric(name) == declaration(name).geometry


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_build_loss_passes_exactly_the_declared_parameters(name):
    given = {"lam": 0.7, "gamma": 0.3, "alpha": 0.4, "learn_gamma": False}
    head = losses.build_loss(name, 4, 3, **given)
    for param in ("lam", "alpha"):
        if param in declaration(name).params:
            assert getattr(head, param) == pytest.approx(given[param])
        else:
            assert getattr(head, param, None) != given[param]
    if "gamma" in declaration(name).params:
        assert float(head.gamma) == pytest.approx(0.3)


def test_the_spec_and_its_rules_follow_the_declarations():
    schema = ExperimentSpec.model_json_schema()["properties"]
    assert schema["loss"]["enum"] == list(LOSS_NAMES)
    assert schema["lam"]["x-warn-below"] == {n: d.min_lam for n, d in DECLARATIONS.items() if d.min_lam}
    for name, decl in DECLARATIONS.items():
        if "learn_gamma" in decl.params:
            ExperimentSpec(dataset="digits", loss=name, learn_gamma=True)
        else:
            with pytest.raises(ValueError, match="learn_gamma applies only to loss 'gaussian'"):
                ExperimentSpec(dataset="digits", loss=name, learn_gamma=True)
        warned = spec_warnings(name, 0.3)
        assert bool(warned) == (decl.min_lam is not None and decl.min_lam > 0.3)
        if warned:
            assert decl.display in warned[0]
    with pytest.raises(ValueError, match=f"unknown loss 'sphereface'; allowed: {', '.join(LOSS_NAMES)}$"):
        declaration("sphereface")


def test_a_declaration_is_checked_when_made():
    with pytest.raises(ValueError, match="similarity must be one of dot, cosine, gaussian"):
        LossDeclaration("x", "X", "X", "manhattan", (), "euclidean")
    with pytest.raises(ValueError, match=r"unknown parameters \['beta'\]"):
        LossDeclaration("x", "X", "X", "dot", ("beta",), "euclidean")
    with pytest.raises(ValueError, match="geometry must be euclidean or cosine"):
        LossDeclaration("x", "X", "X", "dot", (), "hyperbolic")
    with pytest.raises(ValueError, match="its grid varies 'lam'; it may vary nothing"):
        LossDeclaration("x", "X", "X", "dot", (), "euclidean", grid={"lam": (0.5,)})
    with pytest.raises(ValueError, match="its grid varies 'lam'; it may vary lam, each over one value or more"):
        LossDeclaration("x", "X", "X", "dot", ("lam",), "euclidean", grid={"lam": ()})
    with pytest.raises(ValueError, match=re.escape("temperature for loss 'x' must be a number in (0, 10]; got 50")):
        LossDeclaration("x", "X", "X", "cosine", (), "cosine", grid={"temperature": (0.1, 50)},
                        options=(Option("temperature", 0.1, 0.0, 10.0),))
    assert DECLARATIONS["gaussian"].grid_params == ("lam", "gamma")
    assert DECLARATIONS["cce"].label(0.7) == "CCE" and DECLARATIONS["center"].label(0.7) == "Center loss, λ = 0.7"


OPTIONS = [pytest.param(name, option, id=f"{name}-{option.field}")
           for name, decl in DECLARATIONS.items() for option in decl.options]


def outside(option: Option) -> list[Any]:
    """Values the option's declared range leaves out: past each end, an open end itself."""
    if option.choices:
        return ["bogus", 1.0]
    values: list[Any] = [math.nan, math.inf]
    if option.low is not None:
        values += [option.low - 1] + ([] if option.low_inclusive else [option.low])
    if option.high is not None:
        values += [option.high + 1] + ([] if option.high_inclusive else [option.high])
    return values


def inside(option: Option) -> list[Any]:
    """The default, and each closed end of the range."""
    if option.choices:
        return list(option.choices)
    return [option.default] + [end for end, closed in ((option.low, option.low_inclusive),
                                                         (option.high, option.high_inclusive))
                               if end is not None and closed]


@pytest.mark.parametrize(("name", "option"), OPTIONS)
def test_a_head_s_options_default_to_its_declaration(name, option):
    head = losses.LOSSES[name](4, 3)
    assert getattr(head, option.keyword) == option.default
    assert getattr(losses.build_loss(name, 4, 3), option.keyword) == option.default


@pytest.mark.parametrize(("name", "option"), OPTIONS)
def test_a_head_refuses_what_the_api_refuses_and_takes_what_it_takes(name, option):
    for value in outside(option):
        with pytest.raises(ValueError):  # the allowed values, or pydantic's type error
            ExperimentSpec(dataset="digits", loss=name, **{option.field: value})
        with pytest.raises(ValueError, match=re.escape(f"{option.keyword} for loss {name!r} must be "
                                                       f"{option.allowed()}; got ")):
            losses.LOSSES[name](4, 3, **{option.keyword: value})
        with pytest.raises(ValueError, match=re.escape(option.allowed())):
            losses.build_loss(name, 4, 3, **{option.field: value})
    for value in inside(option):
        assert getattr(ExperimentSpec(dataset="digits", loss=name, **{option.field: value}),
                       option.field) == value
        assert getattr(losses.LOSSES[name](4, 3, **{option.keyword: value}), option.keyword) == value


def test_supcon_refuses_a_temperature_the_api_refuses():
    with pytest.raises(ValueError, match=re.escape(
            "temperature for loss 'supcon' must be a number in (0, 10]; got 50")):
        losses.SupCon(4, 3, temperature=50)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_every_value_of_a_declared_grid_is_a_spec_the_api_takes(name):
    for field, values in DECLARATIONS[name].grid.items():
        for value in values:
            assert getattr(ExperimentSpec(dataset="digits", loss=name, **{field: value}), field) == value
