"""Sweeps over HTTP on PostgreSQL + Redis + a real worker."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from app.main import create_app
from app.services.sweep_render import lambda_png, rows_by_table, to_markdown
from corel import report as corel_report
from tests.app.conftest import wait_body
from tests.corel.test_report import records as report_records

BASE = {"dataset": "digits", "model": "ffnn", "epochs": 2, "lr": 3e-3, "batch_size": 64}


def wait_sweep(client, sweep_id, timeout=240, workers=None):
    return wait_body(client, f"/sweeps/{sweep_id}", lambda body: body["finished"], timeout, workers,
                     interval=0.3)


def test_cancel_stops_queued_members(settings):
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        r = c.post("/sweeps", json={"base": BASE, "grid": {"seed": [0, 1, 2]}, "vectorize": False})
        assert r.status_code == 202 and r.json()["groups"] == 3
        sid = r.json()["id"]
        assert c.get(f"/sweeps/{sid}").json()["counts"]["queued"] == 3
        body = c.post(f"/sweeps/{sid}/cancel").json()
        assert body["counts"]["cancelled"] == 3 and body["finished"]


def test_a_sweep_names_the_losses_its_members_train(settings):
    """The list showed a sweep's base and grid: a sweep of one loss given in the base, or of
    the spec's default loss, named no loss at all in the dashboard."""
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    bodies = {"base": {"base": {**BASE, "loss": "triplet", "miner": "hard"}, "grid": {"seed": [0, 1]}},
              "grid": {"base": BASE, "grid": {"loss": ["cce", "cosine"], "seed": [0]}},
              "default": {"base": BASE, "grid": {"seed": [0]}}}
    expected = {"base": ["triplet"], "grid": ["cce", "cosine"], "default": ["gaussian"]}
    with TestClient(create_app(idle)) as c:
        ids = {}
        for name, body in bodies.items():
            r = c.post("/sweeps", json=body)
            assert r.status_code == 202, r.text
            ids[name] = r.json()["id"]
        listed = {s["id"]: s for s in c.get("/sweeps", params={"limit": 200}).json()["items"]}
        for name, sid in ids.items():
            assert listed[sid]["losses"] == expected[name], (name, listed[sid])
            assert c.get(f"/sweeps/{sid}").json()["losses"] == expected[name]
            c.post(f"/sweeps/{sid}/cancel")


def test_a_sweep_says_which_members_train_together(settings):
    """Issue 70: every loss stacks, so a sweep's members split only by what cannot: here the
    loss (each its own head) and the triplet miner (a name the code branches on), never the
    seeds or a peer's option. The answer and the sweep say how (member_groups)."""
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    body = {"base": {**BASE, "loss": "triplet"},
            "grid": {"miner": ["hard", "semihard"], "margin": [0.05, 0.2], "seed": [0, 1]}}
    with TestClient(create_app(idle)) as c:
        r = c.post("/sweeps", json=body)
        assert r.status_code == 202, r.text
        answer = r.json()
        sweep = c.get(f"/sweeps/{answer['id']}").json()
        assert sweep["member_groups"] == answer["member_groups"] and answer["groups"] == 2 == len(answer["member_groups"])
        assert sorted(i for ids in answer["member_groups"] for i in ids) == sorted(sweep["experiment_ids"])
        for ids in answer["member_groups"]:
            specs = [c.get(f"/experiments/{i}").json()["spec"] for i in ids]
            assert len({s["miner"] for s in specs}) == 1 and len(specs) == 4, specs  # margins x seeds
            assert {(s["margin"], s["seed"]) for s in specs} == {(m, s) for m in (0.05, 0.2) for s in (0, 1)}
        mixed = c.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cosine", "arcface"], "seed": [0, 1]}}).json()
        assert [len(ids) for ids in mixed["member_groups"]] == [2, 2], mixed
        alone = c.post("/sweeps", json={"base": BASE, "grid": {"seed": [0, 1]}, "vectorize": False}).json()
        assert [len(ids) for ids in alone["member_groups"]] == [1, 1], alone
        for sid in (answer["id"], mixed["id"], alone["id"]):
            c.post(f"/sweeps/{sid}/cancel")


def test_a_group_past_its_limit_is_split(settings):
    """COREL_MAX_GROUP_SIZE: 2 lambdas x 3 seeds in groups of at most 3 (no group of 6)."""
    idle = settings.model_copy(update={"queue": "corel-nobody-listens", "max_group_size": 3})
    with TestClient(create_app(idle)) as c:
        r = c.post("/sweeps", json={"base": BASE, "grid": {"lam": [0.2, 0.5], "seed": [0, 1, 2]}})
        assert r.status_code == 202 and r.json()["size"] == 6 and r.json()["groups"] == 2, r.text
        c.post(f"/sweeps/{r.json()['id']}/cancel")


def test_cce_is_not_repeated_per_lambda(settings):
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        r = c.post("/sweeps", json={"base": BASE, "grid": {"loss": ["cce", "gaussian"],
                                                           "lam": [0.2, 0.5, 0.9], "seed": [0, 1]}})
        assert r.status_code == 202 and r.json()["size"] == 2 + 6
        c.post(f"/sweeps/{r.json()['id']}/cancel")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"base": BASE, "grid": {"lam": [0.1 * i for i in range(1, 11)], "seed": list(range(300))}},
         "the grid has 3000 combinations; the limit is 2000"),
        ({"base": BASE, "grid": {"lam": [0.5, 1.5]}}, "the member with lam=1.5 is not a valid spec"),
        ({"base": BASE, "grid": {"colour": ["red"]}}, "grid field 'colour' is not allowed"),
        ({"base": BASE, "grid": {}}, "grid is empty"),
        ({"base": BASE, "grid": {"lam": []}}, "has no values"),
        ({"base": {**BASE, "loss": "npair"}, "grid": {"seed": [0]}}, "unknown loss 'npair'"),
        ({"base": {**BASE, "loss": "arcface"}, "grid": {"margin": [10, -1]}},
         "the member with margin=-1 is not a valid spec: margin: margin for loss "
         "'arcface' must be a number in [0, 90); got -1"),
        ({"base": BASE, "grid": {"loss": ["cce", "supcon"], "temperature": [0.1]}},
         "loss 'cce' takes no temperature"),
    ],
)
def test_bad_sweeps_are_422(client, body, words):
    r = client.post("/sweeps", json=body)
    assert r.status_code == 422, r.text
    assert words in r.json()["detail"]


def test_unknown_sweep_is_404(client):
    for path in ("/sweeps/987654", "/sweeps/987654/report", "/sweeps/987654/lambda.png"):
        r = client.get(path)
        assert r.status_code == 404 and "sweep 987654 does not exist" in r.json()["detail"]
    assert client.post("/sweeps/987654/cancel").status_code == 404


def test_the_markdown_report_puts_the_papers_clustering_beside_ours():
    published = corel_report.PAPER_CLUSTERING[("fashion-mnist", "cnn")]
    rep = {"sweep_id": 1, "dataset": "fashion-mnist", "model": "cnn", "size": 5, "succeeded": 5,
           "not_succeeded": {}, "lambda_tuning": corel_report.lambda_tuning(report_records()),
           "test_accuracy": {"rows": [], "comparison": None},
           "clustering": corel_report.clustering_table(report_records(), paper=published), "retrieval": None}
    text = to_markdown(rep, None)
    assert "| paper accuracy | paper ARI | paper V-measure | paper silhouette |" in text
    assert "| 91.30 | 0.824 | 0.840 | 0.740 |" in text
    paper_rows = [r for r in rows_by_table(rep) if r["table"] == "clustering_paper"]
    assert {r["score"]: r["value"] for r in paper_rows} == published[("gaussian", "kmeans")]


def test_the_lambda_plot_of_a_sweep_without_results_says_so_without_a_warning():
    # Before any run of a sweep has finished its report has no lambda rows; the plot then
    # says so instead of drawing an empty legend (matplotlib warned on every such request).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        empty = Image.open(io.BytesIO(lambda_png({"sweep_id": "s", "lambda_tuning": {}})))
        full = Image.open(io.BytesIO(lambda_png(
            {"sweep_id": "s", "lambda_tuning": corel_report.lambda_tuning(report_records())})))
    assert empty.format == full.format == "PNG" and empty.size == full.size == (800, 500)
    # The message is drawn in the middle of the axes, where the empty plot had nothing.
    middle = np.asarray(empty.convert("L"))[230:270, 200:600]
    assert middle.min() < 200


@pytest.mark.parametrize(("body", "words"), [
    ({"grid": {"lam": [0.3, 0.6]}, "prune": {"eta": 1}}, "prune.eta: Input should be greater than or equal to 2"),
    ({"grid": {"lam": [0.3, 0.6]}, "prune": {"min_epochs": 2}},
     "prune.min_epochs is 2, but the runs train 2 epochs; the first rung must come before the last epoch: at most 1"),
    ({"grid": {"lam": [0.3, 0.6]}, "prune": {"metric": "val_loss"}}, "prune.metric"),
    ({"grid": {"lam": [0.3]}, "prune": {"min_epochs": 1}},
     "prune needs stacked groups of at least 2 members to judge; the sweep has one member"),
    ({"grid": {"lam": [0.3, 0.6]}, "vectorize": False, "prune": {"min_epochs": 1}},
     "prune needs vectorize: true"),
    # The miner decides which code runs: each its own group (a peer's numbers stack, issue 70).
    ({"grid": {"miner": ["hard", "semihard"]}, "base": {**BASE, "loss": "triplet"}, "prune": {"min_epochs": 1}},
     "2 of its 2 members train alone (a grid over fields that cannot stack, such as the triplet miner"),
])
def test_bad_pruning_is_a_422_that_says_what_is_allowed(client, body, words):
    before = client.get("/sweeps", params={"limit": 1}).json()["total"]
    r = client.post("/sweeps", json={"base": BASE, **body})
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert client.get("/sweeps", params={"limit": 1}).json()["total"] == before
