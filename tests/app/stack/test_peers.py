"""`corel reproduce --peers` against a live service (PostgreSQL + Redis + a real worker),
with the smoke budget: every loss, the paper's four and pytorch-metric-learning's seven, is
tuned on its grid, trained at its tuned parameters over the seeds, reported with clustering
and MAP@R, and tested against Gaussian- and Cosine-COREL; a second run creates nothing."""

from __future__ import annotations

import json

import pytest

from app.cli.peers import BUDGETS, LOSSES, markers
from corel.cli import main
from corel.loss_catalog import LOSS_NAMES, declaration

BEGIN, END = markers("smoke")


@pytest.fixture(scope="module")
def peers(client, worker, live_url, tmp_path_factory):
    where = tmp_path_factory.mktemp("peers")
    doc = where / "reproduction.md"
    doc.write_text("# By hand\n")
    state = where / "state.json"
    argv = ["reproduce", "--peers", "--budget", "smoke", "--url", live_url, "--state", str(state),
            "--doc", str(doc)]
    assert main(argv) == 0
    total = client.get("/experiments", params={"limit": 1}).json()["total"]
    return {"argv": argv, "doc": doc, "state": state,
            "first": json.loads(state.read_text()), "total": total}


def test_every_loss_is_tuned_then_trained_at_its_tuned_parameters(client, peers):
    row = BUDGETS["smoke"][0]
    st = peers["first"]["rows"]["digits/ffnn"]
    assert set(st["losses"]) == set(LOSSES) == set(LOSS_NAMES)
    for loss in LOSSES:
        ls = st["losses"][loss]
        tune = client.get("/experiments", params={"sweep_id": ls["tune"], "limit": 50}).json()["items"]
        grid = row.grid(loss)
        assert len(tune) == max(1, *(len(v) for v in grid.values())) if grid else len(tune) == 1
        best = max((m for m in tune if m["status"] == "succeeded"),
                   key=lambda m: (m["best_val_accuracy"], -m["id"]))
        assert ls["params"] == {k: best["spec"][k] for k in grid}
        results = ls["results"]
        assert sorted(r["seed"] for r in results) == list(range(row.seeds))
        for r in results:
            exp = client.get(f"/experiments/{r['experiment_id']}").json()
            assert exp["spec"]["loss"] == loss and exp["spec"]["epochs"] == row.epochs
            for k, v in ls["params"].items():
                assert exp["spec"][k] == v
            assert r["status"] == "succeeded", exp
            assert r["test_accuracy"] == exp["test_accuracy"]
            assert 0 <= r["map_at_r"] <= 1 and r["metric"] == declaration(loss).geometry


def test_the_doc_gets_the_table_and_a_second_run_creates_nothing(client, peers):
    text = peers["doc"].read_text()
    assert text.startswith("# By hand\n") and text.count(BEGIN) == 1 and text.count(END) == 1
    block = text.split(BEGIN)[1]
    for loss in LOSSES:
        decl = declaration(loss)
        assert f"| {decl.short}{'' if decl.class_vectors else ' *'} | " in block
    assert "vs Gaussian-COREL" in block and "(p=" in block
    assert main(peers["argv"]) == 0
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == peers["total"]
    assert peers["doc"].read_text().count(BEGIN) == 1


def test_without_doc_the_tables_go_to_reproduction_md_in_the_working_directory(peers, tmp_path,
                                                                                 monkeypatch, capsys):
    """It wrote into docs/reproduction.md below the working directory: run from a checkout,
    it rewrote the project's own page."""
    at = peers["argv"].index("--doc")
    argv = peers["argv"][:at] + peers["argv"][at + 2:]
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert (tmp_path / "reproduction.md").read_text().count(BEGIN) == 1
    assert not (tmp_path / "docs").exists()
    assert f"the tables are in {tmp_path / 'reproduction.md'}" in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["arcface", "supcon", "triplet"])
def test_a_peer_model_exports_predicts_and_finds_neighbours(client, peers, loss):
    """ONNX export, /predict and /neighbors of a peer loss's final run agree: the export's
    similarities are /predict's (class vectors, or the class means of a pair-based loss),
    and a training row's nearest neighbour in the loss's geometry is itself."""
    import numpy as np
    import onnxruntime as ort
    from sklearn.datasets import load_digits

    from corel.data import prepare_images

    eid = peers["first"]["rows"]["digits/ffnn"]["losses"][loss]["results"][0]["experiment_id"]
    images = load_digits().images[:16].astype(np.uint8)  # raw values, as the dataset stores them
    r = client.get(f"/experiments/{eid}/export", params={"format": "onnx"})
    assert r.status_code == 200, r.text
    session = ort.InferenceSession(r.content)
    meta = json.loads(session.get_modelmeta().custom_metadata_map["corel"])
    assert meta["similarity"] == "cosine"
    _, sims = session.run(["embeddings", "similarities"],
                          {"x": prepare_images(images, meta["preprocessing"]).numpy()})
    predicted = client.post("/predict", json={"experiment_id": eid, "arrays": images.tolist()}).json()
    got = np.array([p["similarities"] for p in predicted["predictions"]])
    np.testing.assert_allclose(sims, got, rtol=1e-4, atol=1e-5)
    assert np.abs(got).sum() > 0  # class means were set: not all-zero similarities
    near = client.post(f"/experiments/{eid}/neighbors", json={"arrays": images[:4].tolist(), "k": 3})
    assert near.status_code == 200, near.text
    body = near.json()
    assert body["geometry"] == "cosine"
    assert all(len(q["neighbors"]) == 3 for q in body["results"])
