"""GET /experiments/{id}/retrieval on runs a real worker trained: the test split's stored
representations as queries among the training split's, in the loss's geometry; equal to
pytorch-metric-learning's AccuracyCalculator on the same stored arrays; computed once."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from pytorch_metric_learning.utils.inference import CustomKNN
from sqlalchemy import create_engine, delete, select
from sqlalchemy.orm import Session

from app.core.models import LatentSpace, RetrievalResult
from tests.app.conftest import DIGITS_SPEC as SPEC
from tests.app.conftest import finished, stored_latent, wait_for

KEYS = ("precision_at_1", "r_precision", "mean_average_precision_at_r")


@pytest.mark.parametrize(("loss", "geometry"), [("cosine", "cosine"), ("gaussian", "euclidean")])
def test_retrieval_equals_pytorch_metric_learning_on_the_stored_rows(client, settings, digits_runs, loss,
                                                                     geometry):
    eid = digits_runs[loss]
    r = client.get(f"/experiments/{eid}/retrieval")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["geometry"] == geometry  # the loss's own, as the clustering report's
    assert body["geometry"] == client.get(f"/experiments/{eid}/clustering").json()["metric"]
    queries, q_y = stored_latent(settings, eid, "test")
    reference, r_y = stored_latent(settings, eid, "train")
    assert body["n_queries"] == len(queries) and body["n_reference"] == len(reference)
    distance = CosineSimilarity() if geometry == "cosine" else LpDistance(normalize_embeddings=False)
    want = AccuracyCalculator(include=KEYS, k="max_bin_count", knn_func=CustomKNN(distance)).get_accuracy(
        torch.tensor(queries), torch.tensor(q_y), torch.tensor(reference), torch.tensor(r_y),
        ref_includes_query=False)
    for key in KEYS:
        assert body[key] == pytest.approx(want[key], abs=1e-6), key
    assert body["precision_at_1"] > 0.8  # a trained model retrieves by class
    # Computed once, then read: the same answer, the same stored seconds.
    assert client.get(f"/experiments/{eid}/retrieval").json() == body


def test_another_geometry_is_computed_and_stored_apart(client, settings, digits_runs):
    eid = digits_runs["gaussian"]
    cosine = client.get(f"/experiments/{eid}/retrieval", params={"geometry": "cosine"}).json()
    euclid = client.get(f"/experiments/{eid}/retrieval").json()
    assert cosine["geometry"] == "cosine" and euclid["geometry"] == "euclidean"
    engine = create_engine(settings.database_url)
    with Session(engine) as session:
        rows = session.scalars(select(RetrievalResult.geometry).where(
            RetrievalResult.experiment_id == eid)).all()
    engine.dispose()
    assert sorted(rows) == ["cosine", "euclidean"]


def test_bad_retrieval_requests(client, settings, digits_runs):
    r = client.get(f"/experiments/{digits_runs['cosine']}/retrieval", params={"geometry": "manhattan"})
    assert r.status_code == 422 and "euclidean" in r.json()["detail"]
    assert client.get("/experiments/987654/retrieval").status_code == 404
    queued = client.post("/experiments", json={**SPEC, "epochs": 500}).json()["id"]
    r = client.get(f"/experiments/{queued}/retrieval")
    assert r.status_code == 409 and "needs a succeeded experiment" in r.json()["detail"]
    client.post(f"/experiments/{queued}/cancel")
    # A run stored before the training split was: a 409 that says what to do.
    other = client.post("/experiments", json={**SPEC, "loss": "center", "lam": 0.5}).json()["id"]
    assert wait_for(client, other, finished)["status"] == "succeeded"
    engine = create_engine(settings.database_url)
    with Session(engine) as session:
        session.execute(delete(LatentSpace).where(LatentSpace.experiment_id == other,
                                                  LatentSpace.split == "train"))
        session.commit()
    engine.dispose()
    r = client.get(f"/experiments/{other}/retrieval")
    assert r.status_code == 409 and "train it again" in r.json()["detail"]
