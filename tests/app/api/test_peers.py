"""`corel reproduce --peers` against a live service (PostgreSQL + Redis + a real worker), with the
smoke budget: every loss, the paper's four and pytorch-metric-learning's seven, is tuned on its
grid, trained at its tuned parameters over the seeds, reported with clustering and MAP@R, and
tested against Gaussian- and Cosine-COREL; a second run creates nothing.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_peers.py."""

from __future__ import annotations

from app.cli.peers import BUDGETS, LOSSES, paired_test
from corel.loss_catalog import LossDeclaration, declaration, declare, undeclare


def test_each_loss_is_tuned_over_its_declared_grid():
    row = BUDGETS["session"][0]
    for loss in LOSSES:
        assert row.grid(loss) == {k: list(v) for k, v in declaration(loss).grid.items()}
    declare(LossDeclaration("nogrid", "No grid", "NoGrid", "cosine", ("lam",), "cosine"))
    try:  # a loss declared without a grid is tuned at its defaults alone
        assert row.grid("nogrid") == {} and BUDGETS["smoke"][0].grid("nogrid") == {}
    finally:
        undeclare("nogrid")


def test_paired_test_pairs_by_seed():
    a = {0: 0.9, 1: 0.8, 2: 0.85}
    b = {0: 0.7, 1: 0.75, 2: 0.6, 3: 0.99}  # seed 3 has no partner: left out
    t, p, n = paired_test(a, b)
    assert n == 3 and t > 0 and 0 < p < 0.2
    assert paired_test(a, {0: 0.1}) == (None, None, 1)
