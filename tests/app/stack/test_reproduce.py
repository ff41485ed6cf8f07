"""`corel reproduce --all` against a live service (PostgreSQL + Redis + a real worker),
with the smoke budget: the tune sweep picks each loss's lambda, the final sweep trains
each loss at it, the tables land between the markers, and a second run creates nothing."""

from __future__ import annotations

import json

import pytest

from app.cli.reproduce import BUDGETS, markers
from corel.cli import main

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
