"""The README's first service example is one whose result is good: its spec, read from the
README, trained with the library as a worker trains it, reaches Fashion-MNIST's 85 %
(Gaussian-COREL at lambda 0.85 on the quick budget, the example before, gave 81.1 %)."""

from __future__ import annotations

import json
import re

from corel.spec import ExperimentSpec
from corel.train import fit
from tests.conftest import REPO


def test_the_readme_s_service_example_trains_to_a_good_result(fashion_dir):
    text = (REPO / "README.md").read_text()
    body = re.search(r"POST localhost:8000/experiments .*?-d '(\{.*?\})'", text, re.S)
    assert body is not None, "the README's POST /experiments example"
    spec = json.loads(body.group(1))
    assert spec["dataset"] == "fashion-mnist" and spec["budget"] == "quick", spec
    result = fit(ExperimentSpec(**spec), data_dir=fashion_dir)
    assert result.test_accuracy > 0.85, result.test_accuracy
    # The CLI line beside it trains the same spec.
    line = re.search(r"corel train (--dataset .*)", text).group(1).split()
    flags = dict(zip(line[::2], line[1::2], strict=True))
    assert {k.removeprefix("--"): v for k, v in flags.items()} == {k: str(v) for k, v in spec.items()}
