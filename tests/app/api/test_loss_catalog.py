"""The service reads each loss from corel.loss_catalog: the sweep grid's schema and its
parameters, the report tables' and the figures' names, the serving similarity, and the
dashboard's names (carried by every page)."""

from __future__ import annotations

import json
import re

from app.core.schemas.sweeps import grid_items
from app.services import sweeps
from app.services.figures import _loss_label
from app.web import losses_for_pages
from corel.loss_catalog import DECLARATIONS, LOSS_NAMES


def test_the_service_tables_come_from_the_declarations():
    assert grid_items()["loss"]["enum"] == list(LOSS_NAMES)
    assert set(sweeps.loss_params()) == {p for d in DECLARATIONS.values() for p in d.grid_params}
    assert _loss_label({"loss": "cce", "lam": 0.5}) == "CCE"
    assert _loss_label({"loss": "gaussian", "lam": 0.85}) == "Gaussian-COREL, λ = 0.85"


def test_every_page_carries_the_declared_losses(client):
    page = client.get("/").text
    carried = json.loads(re.search(r"window\.COREL_LOSSES = (.*?);</script>", page).group(1))
    assert carried == losses_for_pages()
    assert set(carried) == set(LOSS_NAMES)  # (tojson sorts the keys)
    assert carried["cce"]["lam"] is False and carried["center"]["short"] == "Center"
    for name, d in DECLARATIONS.items():  # the experiments list's loss filter
        assert f'<option value="{name}">{d.short}</option>' in page
