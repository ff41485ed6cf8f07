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

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.access.users import create_token, create_user
from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.settings import Settings
from app.main import create_app
from tests.app.conftest import Workers, own_database, serving
from tests.conftest import require

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


@pytest.fixture(scope="module")
def service(settings: Settings, tmp_path_factory: pytest.TempPathFactory,
            workers: Workers) -> Iterator[tuple[str, str]]:
    """A live service on a database of its own with a user and a write token, and a worker."""
    with own_database(settings, tmp_path_factory.mktemp("generated-var")) as s:
        engine = make_engine(s.db_url)
        with session_scope(make_sessionmaker(engine)) as session:
            user = create_user(session, "ada", admin=False)
            _, token = create_token(session, user.id, "write")
        engine.dispose()
        proc = workers.start(s)
        try:
            with serving(create_app(s)) as url:
                yield url, token
        finally:
            proc.terminate()
            proc.wait(30)


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


@pytest.mark.serial  # a service, a worker and a code generator of its own: alone, not beside the others
def test_a_generated_client_imports_whole_and_runs_the_quick_start(service, tmp_path):
    url, token = service
    generator = shutil.which("openapi-python-client", path=str(Path(sys.executable).parent))
    require(generator is not None, "openapi-python-client (pip install '.[test]')")
    config = tmp_path / "generator.yaml"
    config.write_text("package_name_override: corel_api\npost_hooks: []\n")
    done = subprocess.run([str(generator), "generate", "--url", f"{url}/openapi.json", "--meta", "none",
                           "--output-path", str(tmp_path / "corel_api"), "--config", str(config)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Error" not in done.stdout, done.stdout
    every = textwrap.dedent('''
        import importlib, pkgutil, corel_api
        failed = []
        names = [m.name for m in pkgutil.walk_packages(corel_api.__path__, "corel_api.")]
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as exc:
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
        assert not failed, failed
        print(len(names), "modules")
    ''')
    imported = subprocess.run([sys.executable, "-c", every], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    assert int(imported.stdout.split()[0]) > 100
    ran = subprocess.run([sys.executable, "-c", QUICK_START, url, token], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "quick start through the generated client: ok" in ran.stdout
