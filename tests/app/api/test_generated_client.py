"""A client generated from the running service's OpenAPI document works, unedited.

openapi-python-client (the version pinned in pyproject's test extra) generates a package from
``/openapi.json`` of a live service (its own database, a user with a write token, a real
worker); every module of it imports, and the quick start runs through it in a Python of
its own, with the bearer token: a quick run on digits (its stored spec says the budget's 10
epochs: the document gives the budget's fields no default for a generated model to send),
and one on AG News; wait; ``/embed`` arrays and raw texts, ``/predict``, ``/neighbors``, the
clustering report. Before, three of its modules did not import (``/embed``, ``/predict``
and ``/neighbors`` had two bodies each, and a bare oneOf typed Any), and a quick run trained
150 epochs.
"""

from __future__ import annotations

import textwrap

import pytest

QUICK_START = textwrap.dedent('''
    import sys
    import time

    import numpy as np

    from corel_api import AuthenticatedClient
    from corel_api.api.analysis import clustering_experiments_experiment_id_clustering_get as clustering
    from corel_api.api.experiments import create_experiments_post as create
    from corel_api.api.experiments import get_experiments_experiment_id_get as get
    from corel_api.api.inference import embed_embed_post as embed
    from corel_api.api.inference import neighbors_experiments_experiment_id_neighbors_post as neighbors
    from corel_api.api.inference import predict_predict_post as predict
    from corel_api.models import (ClusteringRead, EmbedArrays, EmbedRead, EmbedTexts, ExperimentCreate,
                                  ExperimentCreateBudgetType0, ExperimentCreateDataset, ExperimentQueued,
                                  ExperimentRead, NeighborsArrays, NeighborsRead, NeighborsTexts, PredictArrays,
                                  PredictRead)

    url, token = sys.argv[1], sys.argv[2]
    client = AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True,
                                 timeout=__import__("httpx").Timeout(120.0))

    def train(**fields):
        queued = create.sync(client=client, body=ExperimentCreate(budget=ExperimentCreateBudgetType0.QUICK,
                                                                  **fields))
        assert isinstance(queued, ExperimentQueued), queued
        deadline = time.monotonic() + 300
        while True:
            run = get.sync(client=client, experiment_id=queued.id)
            assert isinstance(run, ExperimentRead), run
            if run.status in ("succeeded", "failed", "cancelled"):
                break
            assert time.monotonic() < deadline, f"experiment {queued.id} still {run.status}"
            time.sleep(0.5)
        assert run.status == "succeeded", run.error
        spec = run.spec.to_dict()
        assert (spec["budget"], spec["epochs"], spec["lr"], spec["batch_size"]) == ("quick", 10, 1e-3, 64), spec
        assert run.warnings == [], run.warnings
        return run.id

    digits = train(dataset=ExperimentCreateDataset.DIGITS)
    news = train(dataset=ExperimentCreateDataset.AG_NEWS, train_subset=500)

    arrays = np.random.default_rng(0).integers(0, 17, (3, 8, 8)).tolist()
    # Typed answers: the generator made models of the document's response schemas.
    h = embed.sync(client=client, body=EmbedArrays(experiment_id=digits, arrays=arrays))
    assert isinstance(h, EmbedRead), h
    assert len(h.embeddings) == 3 and h.dim == len(h.embeddings[0]) and h.checkpoint.epoch >= 1, h
    texts = embed.sync(client=client, body=EmbedTexts(experiment_id=news, texts=["Stocks fell", "A goal"]))
    assert isinstance(texts, EmbedRead) and len(texts.embeddings) == 2, texts
    predicted = predict.sync(client=client, body=PredictArrays(experiment_id=digits, arrays=arrays))
    assert isinstance(predicted, PredictRead), predicted
    assert [len(p.similarities) for p in predicted.predictions] == [10, 10, 10], predicted
    found = neighbors.sync(client=client, experiment_id=digits, body=NeighborsArrays(arrays=arrays, k=3))
    assert isinstance(found, NeighborsRead), found
    assert [len(r.neighbors) for r in found.results] == [3, 3, 3], found
    first = found.results[0].neighbors[0]
    assert first.image_url == f"/datasets/builtin/digits/rows/{first.id}/image", first
    near = neighbors.sync(client=client, experiment_id=news, body=NeighborsTexts(texts=["Stocks fell"], k=2))
    assert all(isinstance(n.text, str) and n.text for n in near.results[0].neighbors), near
    report = clustering.sync(client=client, experiment_id=digits)
    assert isinstance(report, ClusteringRead), report
    print("quick start through the generated client: ok")
''')


def test_the_document_is_valid_openapi_3_1_to_a_second_validator(client):
    """openapi-spec-validator (independent of schemathesis, which also reads the document)."""
    import copy

    from openapi_spec_validator import validate
    from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

    doc = client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    validate(doc)
    broken = copy.deepcopy(doc)  # the validator does find what is wrong
    broken["paths"]["/embed"]["post"]["responses"]["200"] = {"content": {}}
    with pytest.raises(OpenAPIValidationError):
        validate(broken)
