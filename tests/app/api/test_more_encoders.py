"""The encoders added through the family contract alone, trained by a real worker and served over
HTTP on raw inputs (/embed, /predict, /neighbors) and exported (ONNX), each held to its
reference implementation: WordLlama (static token embeddings, a family of its own) to the
wordllama package's own ``embed``; EfficientNet-Lite2 (a second member of the timm family) to
the original implementation (efficientnet-lite-pytorch) on the same input.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_more_encoders.py."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("fields", "words"), [
    ({"encoder": "wordllama", "precision": "int8"}, "does not compute int8 features"),
    ({"precision": "int8"}, "applies to a frozen pretrained encoder"),
    ({"encoder": "minilm", "precision": "fp8"}, "precision"),
])
def test_a_features_precision_that_cannot_be_computed_is_a_422(client, fields, words):
    r = client.post("/experiments", json={"dataset": "ag-news", **fields})
    assert r.status_code == 422, r.text
    assert words in r.text
