"""Experiments over HTTP against PostgreSQL, Redis and real Celery worker processes."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

FASHION = {"dataset": "fashion-mnist", "model": "ffnn", "loss": "gaussian", "lam": 0.85,
           "lr": 1e-3, "train_subset": 3000}


@pytest.fixture(scope="module")
def db(settings):
    engine = create_engine(settings.db_url)
    with Session(engine) as session:
        yield session
    engine.dispose()


def test_queued_experiment_cancels_at_once_and_deletes(client, settings):
    from fastapi.testclient import TestClient

    from app.main import create_app

    # A queue no worker listens to keeps the experiment queued.
    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        eid = c.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"]
        assert c.delete(f"/experiments/{eid}").status_code == 409
        body = c.post(f"/experiments/{eid}/cancel").json()
        assert body["status"] == "cancelled" and body["finished_at"]
        r = c.post("/embed", json={"experiment_id": eid, "arrays": [[[0.0] * 8] * 8]})
        assert r.status_code == 409 and "cancelled before its first epoch ended" in r.json()["detail"]
        assert c.delete(f"/experiments/{eid}").status_code == 204
        assert c.get(f"/experiments/{eid}").status_code == 404


def test_list_filters_and_pages(client):
    ids = [client.post("/experiments", json={"dataset": "digits", "epochs": 1, "loss": loss}).json()["id"]
           for loss in ("cosine", "cosine", "cce")]
    page = client.get("/experiments", params={"loss": "cosine", "limit": 1}).json()
    assert page["total"] >= 2 and len(page["items"]) == 1 and page["limit"] == 1
    assert page["items"][0]["spec"]["loss"] == "cosine"
    everything = client.get("/experiments", params={"dataset": "digits", "limit": 200}).json()
    assert set(ids) <= {item["id"] for item in everything["items"]}
    r = client.get("/experiments", params={"status": "sleeping"})
    assert r.status_code == 422 and "'queued', 'running', 'succeeded', 'failed', 'cancelled' or 'pruned'; got 'sleeping'" in r.text
    # An empty filter means any (it was a 422, though the schema allowed it).
    assert client.get("/experiments", params={"dataset": "", "loss": "", "limit": 1}).json()["total"] >= 2
    r = client.get("/experiments", params={"loss": "sphereface"})
    assert r.status_code == 422 and "unknown loss 'sphereface'; allowed: cce, center" in r.text
    # Past the page size: a page of that size, its limit saying so (the schema allows any).
    big = client.get("/experiments", params={"limit": 100000})
    assert big.status_code == 200 and big.json()["limit"] == 200


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"dataset": "digits", "lam": 1.5}, ["lam", "less than or equal to 1"]),
        ({"dataset": "digits", "lam": 0}, ["lam", "greater than 0"]),
        ({"dataset": "digits", "loss": "npair"}, ["loss", "unknown loss 'npair'; allowed: cce, center, "
                                                  "cosine, gaussian, arcface"]),
        ({"dataset": "digits", "loss": "arcface", "margin": -1}, [
            "margin: ", "margin for loss 'arcface' must be a number in [0, 90); got -1"]),
        ({"dataset": "digits", "loss": "cosface", "scale": 0}, [
            "scale: ", "scale for loss 'cosface' must be a number in (0, 1024]; got 0"]),
        ({"dataset": "digits", "loss": "cosface", "miner": "hard"}, [
            "miner: ", "loss 'cosface' takes no miner; the losses that take one: triplet"]),
        ({"dataset": "digits", "loss": "triplet", "miner": "hardest"}, [
            "miner for loss 'triplet' must be one of none, all, hard, semihard, easy; got 'hardest'"]),
        ({"dataset": "digits", "temperature": 0.1}, [
            "loss 'gaussian' takes no temperature; the losses that take one: normsoftmax, supcon"]),
        ({"dataset": "imagenet"}, ["dataset", "'fashion-mnist'"]),
        ({"dataset": "npz", "dataset_id": 1, "model": "cnn"}, ["model 'cnn' does not apply", "allowed: ffnn"]),
        ({"dataset": "npz"}, ["needs dataset_id"]),
        ({"dataset": "digits", "dataset_path": "/etc/passwd"}, ["dataset_path is not accepted"]),
        ({"dataset": "digits", "epochs": 0}, ["epochs"]),
        ({"dataset": "digits", "colour": "red"}, ["colour", "Extra inputs are not permitted"]),
        ({"dataset": "digits", "learn_gamma": True, "loss": "cosine"}, ["learn_gamma applies only"]),
        ({}, ["dataset", "Field required"]),
    ],
)
def test_bad_specs_get_422_naming_the_problem(client, body, words):
    r = client.post("/experiments", json=body)
    assert r.status_code == 422, r.text
    for word in words:
        assert word in r.json()["detail"], r.json()


def test_unknown_dataset_id_is_404(client):
    """An id the schema allows but no upload has: 404, as for an id in a path."""
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": 987654})
    assert r.status_code == 404 and "dataset_id 987654 does not exist" in r.json()["detail"]


def test_non_json_body_is_422(client):
    r = client.post("/experiments", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422
    # It said "1: JSON decode error".
    r = client.post("/experiments", content=b'{"dataset": "digits",',
                    headers={"content-type": "application/json"})
    detail = r.json()["detail"]
    assert r.status_code == 422 and detail.startswith("the body is not valid JSON at character 21")
    assert "JSON decode error" not in detail
    # The error named the character offset as if it were a field: "body.21".
    assert [e["field"] for e in r.json()["errors"]] == ["body"]


@pytest.mark.parametrize("content", [b'{"dataset": "digits"}', b""])
def test_a_body_not_sent_as_json_is_told_to_be(client, content):
    """A text/plain body said "body: Input should be a valid dictionary or object to extract
    fields from" (or "Field required"), with no word of the content type."""
    r = client.post("/experiments", content=content, headers={"content-type": "text/plain"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "Content-Type: application/json" in detail and "text/plain" in detail, detail


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/experiments/987654"), ("get", "/experiments/987654/metrics"),
     ("post", "/experiments/987654/cancel"), ("delete", "/experiments/987654"),
     ("get", "/datasets/987654")],
)
def test_unknown_ids_are_404(client, method, path):
    r = getattr(client, method)(path)
    assert r.status_code == 404
    assert r.json() == {"error": "not_found", "detail": r.json()["detail"]}
    assert "987654" in r.json()["detail"]


def test_an_id_that_is_no_number_is_no_path_and_the_404_says_what_an_id_is(client):
    """It said "Not Found", as for a path of no route at all."""
    r = client.get("/experiments/abc")
    assert r.status_code == 404 and r.json() == {
        "error": "not_found", "detail": "experiment_id must be an integer from 1 to 2147483647 in "
        "GET /experiments/{experiment_id}; got 'abc'"}
    r = client.post("/sweeps/1.5/cancel")
    assert r.status_code == 404 and r.json()["detail"] == (
        "sweep_id must be an integer from 1 to 2147483647 in POST /sweeps/{sweep_id}/cancel; got '1.5'")
    r = client.delete("/no/such/route")
    assert r.status_code == 404 and r.json()["detail"] == (
        "there is no route DELETE /no/such/route; GET /openapi.json (or /docs) lists the API's routes")
    # A dataset's rows count from 0 (it said "row must be an integer from 1").
    r = client.get("/datasets/1/rows/-1/image")
    assert r.status_code == 404 and r.json()["detail"].startswith(
        "row must be an integer from 0 to 2147483647 in GET /datasets/{dataset_id}/rows/{row}/image"), r.text


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("delete", "/encoders", "GET, POST"), ("put", "/experiments", "GET, POST"),
    ("put", "/experiments/1", "DELETE, GET"), ("get", "/embed", "POST")])
def test_a_405_names_the_methods_the_path_takes(client, method, path, allowed):
    """It said "Method Not Allowed" alone (the Allow header listed them)."""
    r = getattr(client, method)(path)
    assert r.status_code == 405 and r.headers["allow"] == allowed, (r.headers, r.text)
    assert r.json()["detail"] == (f"{method.upper()} is not allowed on {path}; it takes {allowed} "
                                  "(the Allow header lists them too)"), r.text


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_and_infinity_are_no_value_of_any_number_field(client, value):
    """lam NaN, Infinity and 1e400 were told "should be less than or equal to 1"."""
    before = client.get("/experiments", params={"limit": 1}).json()["total"]
    for field in ("lam", "lr", "gamma"):
        r = client.post("/experiments", content=f'{{"dataset": "digits", "{field}": {value}}}',
                        headers={"content-type": "application/json"})
        detail = r.json()["detail"]
        assert r.status_code == 422 and detail.startswith(f"{field}: must be a finite number; got "), r.text
        assert "less than or equal" not in detail and "greater than" not in detail, detail
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == before


def test_a_body_that_cannot_be_read_says_why(client):
    """Latin-1 bytes and a document nested 100,000 deep got "There was an error parsing the body"."""
    r = client.post("/experiments", content='{"dataset": "caf\xe9"}'.encode("latin-1"),
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["detail"] == (
        "the body is not UTF-8: byte 0xe9 at position 16 (invalid continuation byte); send JSON "
        "encoded as UTF-8"), r.text
    r = client.post("/experiments", content=b"[" * 100_000 + b"]" * 100_000,
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nests arrays or objects deeper than the API reads" in r.json()["detail"]


@pytest.mark.parametrize("path", ["/experiments", "/sweeps", "/embed", "/predict", "/experiments/{id}/neighbors"])
def test_a_json_body_with_no_content_type_is_refused_alike_on_every_route(client, path):
    """It was "a string" to /experiments but JSON to /embed: one rule now, for every route."""
    if "{id}" in path:
        path = path.format(id=client.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"])
    before = client.get("/experiments", params={"limit": 1}).json()["total"]
    r = client.post(path, content=b'{"dataset": "digits", "experiment_id": 1, "texts": ["a"]}')
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith("the body came with no Content-Type; send it with "
                                         "Content-Type: application/json"), r.text
    assert client.get("/experiments", params={"limit": 1}).json()["total"] == before


@pytest.mark.parametrize(("path", "example"), [
    ("/experiments", '{"dataset": "digits", "budget": "quick"}'),
    ("/sweeps", '{"base": {"dataset": "digits", "budget": "quick"}, "grid": {"lam": [0.3, 0.6]}}'),
    ("/embed", '{"experiment_id": 1, "texts": ["a sentence"]}'),
    ("/predict", '{"experiment_id": 1, "texts": ["a sentence"]}'),
    ("/experiments/{id}/neighbors", '{"texts": ["a sentence"], "k": 5}'),
])
def test_a_body_that_is_no_json_object_is_shown_an_example_of_its_own_route(client, path, example):
    """Bad JSON sent to /embed was shown {"dataset": "digits"}, /experiments' example."""
    if "{id}" in path:  # one the caller may read (a stranger's path is a 404 first)
        path = path.format(id=client.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"])
    for body, what in ((b"{bad", "the body is not valid JSON"),
                       (b"[1, 2]", "the body must be a JSON object, not an array")):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert detail.startswith(what) and f"; send a JSON object such as {example}" in detail, detail
    assert ('"dataset"' in detail) == (path in ("/experiments", "/sweeps"))


def test_the_inference_routes_say_which_media_type_they_take(client):
    """A form-encoded body to /embed was told it was no valid JSON."""
    for path in ("/embed", "/embed/files"):
        r = client.post(path, data={"experiment_id": "1"})
        assert r.status_code == 422 and r.json()["detail"] == (
            "POST /embed takes a JSON object (Content-Type: application/json), multipart/form-data at "
            "POST /embed/files, or an octet-stream array; this body came as application/x-www-form-urlencoded")
    eid = client.post("/experiments", json={"dataset": "digits", "epochs": 1}).json()["id"]
    r = client.post(f"/experiments/{eid}/neighbors/files", content=b"k=3",
                    headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 422 and r.json()["detail"].startswith(
        "POST /experiments/{experiment_id}/neighbors takes a JSON object (Content-Type: application/json), "
        "multipart/form-data at POST /experiments/{experiment_id}/neighbors/files")
def test_json_types_are_taken_as_the_schema_says(client):
    """Found by schemathesis: a JSON true was taken as gamma = 1.0."""
    for field, value in (("gamma", True), ("epochs", "5"), ("epochs", 2.0), ("learn_gamma", 1)):
        r = client.post("/experiments", json={"dataset": "digits", field: value})
        assert r.status_code == 422 and field in r.json()["detail"], (field, value, r.text)


HUGE_IDS = [0, -1, 2**31, 2**63, 232258343158030708768768]


@pytest.mark.parametrize("eid", HUGE_IDS)
def test_ids_that_cannot_exist_are_404_on_every_route(client, eid):
    """Found by schemathesis: ids past PostgreSQL's integer (or SQLite's) were 500s."""
    for method, path in [
        ("GET", f"/experiments/{eid}"), ("GET", f"/experiments/{eid}/metrics"),
        ("POST", f"/experiments/{eid}/cancel"), ("DELETE", f"/experiments/{eid}"),
        ("GET", f"/experiments/{eid}/clustering"), ("GET", f"/experiments/{eid}/latent.png"),
        ("GET", f"/experiments/{eid}/curves.png"), ("GET", f"/datasets/{eid}"),
        ("GET", f"/sweeps/{eid}"), ("POST", f"/sweeps/{eid}/cancel"),
        ("GET", f"/sweeps/{eid}/report"), ("GET", f"/sweeps/{eid}/lambda.png"),
    ]:
        r = client.request(method, path)
        assert r.status_code == 404, (method, path, r.status_code, r.text)
        if eid < 0:  # not even a path of the API: the 404 says what an id is
            assert r.json()["detail"].endswith(f"must be an integer from 1 to 2147483647 in {method} "
                                               f"{path.replace(str(eid), '{' + path.split('/')[1][:-1] + '_id}', 1)}; got '{eid}'")
        else:
            assert "does not exist" in r.json()["detail"]
    r = client.get("/experiments/compare", params={"ids": f"1,{eid}"})
    assert r.status_code == 422 and f"got '{eid}'" in r.json()["detail"]  # ids are 1 to 9 digits
    # In a body the schema bounds an id (1 to 2**31 - 1): outside them a 422 that says so.
    r = client.post("/embed", json={"experiment_id": eid, "arrays": [[0.0]]})
    assert r.status_code == 422 and "experiment_id" in r.json()["detail"], r.text
    r = client.post("/experiments", json={"dataset": "npz", "dataset_id": eid})
    assert r.status_code == 422 and "dataset_id" in r.json()["detail"]


@pytest.mark.parametrize("offset", [-1, 2**31, 2**63])
def test_offsets_out_of_range_are_422(client, offset):
    for path in ("/experiments", "/datasets"):
        r = client.get(path, params={"offset": offset})
        assert r.status_code == 422, (path, r.text)
        assert "offset" in r.json()["detail"]
