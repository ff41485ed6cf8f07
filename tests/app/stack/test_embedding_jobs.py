"""Batch embedding jobs on a real worker: 100,000 digits-like rows embedded in batches,
stored, and downloaded; the download equals /embed of the same rows. Cancellation, bad
inputs and the result's formats."""

from __future__ import annotations

import io

import numpy as np
import pytest
from sklearn.datasets import load_digits

from tests.app.conftest import finished, npz_bytes, wait_body, wait_for
from tests.conftest import assert_rows_close

ROWS = 100_000



def wait_job(client, job_id: int, timeout: float = 300) -> dict:
    return wait_body(client, f"/embeddings/{job_id}", timeout=timeout)


@pytest.fixture(scope="module")
def model(client, worker) -> int:
    d = load_digits()
    ds = client.post("/datasets", files={"file": ("digits.npz", npz_bytes(x=d.data.astype(np.float32), y=d.target))})
    assert ds.status_code == 201, ds.text
    eid = client.post("/experiments", json={"dataset": "npz", "dataset_id": ds.json()["id"], "epochs": 2,
                                            "lr": 0.003, "batch_size": 64}).json()["id"]
    assert wait_for(client, eid, finished)["status"] == "succeeded"
    return eid


@pytest.fixture(scope="module")
def many(client) -> tuple[int, np.ndarray, np.ndarray]:
    d = load_digits()
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(d.data), ROWS)
    x = np.clip(d.data[pick] + rng.normal(0, 1.0, (ROWS, 64)), 0, 16).astype(np.float32)
    y = d.target[pick]
    r = client.post("/datasets", files={"file": ("many.npz", npz_bytes(x=x, y=y))})
    assert r.status_code == 201, r.text
    return r.json()["id"], x, y


def test_a_job_of_100k_rows_equals_embed_of_the_same_rows(client, model, many):
    dataset_id, x, y = many
    r = client.post(f"/experiments/{model}/embeddings", json={"dataset_id": dataset_id})
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued" and r.json()["n_total"] == ROWS
    job = wait_job(client, r.json()["id"])
    assert job["status"] == "succeeded" and job["n_done"] == ROWS and job["dim"] == 128, job
    table = np.load(io.BytesIO(client.get(f"/embeddings/{job['id']}/result").content), allow_pickle=False)
    assert table.shape == (ROWS,)
    np.testing.assert_array_equal(table["label"], y)
    served = []
    for start in range(0, ROWS, 4096):
        part = x[start:start + 4096]
        r = client.post("/embed", params={"experiment_id": model, "dtype": "float32",
                                          "shape": ",".join(map(str, part.shape))},
                        content=part.tobytes(), headers={"content-type": "application/octet-stream",
                                                         "accept": "application/octet-stream"})
        assert r.status_code == 200, r.text
        served.append(np.frombuffer(r.content, np.float32).reshape(len(part), -1))
    assert_rows_close(table["h"], np.concatenate(served))
    csv_text = client.get(f"/embeddings/{job['id']}/result", params={"format": "csv"}).text
    assert csv_text.count("\n") == ROWS + 1


def test_a_job_is_cancelled(client, model, many):
    job_id = client.post(f"/experiments/{model}/embeddings", json={"dataset_id": many[0]}).json()["id"]
    r = client.post(f"/embeddings/{job_id}/cancel")
    assert r.status_code in (200, 409), r.text  # 409: it finished before the cancel arrived
    job = wait_job(client, job_id)
    if r.status_code == 200:
        assert job["status"] == "cancelled" and job["n_done"] < ROWS, job
        res = client.get(f"/embeddings/{job_id}/result")
        assert res.status_code == 409 and "needs a succeeded job" in res.json()["detail"]
        assert client.post(f"/embeddings/{job_id}/cancel").status_code == 409


def test_bad_jobs_are_refused(client, model, worker):
    r = client.post(f"/experiments/{model}/embeddings", json={"dataset_id": 2_000_000})
    assert r.status_code == 404 and "dataset_id 2000000 does not exist" in r.json()["detail"]
    texts = ["a short text", "another one", "and a third"] * 2
    up = client.post("/datasets", files={"file": ("t.csv", "text,label\n" + "\n".join(
        f"{t},{'ab'[i % 2]}" for i, t in enumerate(texts)))}).json()
    r = client.post(f"/experiments/{model}/embeddings", json={"dataset_id": up["id"]})
    assert r.status_code == 422 and "cannot feed experiment" in r.json()["detail"], r.text
    queued = client.post("/experiments", json={"dataset": "digits", "epochs": 500}).json()["id"]
    try:
        r = client.post(f"/experiments/{queued}/embeddings", json={"dataset_id": up["id"]})
        assert r.status_code == 409, r.text
    finally:
        client.post(f"/experiments/{queued}/cancel")
    assert client.get("/embeddings/2000000000").status_code == 404
    r = client.post(f"/experiments/{model}/embeddings", json={"dataset_id": "1"})
    assert r.status_code == 422


def test_a_job_whose_message_was_lost_or_whose_worker_died_is_sent_again(client, settings, model, worker):
    """Embedding jobs have a training run's guarantees: one never sent (its message lost),
    and one claimed by a worker that died, are both sent again by the running worker's
    reconciler once their delay (one lease here) has passed, claimed, and finished."""
    from datetime import timedelta

    from app.core.db import make_engine, make_sessionmaker, session_scope
    from app.core.models import EmbeddingJob, utcnow

    d = load_digits()
    up = client.post("/datasets", files={"file": ("few.npz", npz_bytes(x=d.data[:300].astype(np.float32),
                                                                   y=d.target[:300]))}).json()
    factory = make_sessionmaker(make_engine(settings.db_url))
    long_ago = utcnow() - timedelta(hours=1)
    with session_scope(factory) as session:
        lost = EmbeddingJob(experiment_id=model, dataset_id=up["id"], status="queued", n_total=300,
                            n_done=0, cancel_requested=False, created_at=long_ago, attempts=0,
                            enqueued_at=long_ago, enqueues=1)
        dead = EmbeddingJob(experiment_id=model, dataset_id=up["id"], status="running", n_total=300,
                            n_done=0, cancel_requested=False, created_at=long_ago, attempts=1,
                            worker="a-host-that-died:1:0", heartbeat_at=long_ago,
                            started_at=long_ago, enqueued_at=long_ago, enqueues=1)
        session.add_all([lost, dead])
        session.flush()
        ids = [lost.id, dead.id]
    for job_id in ids:
        job = wait_job(client, job_id, timeout=60)
        assert job["status"] == "succeeded" and job["n_done"] == 300, job
    with session_scope(factory) as session:
        rows = session.query(EmbeddingJob).filter(EmbeddingJob.id.in_(ids)).order_by(EmbeddingJob.id).all()
        assert all(r.enqueues >= 2 for r in rows)  # sent again by the reconciler
        # Claimed once each: the lost one for the first time, the dead one taken over.
        assert [r.attempts for r in rows] == [1, 2] and rows[1].worker != "a-host-that-died:1:0"
