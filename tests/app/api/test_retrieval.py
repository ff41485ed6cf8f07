"""GET /experiments/{id}/retrieval on runs a real worker trained: the test split's stored
representations as queries among the training split's, in the loss's geometry; equal to
pytorch-metric-learning's AccuracyCalculator on the same stored arrays; computed once.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_retrieval.py."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("path", "params", "says"), [
    ("clustering", {"on": "train"}, "on: Input should be 'test' or 'validation'; got 'train'"),
    ("clustering", {"metric": "manhattan"},
     "metric: Input should be 'euclidean' or 'cosine'; got 'manhattan'"),
    ("retrieval", {"geometry": "manhattan"},
     "geometry: Input should be 'euclidean' or 'cosine'; got 'manhattan'"),
])
def test_a_report_s_unknown_choice_is_a_422_naming_the_allowed_ones(client, path, params, says):
    # Refused by the query's type, before any experiment is looked up.
    r = client.get(f"/experiments/2000000000/{path}", params=params)
    assert r.status_code == 422 and says in r.json()["detail"], r.text
