"""`corel reproduce --all` against a live service (PostgreSQL + Redis + a real worker), with the
smoke budget: the tune sweep picks each loss's lambda, the final sweep trains each loss at it,
the tables land between the markers, and a second run creates nothing.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_reproduce.py."""

from __future__ import annotations

import pytest

from app.cli.reproduce import BUDGETS, final_lambdas, markers, select_rows, write_block
from corel.report import PAPER_TABLE2
from tests.app.stack.test_reproduce import BEGIN, END


def test_write_block_appends_then_replaces(tmp_path):
    doc = tmp_path / "d.md"
    write_block(doc, f"{BEGIN}\none\n{END}\n", "smoke")
    write_block(doc, f"{BEGIN}\ntwo\n{END}\n", "smoke")
    text = doc.read_text()
    assert "two" in text and "one" not in text and text.count(BEGIN) == 1
    # Another budget's block goes beside it and leaves this one alone.
    other_begin, other_end = markers("paper")
    write_block(doc, f"{other_begin}\nthree\n{other_end}\n", "paper")
    text = doc.read_text()
    assert "two" in text and "three" in text and text.count(BEGIN) == 1


def test_rows_pick_part_of_a_budget_and_unknown_rows_are_named():
    rows = select_rows("paper", "mnist/ffnn, fashion-mnist/ffnn")
    assert [r.key for r in rows] == ["mnist/ffnn", "fashion-mnist/ffnn"]
    with pytest.raises(ValueError, match="mnist/mlp is not a row of the 'paper' budget; its rows are"):
        select_rows("paper", "mnist/mlp")


def test_final_lambdas_take_the_papers_table_2_where_it_is_known():
    fashion = next(r for r in BUDGETS["paper"] if r.key == "fashion-mnist/ffnn")
    lams, source = final_lambdas(fashion, {"center": 0.6, "cosine": 0.6, "gaussian": 0.7})
    # The paper's Table 2 (../shared/paper-tables.md): Fashion-MNIST FFNN.
    assert lams == {"center": 0.15, "cosine": 0.65, "gaussian": 0.5}
    assert source == {"center": "paper", "cosine": "paper", "gaussian": "paper"}
    # A loss the table does not name keeps its tuned lambda.
    lams, source = final_lambdas(fashion, {"center": 0.6, "arcface-like": 0.3})
    assert lams == {"center": PAPER_TABLE2[("fashion-mnist", "ffnn")]["center"], "arcface-like": 0.3}
    assert source == {"center": "paper", "arcface-like": "tuned"}
    digits = BUDGETS["smoke"][0]
    assert final_lambdas(digits, {"gaussian": 0.85}) == ({"gaussian": 0.85}, {"gaussian": "tuned"})


@pytest.mark.parametrize(("lam_by_loss", "words"), [
    ({"cce": 0.5}, "'cce' has no lambda"),
    ({"gaussian": 1.5}, "gaussian must be a number in (0, 1]"),
])
def test_bad_lam_by_loss_is_422(client, lam_by_loss, words):
    body = {"base": {"dataset": "digits", "epochs": 1}, "grid": {"loss": ["cce", "gaussian"]},
            "lam_by_loss": lam_by_loss}
    r = client.post("/sweeps", json=body)
    assert r.status_code == 422 and words in r.text, r.text
