"""GET /encoders: every declared encoder, and the API's spec check agrees with it."""

from __future__ import annotations

from corel.encoder_catalog import DECLARATIONS
from corel.spec import MODALITY, MODELS


def test_get_encoders_lists_every_declaration(client):
    r = client.get("/encoders")
    assert r.status_code == 200, r.text
    listed = {(e["name"], e["modality"]): e for e in r.json()}
    assert listed.keys() == DECLARATIONS.keys()
    for key, decl in DECLARATIONS.items():
        assert listed[key]["input"] == decl.input and listed[key]["display"] == decl.display


def test_post_experiments_takes_the_listed_encoders_and_refuses_others(settings):
    """Every encoder listed for a built-in dataset's modality passes the API's spec check
    (on a queue nobody listens to); an unlisted name is a 422 naming the allowed ones."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        listed = c.get("/encoders").json()
        for dataset in ("digits", "ag-news"):
            names = [e["name"] for e in listed if e["modality"] == MODALITY[dataset]]
            assert names, dataset
            for model in names:
                r = c.post("/experiments", json={"dataset": dataset, "model": model, "epochs": 1})
                assert r.status_code == 202, r.text
                c.post(f"/experiments/{r.json()['id']}/cancel")
        r = c.post("/experiments", json={"dataset": "digits", "model": "resnet", "epochs": 1})
        assert r.status_code == 422 and all(m in r.text for m in MODELS), r.text
