"""Models with names (issue 72): versions of the model's contract, served by name, and the
model's own access. On the session's digits runs (a Cosine- and a Gaussian-COREL run of the
same contract) and a run on three-class blobs (another contract)."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
from sqlalchemy import event, select

from app.core.db import make_engine, make_sessionmaker, session_scope
from app.core.models import AuditEntry, RegisteredModel
from harness.wait import wait_until
from tests.app.api.test_datasets import blobs
from tests.app.conftest import AS_USER, DIGITS_SPEC, finished, held, new_user, npz_bytes, wait_for

DIGITS = [str(d) for d in range(10)]


def _name(prefix: str = "digits") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _model(client, *runs: int, **body) -> str:
    name = _name()
    r = client.post("/models", json={"name": name, **body})
    assert r.status_code == 201, r.text
    for run in runs:
        assert client.post(f"/models/{name}/versions", json={"experiment_id": run}).status_code == 201
    return name


def _another_user(settings, role: str) -> tuple[int, dict[str, str]]:
    """A new user (``role`` in its name) with a write token: its id and its headers."""
    user_id, token = new_user(settings, f"{role}-{uuid.uuid4().hex[:6]}")
    return user_id, {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def blobs_run(client, worker) -> int:
    x, y = blobs()
    up = client.post("/datasets", files={"file": ("blobs.npz", npz_bytes(
        x=x, y=y, class_names=np.array(["red", "green", "blue"])))})
    assert up.status_code == 201, up.text
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": up.json()["id"], "epochs": 2,
                                          "lr": 3e-3, "loss": "cosine", "lam": 0.7})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished)
    assert body["status"] == "succeeded", body
    return int(body["id"])


def test_a_model_s_versions_are_numbered_and_served_by_name(client, digits_runs):
    cosine, gaussian = digits_runs["cosine"], digits_runs["gaussian"]
    name = _name()
    r = client.post("/models", json={"name": name, "description": "digits, two heads"})
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["versions"] == [] and created["contract"] is None
    assert (created["owner"] is not None) == AS_USER
    again = client.post("/models", json={"name": name})
    assert again.status_code == 409 and name in again.json()["detail"]
    for bad in ("News", "-news", "n" * 65, "news/1", ""):
        assert client.post("/models", json={"name": bad}).status_code == 422, bad

    first = client.post(f"/models/{name}/versions", json={"experiment_id": cosine})
    second = client.post(f"/models/{name}/versions", json={"experiment_id": gaussian})
    assert first.status_code == second.status_code == 201, (first.text, second.text)
    assert (first.json()["version"], first.json()["experiment_id"]) == (1, cosine)
    assert (second.json()["version"], second.json()["experiment_id"]) == (2, gaussian)
    got = client.get(f"/models/{name}").json()
    assert [(v["version"], v["experiment_id"]) for v in got["versions"]] == [(1, cosine), (2, gaussian)]
    assert got["contract"] == {"inputs": "images", "shape": [1, 8, 8], "class_names": DIGITS}
    assert name in [m["name"] for m in client.get("/models", params={"limit": 200}).json()["items"]]

    rows = np.random.default_rng(0).uniform(0, 16, (5, 8, 8)).tolist()
    for ref, run in ((f"{name}:1", cosine), (f"{name}:2", gaussian)):
        by_name = client.post("/embed", json={"model": ref, "arrays": rows}).json()
        by_id = client.post("/embed", json={"experiment_id": run, "arrays": rows}).json()
        assert (by_name["model"], by_name["model_version"], by_name["experiment_id"]) == (
            name, int(ref[-1]), run)
        assert by_name["embeddings"] == by_id["embeddings"]
        assert "model" not in by_id
        predicted = client.post("/predict", json={"model": ref, "arrays": rows}).json()
        direct = client.post("/predict", json={"experiment_id": run, "arrays": rows}).json()
        assert predicted["model_version"] == int(ref[-1])
        assert predicted["predictions"] == direct["predictions"]

    for ref, status, words in ((f"{name}:3", 404, "versions 1 to 2"), (name, 422, '"name:N"'),
                               (f"nope-{name}:1", 404, "does not exist"),
                               (f"{name}@production", 404, "no alias 'production'")):
        r = client.post("/embed", json={"model": ref, "arrays": rows})
        assert r.status_code == status and words in r.json()["detail"], (ref, r.text)
    both = client.post("/embed", json={"model": f"{name}:1", "experiment_id": cosine, "arrays": rows})
    assert both.status_code == 422 and "exactly one of the two" in both.text
    neither = client.post("/embed", json={"arrays": rows})
    assert neither.status_code == 422 and "experiment_id" in neither.text

    kept = client.delete(f"/experiments/{cosine}")
    assert kept.status_code == 409 and f"{name}:1" in kept.json()["detail"]
    assert client.get(f"/experiments/{cosine}").status_code == 200


def test_a_version_keeps_the_contract_and_is_servable(client, digits_runs, blobs_run):
    name = _model(client, digits_runs["cosine"])
    other = client.post(f"/models/{name}/versions", json={"experiment_id": blobs_run})
    assert other.status_code == 422, other.text
    detail = other.json()["detail"]
    assert "it takes arrays, the model images" in detail
    assert "without ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9']" in detail
    assert "with ['red', 'green', 'blue']" in detail
    # A run of blobs founds a model of its own contract.
    own = _model(client, blobs_run)
    assert client.get(f"/models/{own}").json()["contract"] == {
        "inputs": "arrays", "shape": [5], "class_names": ["red", "green", "blue"]}

    queued = client.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"]
    try:
        r = client.post(f"/models/{name}/versions", json={"experiment_id": queued})
        assert r.status_code == 409 and "can embed or predict" in r.json()["detail"], r.text
    finally:
        client.post(f"/experiments/{queued}/cancel")
    assert client.post(f"/models/{name}/versions", json={"experiment_id": 2_000_000_000}).status_code == 404
    assert [v["version"] for v in client.get(f"/models/{name}").json()["versions"]] == [1]


@pytest.mark.skipif(not AS_USER, reason="the open mode has no users to share with")
def test_a_read_share_serves_by_name_and_adds_no_version(client, settings, digits_runs):
    reader_id, as_reader = _another_user(settings, "reader")
    name = _model(client, digits_runs["cosine"])
    rows = [[[8.0] * 8] * 8]

    # Not shared: as if there were no such model.
    assert client.get(f"/models/{name}", headers=as_reader).status_code == 404
    r = client.post("/embed", json={"model": f"{name}:1", "arrays": rows}, headers=as_reader)
    assert r.status_code == 404 and f"model {name!r} does not exist" in r.json()["detail"]
    assert name not in [m["name"] for m in client.get("/models", headers=as_reader).json()["items"]]

    shared = client.post(f"/models/{name}/shares", json={"user_id": reader_id, "access": "read"})
    assert shared.status_code == 200, shared.text
    assert [s["user_id"] for s in client.get(f"/models/{name}/shares").json()["shares"]] == [reader_id]
    assert client.get(f"/models/{name}", headers=as_reader).status_code == 200
    # The run itself is not shared with the reader: the model's share is what serves.
    assert client.get(f"/experiments/{digits_runs['cosine']}", headers=as_reader).status_code == 404
    served = client.post("/embed", json={"model": f"{name}:1", "arrays": rows}, headers=as_reader)
    assert served.status_code == 200 and served.json()["model_version"] == 1
    refused = client.post(f"/models/{name}/versions", json={"experiment_id": digits_runs["gaussian"]},
                          headers=as_reader)
    assert refused.status_code == 403 and "reading only" in refused.json()["detail"], refused.text
    assert client.post(f"/models/{name}/shares", json={"user_id": reader_id, "access": "write"},
                       headers=as_reader).status_code == 403
    engine = make_engine(settings.db_url)
    with session_scope(make_sessionmaker(engine)) as session:
        model_id = session.scalar(select(RegisteredModel.id).where(RegisteredModel.name == name))
        logged = session.execute(select(AuditEntry.user_id, AuditEntry.outcome, AuditEntry.status,
                                        AuditEntry.resource_id, AuditEntry.detail).where(
            AuditEntry.action == "POST /models/{name}/versions")).all()
    engine.dispose()
    assert any(user == reader_id and outcome == "refused" and status == 403 and repr(name) in detail
               for user, outcome, status, _, detail in logged)
    assert any(outcome == "ok" and status == 201 and resource == model_id
               for _, outcome, status, resource, _ in logged)


def test_the_client_adds_versions_and_serves_by_name(live_url, client, digits_runs):
    from corel.client import Client, CorelError

    token = client.headers.get("authorization", "").removeprefix("Bearer ") or None
    api = Client(live_url, token)
    model = api.create_model(_name(), "from the client")
    assert model.add_version(digits_runs["cosine"]) == 1
    assert model.add_version(api.experiment(digits_runs["gaussian"])) == 2
    assert model.versions == {1: digits_runs["cosine"], 2: digits_runs["gaussian"]}
    rows = np.random.default_rng(1).uniform(0, 16, (3, 8, 8))
    got = model.embed(arrays=rows, version=2)
    assert got.model_version == 2
    np.testing.assert_array_equal(got.h, api.experiment(digits_runs["gaussian"]).embed(arrays=rows).h)
    assert model.predict(arrays=rows, version=1).classes == api.experiment(
        digits_runs["cosine"]).predict(arrays=rows).classes
    with pytest.raises(CorelError) as missing:
        model.embed(arrays=rows, version=9)
    assert missing.value.status == 404
    promoted = model.promote(2, alias="production").wait(timeout=120)
    assert promoted.status == "succeeded" and promoted.report["passed"]
    assert model.aliases == {"production": 2}
    assert model.embed(arrays=rows, alias="production").model_version == 2
    assert [(m["from_version"], m["to_version"]) for m in model.history("production")] == [(None, 2)]
    with pytest.raises(CorelError) as moved:  # it expects the alias where it was read: at 2 now
        model.promote(2, alias="production")
    assert moved.value.status == 422


# --- aliases: moved only through a promotion (gated on the worker, flipped by compare and swap) ---

ENDED = ("succeeded", "refused", "conflict", "failed")


@pytest.fixture(scope="module")
def worse_run(client, worker) -> int:
    """A digits run on 30 training rows for two epochs: it learns, and is clearly worse."""
    r = client.post("/experiments", json={**DIGITS_SPEC, "loss": "cosine", "lam": 0.8, "epochs": 2, "train_subset": 30})
    assert r.status_code == 202, r.text
    body = wait_for(client, r.json()["id"], finished)
    assert body["status"] == "succeeded", body.get("error")
    return int(body["id"])


def _submit(client, name, alias, headers=None, **body):
    return client.post(f"/models/{name}/aliases/{alias}", json=body, headers=headers or {})


def _ended(client, name, promotion_id) -> dict:
    return wait_until(lambda: (lambda b: b if b["status"] in ENDED else None)(
        client.get(f"/models/{name}/promotions/{promotion_id}").json()), 120, f"promotion {promotion_id}")


def _promote(client, name, alias, **body) -> dict:
    r = _submit(client, name, alias, **body)
    assert r.status_code == 202, r.text
    assert r.json()["status"] == "queued"
    return _ended(client, name, r.json()["promotion_id"])


def test_an_alias_moves_only_through_the_gate(client, workers, digits_runs, worse_run):
    cosine, gaussian = digits_runs["cosine"], digits_runs["gaussian"]
    name = _model(client, cosine, gaussian, worse_run)  # versions 1, 2, 3
    first = _promote(client, name, "production", version=1, expected_version=None)
    assert first["status"] == "succeeded" and first["report"]["passed"], first
    assert first["report"]["incumbent"] is None  # a first alias has none, and passes
    assert client.get(f"/models/{name}").json()["aliases"] == {"production": 1}
    served = client.post("/embed", json={"model": f"{name}@production", "arrays": [[[8.0] * 8] * 8]}).json()
    assert (served["model_version"], served["experiment_id"]) == (1, cosine)

    refused = _promote(client, name, "production", version=3, expected_version=1, margin=0.05)
    report = refused["report"]
    assert refused["status"] == "refused" and not report["passed"], refused
    assert report["reason"].startswith("worse: the candidate's accuracy")
    accuracy = report["figures"]["accuracy"]
    assert accuracy["candidate"] < accuracy["incumbent"] - 0.3 and accuracy["interval"][1] < -0.05
    assert report["rows"] > 100 and len(report["class_recall"]) == 10
    assert (report["candidate_experiment"], report["incumbent_experiment"]) == (worse_run, cosine)
    assert client.get(f"/models/{name}").json()["aliases"] == {"production": 1}

    for body, status, words in (({"version": 2, "expected_version": 3}, 409, "not the expected_version 3"),
                                ({"version": 1, "expected_version": 1}, 422, "already names version 1"),
                                ({"version": 9, "expected_version": 1}, 404, "no version 9")):
        r = _submit(client, name, "production", **body)
        assert r.status_code == status and words in r.json()["detail"], r.text
    assert _submit(client, name, "Prod!", version=1, expected_version=None).status_code == 422
    assert _submit(client, f"no-{name}", "production", version=1, expected_version=None).status_code == 404

    # Two promotions from the same state, the worker held: the flip of one, then a conflict.
    with held(workers):
        ids = [_submit(client, name, "production", version=v, expected_version=1, force=True).json()["promotion_id"]
               for v in (2, 3)]
    ended = {p: _ended(client, name, p) for p in ids}
    assert sorted(e["status"] for e in ended.values()) == ["conflict", "succeeded"], ended
    won = next(e for e in ended.values() if e["status"] == "succeeded")
    lost = next(e for e in ended.values() if e["status"] == "conflict")
    assert "moved meanwhile" in lost["report"]["conflict"]
    assert client.get(f"/models/{name}").json()["aliases"] == {"production": won["version"]}
    again = client.post("/embed", json={"model": f"{name}@production", "arrays": [[[8.0] * 8] * 8]}).json()
    assert again["model_version"] == won["version"]

    history = client.get(f"/models/{name}/aliases/production/history").json()
    assert [(m["from_version"], m["to_version"]) for m in history] == [(None, 1), (1, won["version"])]
    assert [m["promotion_id"] for m in history] == [first["promotion_id"], won["promotion_id"]]
    assert history[1]["gate"]["forced"] and not history[0]["gate"]["forced"]
    assert client.get(f"/models/{name}/aliases/staging/history").status_code == 404


@pytest.mark.skipif(not AS_USER, reason="the open mode has no users to share with")
def test_a_protected_alias_and_force_are_the_owner_s(client, settings, digits_runs):
    writer_id, as_writer = _another_user(settings, "writer")
    name = _model(client, digits_runs["cosine"], digits_runs["gaussian"])
    assert client.post(f"/models/{name}/shares", json={"user_id": writer_id, "access": "write"}).status_code == 200
    staged = _promote(client, name, "staging", version=1, expected_version=None, protected=True)
    assert staged["status"] == "succeeded"
    assert client.get(f"/models/{name}").json()["protected_aliases"] == ["staging"]

    moved = _submit(client, name, "staging", as_writer, version=2, expected_version=1)
    assert moved.status_code == 403 and "protected" in moved.json()["detail"], moved.text
    forced = _submit(client, name, "canary", as_writer, version=2, expected_version=None, force=True)
    assert forced.status_code == 403 and "force" in forced.json()["detail"]
    marked = _submit(client, name, "canary", as_writer, version=2, expected_version=None, protected=True)
    assert marked.status_code == 403
    canary = _submit(client, name, "canary", as_writer, version=2, expected_version=None)
    assert canary.status_code == 202, canary.text
    assert _ended(client, name, canary.json()["promotion_id"])["status"] == "succeeded"
    assert client.get(f"/models/{name}").json()["aliases"] == {"canary": 2, "staging": 1}
    history = client.get(f"/models/{name}/aliases/canary/history").json()
    assert history[0]["user_id"] == writer_id


def test_the_cli_versions_and_promotes(live_url, client, digits_runs, worse_run, capsys):
    from corel.cli import main

    name = _name()
    url = ["--url", live_url]
    assert main(["models", "create", name, *url, "--description", "from the CLI"]) == 0
    assert main(["models", "version", name, *url, "--experiment", str(digits_runs["cosine"])]) == 0
    assert main(["models", "version", name, *url, "--experiment", str(worse_run)]) == 0
    assert main(["models", "promote", name, *url, "--version", "1"]) == 0
    assert main(["models", "promote", name, *url, "--version", "2", "--margin", "0.05"]) == 1
    out = capsys.readouterr().out
    assert f"{name}:2 = experiment {worse_run}" in out
    assert f"{name}@production -> version 1: succeeded" in out
    assert f"{name}@production -> version 2: refused (worse: " in out
    assert "  accuracy: candidate " in out
    assert main(["models", "show", name, *url]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert shown[2].split() == ["1", str(digits_runs["cosine"]), "production"]
    assert shown[3].split() == ["2", str(worse_run)]


def test_the_gate_evaluates_on_the_model_s_evaluation_dataset(client, digits_runs, worse_run):
    """With an evaluation upload (PATCH /models/{name}), both versions embed its rows and the
    gate compares them there: the report's figures are each run's own predictions on them."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.images[1000:1300].astype(np.float32), digits.target[1000:1300]
    up = client.post("/datasets", files={"file": ("eval.npz", npz_bytes(x=x, y=y))})
    assert up.status_code == 201, up.text
    dataset = up.json()["id"]
    name = _model(client, digits_runs["cosine"], worse_run)
    for body, status in (({"eval_dataset_id": 2_000_000}, 404), ({"eval_dataset_id": str(dataset)}, 422),
                         ({"evaluation": dataset}, 422)):
        r = client.patch(f"/models/{name}", json=body)
        assert r.status_code == status, (body, r.text)
    assert client.patch(f"/models/no-{name}", json={"eval_dataset_id": dataset}).status_code == 404
    r = client.patch(f"/models/{name}", json={"eval_dataset_id": dataset, "description": "evaluated on 300 rows"})
    assert r.status_code == 200, r.text
    assert (r.json()["eval_dataset_id"], r.json()["description"]) == (dataset, "evaluated on 300 rows")
    assert client.get(f"/models/{name}").json()["eval_dataset_id"] == dataset

    assert _promote(client, name, "production", version=1, expected_version=None)["status"] == "succeeded"
    refused = _promote(client, name, "production", version=2, expected_version=1, margin=0.05)
    report = refused["report"]
    assert refused["status"] == "refused" and report["reason"].startswith("worse"), refused
    assert report["evaluated_on"] == {"dataset_id": dataset} and report["rows"] == len(y)

    def accuracy(run):
        got = client.post("/predict", json={"experiment_id": run, "arrays": x.tolist()})
        assert got.status_code == 200, got.text
        return float(np.mean(np.asarray([p["class_index"] for p in got.json()["predictions"]]) == y))

    # The gate's rows were embedded in the embedding job's batches, /predict's in one: float32
    # rounding may differ with the batch's shape on another CPU, enough to flip a near tie
    # (one row of 300), never more.
    figures = report["figures"]["accuracy"]
    assert figures["candidate"] == pytest.approx(accuracy(worse_run), abs=1 / len(y) + 1e-9)
    assert figures["incumbent"] == pytest.approx(accuracy(digits_runs["cosine"]), abs=1 / len(y) + 1e-9)
    # Cleared, the gate goes back to the test split the versions share.
    assert client.patch(f"/models/{name}", json={"eval_dataset_id": None}).json()["eval_dataset_id"] is None
    again = _promote(client, name, "production", version=2, expected_version=1, margin=0.05)
    assert again["report"]["evaluated_on"] == {"dataset_id": None, "split": "test"}
    assert again["report"]["rows"] != len(y)


# --- collections: embedded and indexed by each aliased version, searched by alias ---

def test_a_collection_is_searched_by_alias_and_flips_with_it(client, digits_runs):
    from sklearn.datasets import load_digits

    cosine, gaussian = digits_runs["cosine"], digits_runs["gaussian"]
    digits = load_digits()
    up = client.post("/datasets", files={"file": ("collection.npz", npz_bytes(
        x=digits.images[:200].astype(np.float32), y=digits.target[:200]))})
    assert up.status_code == 201, up.text
    dataset = up.json()["id"]
    name = _model(client, cosine, gaussian)
    added = client.post(f"/models/{name}/collections", json={"dataset_id": dataset})
    assert added.status_code == 202, added.text
    assert added.json()["collections"] == [{"dataset_id": dataset, "builds": []}]  # no alias yet
    assert client.post(f"/models/{name}/collections", json={"dataset_id": dataset}).status_code == 409

    state = client.app.state
    state.model_cache.invalidate(cosine)
    first = _promote(client, name, "production", version=1, expected_version=None)
    assert first["status"] == "succeeded", first["error"]
    rows = digits.data[200:203].reshape(3, 8, 8).tolist()

    def by_alias():
        r = client.post(f"/models/{name}/neighbors", json={"alias": "production", "collection": dataset,
                                                            "arrays": rows, "k": 5})
        assert r.status_code == 200, r.text
        return r.json()

    def builds():
        return {b["version"]: b for b in client.get(f"/models/{name}").json()["collections"][0]["builds"]}

    def direct(run, index_id):
        return client.post(f"/experiments/{run}/neighbors",
                           json={"arrays": rows, "k": 5, "index_id": index_id}).json()["results"]

    one = builds()[1]
    assert one["status"] == "succeeded" and one["index_id"] is not None
    # The promotion had the API load the candidate's model and the collection's index before
    # its flip (app.jobs.events.publish_warm): no request has served or searched them yet.
    wait_until(lambda: state.model_cache.peek(cosine) is not None
               and state.references.peek(("index", one["index_id"])) is not None, 30,
               "the candidate's model and index loaded in the API before a request")
    # The index is read with the alias, in one statement, and not looked up again (a
    # second round trip cost a request under load about a third of its time).
    seen: list[str] = []

    def statement(_conn, _cursor, sql, *_args) -> None:
        if not threading.current_thread().name.startswith("corel-"):  # not the service's own
            seen.append(sql)

    event.listen(state.engine, "before_cursor_execute", statement)
    try:
        got = by_alias()
    finally:
        event.remove(state.engine, "before_cursor_execute", statement)
    assert (got["model_version"], got["experiment_id"], got["index_id"]) == (1, cosine, one["index_id"])
    assert any("model_aliases" in sql for sql in seen), seen
    assert not any("neighbor_indexes" in sql for sql in seen), seen
    # The model read once by its name: the access check takes the row already read.
    assert sum("FROM models " in sql for sql in seen) == 1, seen
    assert got["n_reference"] == 200 and got["results"] == direct(cosine, one["index_id"])

    # Searches by alias from twenty clients (the number) while the alias flips: no
    # error, and each answer's version is the one whose index it searched, never a mix.
    answers: list[tuple[int, int]] = []
    errors: list[str] = []
    flipping = threading.Event()

    def searching():
        while not flipping.is_set():
            try:
                got = by_alias()
            except Exception as exc:  # an error answer (by_alias asserts a 200) or a broken request
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                return
            answers.append((got["model_version"], got["index_id"]))

    clients = [threading.Thread(target=searching) for _ in range(20)]
    for t in clients:
        t.start()
    try:
        second = _promote(client, name, "production", version=2, expected_version=1, force=True)
        wait_until(lambda: answers and answers[-1][0] == 2, 60, "an answer of version 2")
    finally:
        flipping.set()
        for t in clients:
            t.join(60)
    assert second["status"] == "succeeded", second
    assert errors == [], errors
    two = builds()[2]
    assert set(answers) == {(1, one["index_id"]), (2, two["index_id"])}, set(answers)
    got = by_alias()
    assert (got["model_version"], got["experiment_id"], got["index_id"]) == (2, gaussian, two["index_id"])
    assert got["results"] == direct(gaussian, two["index_id"])
    assert two["index_id"] != one["index_id"]

    # The runs' own /neighbors search their training splits as before: a collection's index
    # is the model's, searched by alias, never a run's default.
    own = client.post(f"/experiments/{cosine}/neighbors", json={"arrays": rows, "k": 5}).json()
    assert own["source"] == {"dataset": "digits"} and own["index_id"] != one["index_id"]
    # A rollback embeds nothing: version 1's index is still there.
    back = _promote(client, name, "production", version=1, expected_version=2, force=True)
    assert back["status"] == "succeeded"
    assert sorted(builds()) == [1, 2] and builds()[1]["index_id"] == one["index_id"]
    assert by_alias()["index_id"] == one["index_id"]

    for body, status in (({"alias": "staging", "collection": dataset}, 404),
                         ({"alias": "production", "collection": 2_000_000}, 404),
                         ({"alias": "production"}, 422)):
        r = client.post(f"/models/{name}/neighbors", json={**body, "arrays": rows})
        assert r.status_code == status, (body, r.text)


def test_a_flip_collects_the_builds_of_versions_no_alias_may_roll_back_to(client, digits_runs, worse_run):
    """COREL_MODEL_KEEP_VERSIONS (2): per alias, the version it names and the one before keep
    their collection builds; a flip deletes the others' embedding jobs and indexes, and a
    promotion back to a collected version builds it again."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    up = client.post("/datasets", files={"file": ("kept.npz", npz_bytes(
        x=digits.images[300:420].astype(np.float32), y=digits.target[300:420]))})
    assert up.status_code == 201, up.text
    dataset = up.json()["id"]
    name = _model(client, digits_runs["cosine"], digits_runs["gaussian"], worse_run)
    assert client.post(f"/models/{name}/collections", json={"dataset_id": dataset}).status_code == 202

    def builds():
        return {b["version"]: b for b in client.get(f"/models/{name}").json()["collections"][0]["builds"]}

    for version, expected in ((1, None), (2, 1)):
        assert _promote(client, name, "production", version=version, expected_version=expected,
                        force=True)["status"] == "succeeded"
    one = builds()[1]
    assert sorted(builds()) == [1, 2]
    assert _promote(client, name, "production", version=3, expected_version=2, force=True)["status"] == "succeeded"
    assert sorted(builds()) == [2, 3]  # version 1: neither the alias's version nor the one before
    assert client.get(f"/indexes/{one['index_id']}").status_code == 404
    assert client.get(f"/embeddings/{one['embedding_job_id']}").status_code == 404
    two = builds()[2]
    back = _promote(client, name, "production", version=2, expected_version=3, force=True)
    assert back["status"] == "succeeded" and builds()[2] == two  # the rollback embedded nothing
    assert sorted(builds()) == [2, 3]
    again = _promote(client, name, "production", version=1, expected_version=2, force=True)
    assert again["status"] == "succeeded"
    assert sorted(builds()) == [1, 2] and builds()[1]["index_id"] not in (None, one["index_id"])
    got = client.post(f"/models/{name}/neighbors", json={"alias": "production", "collection": dataset,
                                                        "arrays": digits.images[:2].tolist(), "k": 3})
    assert got.status_code == 200 and got.json()["model_version"] == 1, got.text
