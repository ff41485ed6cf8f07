"""Runs on a frozen pretrained encoder, served end to end by a real worker and the API: /embed's
two layers (the head's h, and the encoder's own output, which equals sentence-transformers' own
encode); the whole model exported (ONNX and TorchScript: for texts from the shipped tokenizer's
token ids, for images from the pixels) and run on raw sentences and images against /embed and
/predict; a batch embedding job over raw texts against /embed.

This file holds those of its tests that belong in the API tier (a TestClient, no worker); the
others, and the helpers they share, are in tests/app/stack/test_frozen_serving.py."""

from __future__ import annotations


def test_embed_documents_its_layers(client):
    doc = client.get("/openapi.json").json()
    json_body = doc["paths"]["/embed"]["post"]["requestBody"]["content"]
    form = doc["paths"]["/embed/files"]["post"]["requestBody"]["content"]
    assert list(json_body) == ["application/json"] and list(form) == ["multipart/form-data"]
    kinds = [ref["$ref"].rsplit("/", 1)[1] for ref in json_body["application/json"]["schema"]["oneOf"]]
    assert kinds == ["EmbedImages", "EmbedTexts", "EmbedArrays", "EmbedRows", "EmbedBinary"]
    layers = [doc["components"]["schemas"][k]["properties"]["layer"] for k in kinds]
    for layer in [*layers, form["multipart/form-data"]["schema"]["properties"]["layer"]]:
        assert layer["enum"] == ["head", "encoder"] and layer["default"] == "head", layer
        assert "pretrained encoder" in layer["description"]
