"""`corel reproduce --all` against a live service (PostgreSQL + Redis + a real worker),
with the smoke budget: the tune sweep picks each loss's lambda, the final sweep trains
each loss at it, the tables land between the markers, and a second run creates nothing."""

from __future__ import annotations

import json

import pytest

from app.cli.reproduce import BUDGETS, final_lambdas, markers, select_rows, write_block
from corel.cli import main
from corel.report import PAPER_TABLE2

BEGIN, END = markers("smoke")


def _sweep(client, sweep_id):
    return client.get(f"/sweeps/{sweep_id}").json()


@pytest.fixture(scope="module")
def reproduced(client, worker, live_url, tmp_path_factory):
    where = tmp_path_factory.mktemp("reproduce")
    doc = where / "reproduction.md"
    doc.write_text("# Notes written by hand\n\nKept as they are.\n")
    state = where / "state.json"
    argv = ["reproduce", "--all", "--budget", "smoke", "--url", live_url, "--state", str(state),
            "--doc", str(doc)]
    assert main(argv) == 0
    first = json.loads(state.read_text())
    total = client.get("/experiments", params={"limit": 1}).json()["total"]
    return {"argv": argv, "doc": doc, "state": state, "first": first, "total": total}


def test_the_final_sweep_trains_each_loss_at_its_tuned_lambda(client, reproduced):
    row = reproduced["first"]["rows"]["digits/ffnn"]
    tune = client.get(f"/sweeps/{row['tune']}/report", params={"clustering": "false"}).json()
    picked = {loss: t["tuned_lambda"] for loss, t in tune["lambda_tuning"].items() if loss != "cce"}
    assert picked and row["tuned"] == picked
    final = _sweep(client, row["final"])
    assert final["lam_by_loss"] == picked and final["finished"]
    smoke = BUDGETS["smoke"][0]
    for eid in final["experiment_ids"]:
        spec = client.get(f"/experiments/{eid}").json()["spec"]
        assert spec["epochs"] == smoke.epochs
        if spec["loss"] != "cce":
            assert spec["lam"] == picked[spec["loss"]]
    assert final["size"] == smoke.seeds * 4


def test_the_doc_gets_the_tables_and_keeps_the_rest(reproduced):
    text = reproduced["doc"].read_text()
    assert text.startswith("# Notes written by hand\n\nKept as they are.\n")
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    block = text.split(BEGIN)[1]
    for name in ("CCE", "Center", "Cosine-COREL", "Gaussian-COREL"):
        assert f"| digits/ffnn | {name} |" in block
    assert "Paired two-tailed t-test" in block and "Clustering of the test latent space" in block
    assert "| digits/ffnn | tune: 2 lambdas x 1 seed(s) x 2 epochs; final: 2 seeds x 3 epochs" in block


def test_running_it_again_creates_nothing_and_replaces_the_block(client, reproduced):
    assert main(reproduced["argv"]) == 0
    again = json.loads(reproduced["state"].read_text())
    row, before = again["rows"]["digits/ffnn"], reproduced["first"]["rows"]["digits/ffnn"]
    assert (row["tune"], row["final"]) == (before["tune"], before["final"])
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == reproduced["total"]
    assert reproduced["doc"].read_text().count(BEGIN) == 1


def test_a_sweep_the_service_lost_is_created_again(client, reproduced):
    state = json.loads(reproduced["state"].read_text())
    row = state["rows"]["digits/ffnn"]
    for key in ("report", "final_markdown", "finished"):
        row.pop(key)
    row["final"] = 2_000_000_000  # the service has no such sweep (a new database)
    reproduced["state"].write_text(json.dumps(state))
    assert main(reproduced["argv"]) == 0
    row = json.loads(reproduced["state"].read_text())["rows"]["digits/ffnn"]
    assert row["final"] != 2_000_000_000 and _sweep(client, row["final"])["finished"]


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
