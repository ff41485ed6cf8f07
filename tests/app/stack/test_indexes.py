"""Nearest-neighbour indexes built by a real worker, stored in PostgreSQL in pieces, and
searched by /neighbors: an exact index answers brute force over the /embed rows, an HNSW
index finds what exact search finds; a batch job's rows are indexed in their own order;
the build has a training run's lease (claimed once, taken over when its worker is gone,
cancellable); bad requests are clear 4xx."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sqlalchemy import update

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.models import EmbeddingJob, NeighborIndex, utcnow
from app.storage import make_store
from corel.index import recall_at_k
from tests.app.conftest import DIGITS_SPEC, finished, npz_bytes, stored_latent, wait_body, wait_for
from worker import indexing


def _wait(client, path: str, timeout: float = 300) -> dict:
    return wait_body(client, path, timeout=timeout)


@pytest.fixture(scope="module")
def factory(settings):
    return make_sessionmaker(make_engine(settings.db_url))


@pytest.fixture(scope="module")
def run(client, worker) -> int:
    """A Gaussian-COREL run on digits of this module's own (no other test's indexes)."""
    eid = client.post("/experiments", json={**DIGITS_SPEC, "loss": "gaussian", "lam": 0.8}).json()["id"]
    assert wait_for(client, eid, finished)["status"] == "succeeded"
    return eid


@pytest.fixture(scope="module")
def queries() -> np.ndarray:
    return load_digits().images[-12:].astype(np.float32)


def _index(client, eid: int, body: dict) -> dict:
    r = client.post(f"/experiments/{eid}/index", json=body)
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued" and r.json()["n_total"] > 0
    return _wait(client, f"/indexes/{r.json()['id']}")


def test_indexes_of_the_training_split_answer_as_exact_search(client, settings, factory, run, queries):
    exact = _index(client, run, {"source": "train", "kind": "exact"})
    hnsw = _index(client, run, {"kind": "hnsw"})
    reference, labels = stored_latent(settings, run, "train")
    for built, kind in ((exact, "exact"), (hnsw, "hnsw")):
        assert built["status"] == "succeeded", built
        assert (built["kind"], built["geometry"], built["n_total"], built["n_done"], built["dim"]) == (
            kind, "euclidean", len(labels), len(labels), reference.shape[1])
        assert built["build_seconds"] > 0 and built["error"] is None
        with session_scope(factory) as session:  # one artifact, all of it
            digest = session.get(NeighborIndex, built["id"]).sha256
        assert len(make_store(settings).read_bytes(digest)) == built["size_bytes"], built
    assert hnsw["ef_search"] >= 10 and hnsw["recall"] >= settings.index_target_recall
    assert hnsw["params"] == {"m": settings.hnsw_m, "ef_construction": settings.hnsw_ef_construction}
    h = np.asarray(client.post("/embed", json={"experiment_id": run, "arrays": queries.tolist()})
                   .json()["embeddings"], np.float64)
    d = np.sqrt(((h[:, None, :] - reference.astype(np.float64)[None, :, :]) ** 2).sum(-1))
    true_d = np.sort(d, axis=1)[:, :10]
    answers = {}
    for built in (exact, hnsw):
        r = client.post(f"/experiments/{run}/neighbors",
                        json={"arrays": queries.tolist(), "k": 10, "index_id": built["id"]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["index_id"] == built["id"] and body["n_reference"] == len(labels)
        answers[built["kind"]] = body
        for result in body["results"]:
            assert all(n["label"] == labels[n["row"]] for n in result["neighbors"])
            assert all(n["class_name"] == str(n["label"]) for n in result["neighbors"])
    # The exact index: the brute-force neighbours of the /embed rows, at their distances.
    for i, result in enumerate(answers["exact"]["results"]):
        assert {n["row"] for n in result["neighbors"]} == set(np.argsort(d[i], kind="stable")[:10].tolist())
        np.testing.assert_allclose([n["distance"] for n in result["neighbors"]], true_d[i], atol=1e-4)
    # HNSW: the rows it returns at their true distances, and nearly all of exact search's.
    found = np.asarray([[n["distance"] for n in r["neighbors"]] for r in answers["hnsw"]["results"]])
    rows = np.asarray([[n["row"] for n in r["neighbors"]] for r in answers["hnsw"]["results"]])
    np.testing.assert_allclose(found, np.take_along_axis(d, rows, 1), atol=1e-4)
    assert recall_at_k(found, true_d) >= 0.9
    # Without index_id: the latest succeeded index (the HNSW one).
    r = client.post(f"/experiments/{run}/neighbors", json={"arrays": queries[:2].tolist()})
    assert r.json()["index_id"] == hnsw["id"]
    listed = client.get(f"/experiments/{run}/indexes").json()
    assert [i["id"] for i in listed][:2] == [hnsw["id"], exact["id"]]


def test_a_batch_jobs_rows_are_indexed_in_their_order(client, run):
    d = load_digits()
    rng = np.random.default_rng(5)
    x = np.clip(d.data[rng.integers(0, len(d.data), 3000)] + rng.normal(0, 0.5, (3000, 64)), 0, 16)
    x = x.astype(np.float32).reshape(-1, 8, 8)
    y = rng.integers(0, 3, 3000)
    names = ["alpha", "beta", "gamma"]  # labels by name: the upload's classes, sorted
    ds = client.post("/datasets", files={"file": ("rows.npz", npz_bytes(x=x, y=np.array(names)[y]))})
    assert ds.status_code == 201, ds.text
    job = client.post(f"/experiments/{run}/embeddings", json={"dataset_id": ds.json()["id"]}).json()
    job = _wait(client, f"/embeddings/{job['id']}")
    assert job["status"] == "succeeded", client.get(f"/embeddings/{job['id']}").json()["error"]
    built = _index(client, run, {"embedding_job_id": job["id"]})
    assert built["status"] == "succeeded" and built["source"] == "embedding_job" and built["n_total"] == 3000
    pick = [0, 17, 2999]
    r = client.post(f"/experiments/{run}/neighbors",
                    json={"arrays": x[pick].tolist(), "k": 3, "index_id": built["id"]})
    assert r.status_code == 200, r.text
    for row, result in zip(pick, r.json()["results"], strict=True):
        first = result["neighbors"][0]  # the row itself: /embed, the job and the index agree
        assert first["row"] == row and first["distance"] < 1e-3, (row, result)
        assert first["label"] == y[row] and first["class_name"] == names[y[row]]


def test_a_build_is_claimed_once_and_taken_over_from_a_lost_worker(client, settings, factory, run):
    with session_scope(factory) as session:
        # As if a worker claimed it and was lost: running, its heartbeat long gone.
        row = NeighborIndex(experiment_id=run, source="train", requested_kind="auto", geometry="euclidean",
                            status="running", n_total=1, n_done=0, cancel_requested=False,
                            created_at=utcnow(), attempts=1, worker="lost-host:1:dead",
                            heartbeat_at=utcnow().replace(year=2020), enqueued_at=utcnow(), enqueues=1)
        session.add(row)
        session.flush()
        index_id = row.id
        # ... and another, claimed by a live worker a moment ago: never built twice at once.
        live = NeighborIndex(experiment_id=run, source="train", requested_kind="auto", geometry="euclidean",
                             status="running", n_total=1, n_done=0, cancel_requested=False,
                             created_at=utcnow(), attempts=1, worker="busy-host:1:alive",
                             heartbeat_at=utcnow(), enqueued_at=utcnow(), enqueues=1)
        session.add(live)
        session.flush()
        live_id = live.id
    assert indexing.build_index(live_id, factory, settings) == "skipped"
    assert indexing.build_index(index_id, factory, settings) == "succeeded"
    body = client.get(f"/indexes/{index_id}").json()
    assert body["status"] == "succeeded" and body["kind"] == "exact", body
    with session_scope(factory) as session:
        assert session.get(NeighborIndex, index_id).attempts == 2
    assert indexing.build_index(index_id, factory, settings) == "skipped"  # a duplicate message
    assert client.get(f"/indexes/{live_id}").json()["status"] == "running"
    with session_scope(factory) as session:
        session.execute(update(NeighborIndex).where(NeighborIndex.id == live_id).values(status="failed"))


def test_bad_index_requests(client, factory, run, queries):
    one = queries[:1].tolist()
    other = client.post("/experiments", json={**DIGITS_SPEC, "epochs": 500}).json()["id"]
    for path, body, status, words in (
        (f"/experiments/{run}/index", {"source": "train", "embedding_job_id": 1}, 422, "not both"),
        (f"/experiments/{run}/index", {"kind": "ivf"}, 422, "'auto', 'exact' or 'hnsw'"),
        (f"/experiments/{run}/index", {"embedding_job_id": 987654}, 404, "embedding job 987654 does not exist"),
        (f"/experiments/{other}/index", {}, 409, "needs a succeeded experiment"),
        ("/experiments/987654/index", {}, 404, "does not exist"),
        (f"/experiments/{run}/neighbors", {"arrays": one, "index_id": 987654}, 404, "index 987654 does not exist"),
    ):
        r = client.post(path, json=body)
        assert r.status_code == status and words in r.json()["detail"], (path, body, r.text)
    client.post(f"/experiments/{other}/cancel")
    assert client.get("/indexes/987654").status_code == 404
    with session_scope(factory) as session:
        # A failed batch job; an index being built by a worker that keeps its lease, and
        # one queued (the reconciler leaves both alone: the lease is fresh, the send recent).
        from app.core.models import DatasetUpload

        later = utcnow() + timedelta(hours=1)
        upload = DatasetUpload(kind="npz", filename="x.npz", size=1, sha256="0" * 64, blob_sha256="0" * 64, summary={})
        session.add(upload)
        session.flush()
        failed = EmbeddingJob(experiment_id=run, dataset_id=upload.id, status="failed", n_total=1, n_done=0,
                              cancel_requested=False, created_at=utcnow(), attempts=1, enqueues=1)
        common = {"experiment_id": run, "source": "train", "requested_kind": "auto", "geometry": "euclidean",
                  "n_total": 1, "n_done": 0, "cancel_requested": False, "created_at": utcnow(),
                  "enqueued_at": later, "enqueues": 1}
        building = NeighborIndex(**common, status="running", attempts=1, worker="busy:1:x", heartbeat_at=later)
        queued = NeighborIndex(**common, status="queued", attempts=0)
        session.add_all([failed, building, queued])
        session.flush()
        failed_id, building_id, queued_id = failed.id, building.id, queued.id
    r = client.post(f"/experiments/{run}/index", json={"embedding_job_id": failed_id})
    assert r.status_code == 409 and f"embedding job {failed_id} is failed" in r.json()["detail"], r.text
    r = client.post(f"/experiments/{run}/neighbors", json={"arrays": one, "index_id": building_id})
    assert r.status_code == 409 and "still being built" in r.json()["detail"], r.text
    # More neighbours than an index has rows (a batch job of 50).
    digits = load_digits()
    ds = client.post("/datasets", files={"file": ("few.npz", npz_bytes(x=digits.images[:50].astype(np.float32),
                                                                   y=digits.target[:50]))}).json()["id"]
    job = client.post(f"/experiments/{run}/embeddings", json={"dataset_id": ds}).json()
    assert _wait(client, f"/embeddings/{job['id']}")["status"] == "succeeded"
    small = _index(client, run, {"embedding_job_id": job["id"]})
    assert small["kind"] == "exact" and small["n_total"] == 50
    r = client.post(f"/experiments/{run}/neighbors", json={"arrays": one, "index_id": small["id"], "k": 51})
    assert r.status_code == 422 and f"index {small['id']} has 50 rows to search; k must be at most 50" \
        in r.json()["detail"], r.text
    # Cancel: a queued build at once; a running one is flagged for its worker; a finished
    # one is a 409.
    r = client.post(f"/indexes/{queued_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert client.post(f"/indexes/{queued_id}/cancel").status_code == 409
    r = client.post(f"/experiments/{run}/neighbors", json={"arrays": one, "index_id": queued_id})
    assert r.status_code == 409 and "never finished" in r.json()["detail"]
    r = client.post(f"/indexes/{building_id}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "running" and r.json()["cancel_requested"]
    with session_scope(factory) as session:
        session.execute(update(NeighborIndex).where(NeighborIndex.id == building_id).values(status="failed"))


def test_an_index_of_another_experiment_is_refused(client, digits_runs, run, queries):
    built = client.get(f"/experiments/{run}/indexes").json()[0]
    other = digits_runs["cosine"]
    r = client.post(f"/experiments/{other}/neighbors", json={"arrays": queries[:1].tolist(), "index_id": built["id"]})
    assert r.status_code == 422 and f"belongs to experiment {run}" in r.json()["detail"], r.text
