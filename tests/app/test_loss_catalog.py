"""The service reads each loss from corel.loss_catalog: the sweep grid's schema and its
parameters, the report tables' and the figures' names, the serving similarity, and the
dashboard's names (carried by every page)."""

from __future__ import annotations

import json
import re

from app.schemas import GRID_ITEMS
from app.services import sweep_render, sweeps
from app.services.figures import _loss_label
from app.web import LOSSES_FOR_PAGES
from corel.loss_catalog import DECLARATIONS, LOSS_NAMES
from corel.serving import SIMILARITY_OF_LOSS


def test_the_service_tables_come_from_the_declarations():
    assert GRID_ITEMS["loss"]["enum"] == list(LOSS_NAMES)
    assert {n: d.grid_params for n, d in DECLARATIONS.items()} == sweeps.PARAMS_OF_LOSS
    assert set(sweeps.LOSS_PARAMS) == {p for d in DECLARATIONS.values() for p in d.grid_params}
    assert {n: d.short for n, d in DECLARATIONS.items()} == sweep_render.LOSS_NAMES
    assert {n: d.similarity for n, d in DECLARATIONS.items()} == SIMILARITY_OF_LOSS
    assert _loss_label({"loss": "cce", "lam": 0.5}) == "CCE"
    assert _loss_label({"loss": "gaussian", "lam": 0.85}) == "Gaussian-COREL, λ = 0.85"


def test_every_page_carries_the_declared_losses(client):
    page = client.get("/").text
    carried = json.loads(re.search(r"window\.COREL_LOSSES = (.*?);</script>", page).group(1))
    assert carried == LOSSES_FOR_PAGES
    assert [name for name in carried] == list(LOSS_NAMES)
    assert carried["cce"]["lam"] is False and carried["center"]["short"] == "Center"
    for name, d in DECLARATIONS.items():  # the experiments list's loss filter
        assert f'<option value="{name}">{d.short}</option>' in page
