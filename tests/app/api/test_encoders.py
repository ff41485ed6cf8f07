"""GET /encoders: every declared encoder, and the API's spec check agrees with it.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_encoders.py."""

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
        assert listed[key]["available"] is True and listed[key]["modes"] == list(decl.modes)
    assert listed[("minilm", "text")]["features"] == 384


def test_post_experiments_takes_the_listed_encoders_and_refuses_others(settings):
    """Every encoder listed for a built-in dataset's modality passes the API's spec check
    (on a queue nobody listens to); an unlisted name is a 422 naming the allowed ones."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    idle = settings.model_copy(update={"queue": "corel-nobody-listens"})
    with TestClient(create_app(idle)) as c:
        listed = c.get("/encoders").json()
        for dataset in ("digits", "ag-news"):
            # A user's own (custom) needs its upload's encoder_id: tests/app/api/test_own_encoders.py.
            mine = [e for e in listed if e["modality"] == MODALITY[dataset] and not e["custom"]]
            assert mine, dataset
            for e in mine:  # the paper's as the model, a pretrained one as the encoder
                field = "encoder" if e["pretrained"] else "model"
                r = c.post("/experiments", json={"dataset": dataset, field: e["name"], "epochs": 1})
                assert r.status_code == 202, r.text
                c.post(f"/experiments/{r.json()['id']}/cancel")
        r = c.post("/experiments", json={"dataset": "digits", "encoder": "minilm", "epochs": 1})
        assert r.status_code == 422 and "reads text inputs" in r.text, r.text
        r = c.post("/experiments", json={"dataset": "digits", "model": "resnet", "epochs": 1})
        assert r.status_code == 422 and all(m in r.text for m in MODELS), r.text
