"""Past one machine: the scenarios of a cluster of hosts (harness/hosts.py).

No host shares a disk with another: checkpoints travel through the S3 store (SeaweedFS on
the database host), uploads and results through the database. Each test leaves the cluster whole (cables mended, partitions healed).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import httpx
import numpy as np
import psycopg
import redis
from sklearn.datasets import load_digits

from harness.hosts import Cluster
from harness.wait import wait_until
from tests.cluster.conftest import wait

BASE = {"dataset": "npz", "epochs": 6, "lr": 0.003, "batch_size": 64, "loss": "cosine"}


def host_of(cluster: Cluster, table: str, row_id: int) -> str:
    """Which host's worker holds (or last held) the row: its hostname is corel-<host>."""
    worker = cluster.sql(f"SELECT worker FROM {table} WHERE id = %s", row_id)[0][0]
    assert isinstance(worker, str), worker
    return worker.split(":")[0].removeprefix("corel-")


def other(host: str) -> str:
    return {"w1": "w2", "w2": "w1"}[host]


def came_back(cluster: Cluster, host: str, since: int, what: str, timeout: float = 90) -> str:
    """Wait until the host's worker has met ``what`` (a job it no longer owns) again after
    its cable was mended: its log, from offset ``since``, says it did not take it."""
    def met() -> str | None:
        text = cluster.hosts[host].log("worker.log")[since:]
        return next((line for line in text.splitlines()
                     if what in line and ("not claimed" in line or "lost the lease" in line)), None)

    return wait_until(met, timeout, f"{host} to come back to {what}", interval=0.2,
                      detail=lambda: cluster.hosts[host].log("worker.log")[since:][-4000:])


def waiting_on(cluster: Cluster, table: str, timeout: float = 60) -> None:
    """Wait until a worker's statement waits for the lock the test holds on ``table``."""
    wait_until(lambda: cluster.sql("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   "AND query ILIKE %s AND pid <> pg_backend_pid()", f"%{table}%"),
               timeout, f"a worker to reach {table}", interval=0.05)


def experiment_state(cluster: Cluster, experiment_id: int) -> dict[str, Any]:
    """Everything a lost host could overwrite: the row, every epoch, the checkpoints, the
    latent spaces."""
    return {
        "row": cluster.sql("SELECT status, worker, attempts, finished_at, current_epoch, best_epoch, "
                           "best_val_accuracy, test_accuracy FROM experiments WHERE id = %s", experiment_id),
        "epochs": cluster.sql("SELECT id, epoch, train_loss, val_accuracy, test_accuracy FROM epoch_metrics "
                              "WHERE experiment_id = %s ORDER BY id", experiment_id),
        "checkpoints": cluster.sql("SELECT kind, epoch, sha256, created_at FROM checkpoints "
                                   "WHERE experiment_id = %s ORDER BY kind", experiment_id),
        "latent": cluster.sql("SELECT split, representations_sha256, labels_sha256 FROM latent_spaces "
                              "WHERE experiment_id = %s ORDER BY split", experiment_id),
    }


def test_1_a_sweep_is_trained_by_both_worker_hosts(cluster: Cluster, api: httpx.Client, upload: int) -> None:
    r = api.post("/sweeps", json={"base": {**BASE, "dataset_id": upload},
                                  "grid": {"lam": [0.2, 0.4, 0.6, 0.8], "seed": [1, 2]},
                                  "vectorize": False})
    assert r.status_code == 202, r.text
    sweep = r.json()
    assert sweep["size"] == 8 and sweep["groups"] == 8
    body = wait(api, f"/sweeps/{sweep['id']}", lambda b: b["done"] == 8, timeout=300)
    members = api.get("/experiments", params={"sweep_id": sweep["id"], "limit": 50}).json()["items"]
    assert [m["status"] for m in members] == ["succeeded"] * 8, body
    hosts = {host_of(cluster, "experiments", m["id"]) for m in members}
    assert hosts == {"w1", "w2"}, hosts
    # Each worker host read the upload from the S3 store into its own var directory.
    for host in ("w1", "w2"):
        assert list((cluster.hosts[host].var_dir / "cache").glob(f"dataset-{upload}-*")), host


def test_5_embed_on_the_api_host_serves_a_model_trained_on_a_worker_host(
        cluster: Cluster, api: httpx.Client, upload: int) -> None:
    r = api.post("/experiments", json={**BASE, "dataset_id": upload, "lam": 0.8})
    assert r.status_code == 202, r.text
    eid = r.json()["id"]
    assert wait(api, f"/experiments/{eid}")["status"] == "succeeded"
    trained_on = host_of(cluster, "experiments", eid)
    x = load_digits().data[:16].astype(np.float32)
    r = api.post("/embed", json={"experiment_id": eid, "arrays": x.tolist()})
    assert r.status_code == 200, r.text
    served = r.json()
    # The checkpoint the worker host stored, byte for byte, is the one the API host serves.
    (sha,), = cluster.sql("SELECT sha256 FROM checkpoints WHERE experiment_id = %s "
                          "AND kind = 'best'", eid)
    blob = cluster.s3.client().get_object(Bucket=cluster.s3.BUCKET,
                                          Key=f"artifacts/{sha}")["Body"].read()
    assert served["checkpoint"]["sha256"] == sha == hashlib.sha256(blob).hexdigest()
    from corel.serving import ServedModel

    here = ServedModel.from_bytes(blob, "cpu")
    want = here.embed(here.prepare(x)).numpy()
    np.testing.assert_allclose(np.asarray(served["embeddings"], np.float32), want, rtol=1e-5, atol=1e-6)
    # Nothing of it was on the API host's disk: it came from the S3 store, and the API
    # host keeps the one copy it read, in its cache.
    cached = cluster.hosts["api"].var_dir / "artifacts" / "s3-cache" / sha[:2] / sha
    assert cached.read_bytes() == blob, trained_on


def test_6_an_encoder_uploaded_to_the_api_host_is_trained_on_by_a_worker_host_and_served(
        cluster: Cluster, api: httpx.Client, tmp_path) -> None:
    """An uploaded encoder's file goes from the API host to the S3 store; the worker host that
    trains on it fetches it from there, and the API host serves the trained model, fetching it
    again: no host reads another's disk."""
    from tests.encoder_files import timm_weights

    weights = timm_weights(tmp_path / "convnext.safetensors", arch="test_convnext").read_bytes()
    r = api.post("/encoders", files={"file": ("convnext.safetensors", weights)},
                 data={"architecture": "test_convnext"})
    assert r.status_code == 201, r.text
    enc = r.json()
    digest = hashlib.sha256(weights).hexdigest()
    stored = cluster.s3.client().get_object(Bucket=cluster.s3.BUCKET, Key=f"artifacts/{digest}")
    assert stored["Body"].read() == weights
    spec = {"dataset": "digits", "encoder_id": enc["id"], "loss": "gaussian", "lam": 0.8, "epochs": 3,
            "lr": 0.01, "train_subset": 300, "hidden": 16, "batch_size": 16}
    r = api.post("/experiments", json=spec)
    assert r.status_code == 202, r.text
    body = wait(api, f"/experiments/{r.json()['id']}")
    assert body["status"] == "succeeded", body.get("error")
    trained_on = host_of(cluster, "experiments", body["id"])
    got = api.post("/embed", json={"experiment_id": body["id"], "arrays": [[[0.0] * 8] * 8]})
    assert got.status_code == 200, got.text
    for host in (trained_on, "api"):  # each fetched it from the store into its own cache
        cached = cluster.hosts[host].var_dir / "artifacts" / "s3-cache" / digest[:2] / digest
        assert cached.read_bytes() == weights, host


def test_2_a_lost_worker_host_s_run_resumes_on_the_other(
        cluster: Cluster, api: httpx.Client, upload: int) -> None:
    spec = {**BASE, "dataset_id": upload, "lam": 0.6, "epochs": 40, "seed": 5}
    reference = api.post("/experiments", json=spec).json()["id"]
    assert wait(api, f"/experiments/{reference}")["status"] == "succeeded"

    eid = api.post("/experiments", json=spec).json()["id"]
    running = wait(api, f"/experiments/{eid}", lambda b: b["status"] in ("succeeded", "failed")
                   or (b["status"] == "running" and b["current_epoch"] >= 2), timeout=120)
    assert running["status"] == "running", running
    # The worst moment to lose a host: in the middle of an epoch's transaction (the run's
    # row updated and locked, the epoch not written yet). A lock on the epochs' table
    # holds the worker there; its cable is pulled; the lock is let go.
    lost = host_of(cluster, "experiments", eid)
    with psycopg.connect(cluster.admin_url(), connect_timeout=5) as holder:
        holder.execute("LOCK TABLE epoch_metrics IN ACCESS EXCLUSIVE MODE")
        waiting_on(cluster, "epoch_metrics")
        cluster.cut(lost)
        holder.rollback()
    try:
        cut_at = cluster.sql("SELECT current_epoch, status FROM experiments WHERE id = %s", eid)[0]
        assert cut_at[1] == "running" and cut_at[0] < 40, cut_at
        done = wait(api, f"/experiments/{eid}", timeout=180)
        assert done["status"] == "succeeded", done
        assert host_of(cluster, "experiments", eid) == other(lost)
        # Every epoch recorded once, and the same figures as the uninterrupted run.
        ours, ref = experiment_state(cluster, eid), experiment_state(cluster, reference)
        assert [e[1] for e in ours["epochs"]] == list(range(1, 41))
        assert [e[1:] for e in ours["epochs"]] == [e[1:] for e in ref["epochs"]]
        assert ours["row"][0][4:] == ref["row"][0][4:]  # epochs, best epoch, accuracies
        assert ours["row"][0][2] >= 2  # claimed again
        assert ours["latent"] == ref["latent"]
        since = len(cluster.hosts[lost].log("worker.log"))
    finally:
        cluster.mend(lost)
    # Back on the network, the lost host finds the run is no longer its own, and leaves it.
    came_back(cluster, lost, since, f'"experiment": {eid}')
    assert experiment_state(cluster, eid) == ours


def embedding_job(api: httpx.Client, experiment_id: int, dataset_id: int) -> int:
    r = api.post(f"/experiments/{experiment_id}/embeddings", json={"dataset_id": dataset_id})
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def job_state(cluster: Cluster, job_id: int) -> list[tuple[object, ...]]:
    return cluster.sql("SELECT j.status, j.worker, j.attempts, j.finished_at, r.representations_sha256 "
                       "FROM embedding_jobs j JOIN embedding_results r ON r.job_id = j.id WHERE j.id = %s",
                       job_id)


def test_4_a_batch_embedding_job_survives_losing_its_worker_host(
        cluster: Cluster, api: httpx.Client, upload: int) -> None:
    eid = api.post("/experiments", json={**BASE, "dataset_id": upload, "lam": 0.4}).json()["id"]
    assert wait(api, f"/experiments/{eid}")["status"] == "succeeded"
    first = embedding_job(api, eid, upload)
    assert wait(api, f"/embeddings/{first}")["status"] == "succeeded"
    want = job_state(cluster, first)[0][4]

    # Hold the worker at the last step of the job (storing the result) with a lock, pull
    # its host's cable there, then let go: its transaction is open on the database host
    # while its host is gone.
    with psycopg.connect(cluster.admin_url(), connect_timeout=5) as holder:
        holder.execute("LOCK TABLE embedding_results IN ACCESS EXCLUSIVE MODE")
        job = embedding_job(api, eid, upload)
        waiting_on(cluster, "embedding_results")
        lost = host_of(cluster, "embedding_jobs", job)
        cluster.cut(lost)
        holder.rollback()
    try:
        done = wait(api, f"/embeddings/{job}", timeout=120)
        assert done["status"] == "succeeded", done
        state = job_state(cluster, job)
        assert len(state) == 1 and state[0][4] == want  # stored once, the same vectors
        assert host_of(cluster, "embedding_jobs", job) == other(lost)
        since = len(cluster.hosts[lost].log("worker.log"))
    finally:
        cluster.mend(lost)
    came_back(cluster, lost, since, f'"job": {job}')
    assert job_state(cluster, job) == state


def test_4_a_lost_broker_message_for_an_embedding_job_is_sent_again(
        cluster: Cluster, api: httpx.Client, upload: int) -> None:
    eid = int(cluster.sql("SELECT id FROM experiments WHERE status = 'succeeded' ORDER BY id LIMIT 1")[0][0])  # type: ignore[arg-type]
    cluster.stop_worker("w1")
    cluster.stop_worker("w2")
    try:
        job = embedding_job(api, eid, upload)
        broker = redis.Redis.from_url(cluster.redis_url)
        assert broker.llen("corel") == 1  # the message is there ...
        broker.flushall()  # ... and the broker forgets it
        assert cluster.sql("SELECT status, enqueues FROM embedding_jobs WHERE id = %s", job) == [("queued", 1)]
    finally:
        cluster.start_worker("w1", cpu=0)
        cluster.start_worker("w2", cpu=1)
    done = wait(api, f"/embeddings/{job}", timeout=120)
    assert done["status"] == "succeeded", done
    assert cluster.sql("SELECT enqueues FROM embedding_jobs WHERE id = %s", job)[0][0] >= 2  # type: ignore[operator]


def test_3_a_partition_between_the_api_and_the_database(
        cluster: Cluster, api: httpx.Client, upload: int) -> None:
    spec = {**BASE, "dataset_id": upload, "lam": 0.2, "epochs": 30}
    accepted = api.post("/experiments", json=spec)
    assert accepted.status_code == 202, accepted.text
    cluster.partition("api", "db")
    try:
        for method, path, body in (("POST", "/experiments", spec), ("GET", "/experiments", None),
                                   ("GET", f"/experiments/{accepted.json()['id']}", None),
                                   ("POST", "/experiments", spec)):
            started = time.monotonic()
            r = api.request(method, path, json=body)
            took = time.monotonic() - started
            assert r.status_code == 503, (method, path, r.status_code, r.text)
            assert r.headers["content-type"].startswith("application/json") and r.json()["detail"]
            assert took < 6, (method, path, took)
    finally:
        cluster.heal("api")
    wait_until(lambda: api.get("/experiments").status_code == 200, 60, "the API to recover",
               interval=0.2)
    after = api.post("/experiments", json={**spec, "epochs": 3})
    assert after.status_code == 202, after.text
    for eid in (accepted.json()["id"], after.json()["id"]):
        assert wait(api, f"/experiments/{eid}")["status"] == "succeeded"
    # Nothing accepted is lost, and nothing refused was kept.
    statuses = [s for (s,) in cluster.sql("SELECT status FROM experiments")]
    assert statuses and set(statuses) == {"succeeded"}, statuses


def test_7_a_worker_host_trains_on_features_another_host_computed(cluster: Cluster, api: httpx.Client) -> None:
    """Issue 70: a frozen encoder's features go into the artifact store (S3 here). A run on w1
    computes them; a run on w2 (its own disk, its own features folder) reads them from the
    store, computes none, and says so; w2 keeps them in its folder, byte for byte w1's."""
    from tests.encoder_files import TOPICS

    rows = [f"{sentences[i % 4]} ({i}),{topic}" for topic, sentences in TOPICS.items() for i in range(40)]
    r = api.post("/datasets", files={"file": ("topics.csv", ("text,topic\n" + "\n".join(rows) + "\n").encode())},
                 data={"kind": "text"})
    assert r.status_code == 201, r.text
    spec = {"dataset": "text", "dataset_id": r.json()["id"], "encoder": "wordllama", "epochs": 3,
            "batch_size": 8, "hidden": 32, "lr": 1e-2, "loss": "cosine"}

    def trained_on(host: str, **fields: Any) -> dict[str, Any]:
        """A run trained on ``host`` alone: the other host's worker stopped meanwhile."""
        cluster.stop_worker(other(host))
        try:
            r = api.post("/experiments", json={**spec, **fields})
            assert r.status_code == 202, r.text
            body = wait(api, f"/experiments/{r.json()['id']}")
        finally:
            cluster.start_worker(other(host), cpu={"w1": 0, "w2": 1}[other(host)])
        assert body["status"] == "succeeded", body.get("error")
        assert host_of(cluster, "experiments", body["id"]) == host
        return body

    def kept_names() -> set[str]:
        return {str(row[0]) for row in cluster.sql("SELECT name FROM feature_sets")}

    before = kept_names()
    first = trained_on("w1")
    assert first["features"]["source"] == "computed", first["features"]
    kept = sorted(name for name in kept_names() - before if name.endswith(".npy"))
    assert len(kept) == 3, kept  # one a split, put by w1
    second = trained_on("w2", loss="gaussian", lam=0.8)
    assert second["features"]["source"] == "from the store", second["features"]
    for name in kept:
        assert ((cluster.hosts["w2"].var_dir / "features" / name).read_bytes()
                == (cluster.hosts["w1"].var_dir / "features" / name).read_bytes()), name
