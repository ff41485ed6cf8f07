"""A promotion whose worker is killed while it embeds the candidate's collection: the
alias serves the old version until the flip, and a new worker takes the promotion over and
ends it as an uninterrupted one ends (issue 72's reliability)."""

from __future__ import annotations

import numpy as np

from harness.wait import wait_until
from tests.app.conftest import DIGITS_SPEC, finished, npz_bytes, own_stack, wait_for

ENDED = ("succeeded", "refused", "conflict", "failed")


def test_a_promotion_whose_worker_dies_while_it_embeds_resumes_and_flips(settings, workers, tmp_path):
    # HNSW from 2,000 rows: the candidate's index of a 10,000-row collection takes seconds to
    # build, a window to kill the worker in.
    with own_stack(settings.model_copy(update={"index_exact_below_rows": 2000}), tmp_path / "var") as (own, client):
        first = workers.start(own)
        runs = [client.post("/experiments", json={**DIGITS_SPEC, "loss": loss, "lam": 0.8}).json()["id"]
                for loss in ("cosine", "gaussian")]
        for run in runs:
            assert wait_for(client, run, finished, workers=workers)["status"] == "succeeded"
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 16, (10_000, 8, 8)).astype(np.float32)
        up = client.post("/datasets", files={"file": ("many.npz", npz_bytes(x=x, y=rng.integers(0, 10, 10_000)))})
        assert up.status_code == 201, up.text
        dataset = up.json()["id"]
        assert client.post("/models", json={"name": "digits"}).status_code == 201
        for run in runs:
            assert client.post("/models/digits/versions", json={"experiment_id": run}).status_code == 201
        assert client.post("/models/digits/collections", json={"dataset_id": dataset}).status_code == 202

        def promote(version, expected):
            r = client.post("/models/digits/aliases/production",
                            json={"version": version, "expected_version": expected, "force": True})
            assert r.status_code == 202, r.text
            return r.json()["promotion_id"]

        def promotion(pid):
            return client.get(f"/models/digits/promotions/{pid}").json()

        one = promote(1, None)
        assert wait_until(lambda: promotion(one)["status"] in ENDED, 300, "the first promotion") and \
            promotion(one)["status"] == "succeeded", promotion(one)
        rows = x[:4].tolist()

        def search():
            r = client.post("/models/digits/neighbors", json={"alias": "production", "collection": dataset,
                                                              "arrays": rows, "k": 5})
            assert r.status_code == 200, r.text
            return r.json()

        assert search()["model_version"] == 1
        two = promote(2, 1)
        wait_until(lambda: promotion(two)["status"] == "embedding", 120, "the promotion to embed", interval=0.02)
        workers.kill(first)
        killed = promotion(two)
        assert killed["status"] == "embedding", killed
        # Until the flip the alias names version 1, and its index answers.
        assert client.get("/models/digits").json()["aliases"] == {"production": 1}
        assert search()["model_version"] == 1
        second = workers.start(own)
        try:
            wait_until(lambda: promotion(two)["status"] in ENDED, 300, "the promotion taken over")
        finally:
            workers.kill(second)
        ended = promotion(two)
        assert ended["status"] == "succeeded", ended
        model = client.get("/models/digits").json()
        assert model["aliases"] == {"production": 2}
        builds = model["collections"][0]["builds"]
        assert [(b["version"], b["status"]) for b in builds] == [(1, "succeeded"), (2, "succeeded")]
        got = search()
        assert (got["model_version"], got["index_id"]) == (2, builds[1]["index_id"])
        index = client.get(f"/indexes/{builds[1]['index_id']}").json()
        job = client.get(f"/embeddings/{builds[1]['embedding_job_id']}").json()
        assert index["status"] == job["status"] == "succeeded" and index["n_total"] == 10_000
        assert index["kind"] == "hnsw"
        # As uninterrupted: the same rows found as an exact search of the same embedding.
        exact = client.post(f"/experiments/{runs[1]}/index", json={"embedding_job_id": job["id"], "kind": "exact"})
        assert exact.status_code == 202, exact.text
        third = workers.start(own)
        try:
            wait_until(lambda: client.get(f"/indexes/{exact.json()['id']}").json()["status"] == "succeeded", 120,
                       "the exact index")
        finally:
            workers.kill(third)
        want = client.post(f"/experiments/{runs[1]}/neighbors",
                           json={"arrays": rows, "k": 5, "index_id": exact.json()["id"]}).json()["results"]
        hits = [len({n["row"] for n in g["neighbors"]} & {n["row"] for n in w["neighbors"]})
                for g, w in zip(got["results"], want, strict=True)]
        assert sum(hits) >= 18, hits  # HNSW's recall on 20 neighbours, at the index's measured target
