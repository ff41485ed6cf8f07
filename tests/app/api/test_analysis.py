"""Clustering reports, pictures and comparisons over HTTP, against PostgreSQL, Redis and a real
Celery worker that trains the experiments.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_analysis.py."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.app.stack.test_analysis import _three_classes


@pytest.mark.parametrize("path", ["clustering", "latent.png", "curves.png"])
def test_unknown_experiment_is_404(client, path):
    r = client.get(f"/experiments/987654/{path}")
    assert r.status_code == 404 and r.json()["error"] == "not_found"


def test_unfinished_experiment_is_409(client, settings):
    # A queue no worker listens to keeps the experiment queued.
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        eid = c.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"]
        try:
            r = c.get(f"/experiments/{eid}/clustering")
            assert r.status_code == 409
            assert r.json()["detail"] == (
                f"experiment {eid} is queued; clustering needs a succeeded experiment (or one "
                "cancelled after its first epoch)")
            r = c.get(f"/experiments/{eid}/latent.png")
            assert r.status_code == 409 and "is queued" in r.json()["detail"]
            r = c.get(f"/experiments/{eid}/curves.png")  # no epoch yet
            assert r.status_code == 409 and "no finished epoch" in r.json()["detail"]
            r = c.get("/experiments/compare", params={"ids": str(eid)})
            assert r.status_code == 409
            assert f"experiment {eid} is queued" in r.json()["detail"]
        finally:
            c.post(f"/experiments/{eid}/cancel")
            c.delete(f"/experiments/{eid}")


@pytest.mark.parametrize(("query", "status", "words"), [
    ("", 422, ["ids"]),
    ("ids=", 422, ["ids"]),
    ("ids=1,x", 422, ["integers", "'x'"]),
    ("ids=" + ",".join(str(i) for i in range(1, 52)), 422, ["at most 50", "51"]),
    ("ids=1&format=xml", 422, ["format", "json", "csv"]),
])
def test_compare_bad_requests(client, query, status, words):
    r = client.get(f"/experiments/compare?{query}")
    assert r.status_code == status, r.text
    assert all(w in r.json()["detail"] for w in words), r.json()


@pytest.mark.parametrize("similarity", ["dot", "cosine", "gaussian"])
def test_latent_picture_puts_each_class_vector_by_its_class(similarity):
    """CCE's W is tiny beside h: drawn where it lies, all ten stars sat in one heap at the
    origin. Each head's W is drawn as its similarity reads it, next to its own class."""
    import numpy as np

    from app.services.figures import latent_projection

    reps, labels, W = _three_classes(1e-3 if similarity == "dot" else 10.0)
    points, stars, _ = latent_projection(reps, W, similarity)
    centroids = np.stack([points[labels == c].mean(axis=0) for c in range(3)])
    spread = np.linalg.norm(centroids[0] - centroids[1])
    for c in range(3):
        distances = np.linalg.norm(centroids - stars[c], axis=1)
        assert distances.argmin() == c and distances[c] < 0.2 * spread, (similarity, c, distances)


def test_latent_picture_rejects_an_unknown_similarity():
    from app.services.figures import latent_projection

    reps, _, W = _three_classes(1.0)
    with pytest.raises(ValueError, match="expected one of"):
        latent_projection(reps, W, "manhattan")
