"""Each encoder declared once (corel.encoder_catalog): the spec's allowed models, the model
builder and GET /encoders read the declarations."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from corel.encoder_catalog import DECLARATIONS, MODALITIES, encoder, models_for
from corel.encoders import build_encoder
from corel.spec import DATASETS, MODALITY, MODELS, ExperimentSpec

# A prepared input of each declared kind (the data loaders' shapes).
SHAPES = {"pixels": (1, 28, 28), "word-vector-mean": (50,), "word-vector-sequence": (40, 50),
          "vectors": (12,)}
DATASET_OF = {"image": "digits", "text": "ag-news", "vector": "npz"}


@pytest.mark.parametrize("key", list(DECLARATIONS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_every_declared_encoder_builds_and_gives_its_width(key):
    decl = DECLARATIONS[key]
    # A pretrained encoder is the spec's encoder, and the model trains over its features.
    # A user's own (custom) names its files; its width is its model's own (here 48).
    name = ({"encoder": "timm:resnet18" if decl.name == "timm" else decl.name} if decl.pretrained
            else {"model": decl.name})
    spec = ExperimentSpec(dataset=DATASET_OF[decl.modality], hidden=64, **name,
                          encoder_path="own" if decl.custom else None,
                          dataset_path="x.npz" if decl.modality == "vector" else None)
    shape = ((decl.features or 48,) if decl.pretrained else SHAPES[decl.input])
    model = build_encoder(spec, shape)
    model.eval()
    h = model(torch.randn(5, *shape))
    assert h.shape == (5, decl.output_width(64))
    dropouts = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert set(dropouts) == ({decl.dropout} if decl.dropout else set()), dropouts


def test_a_spec_takes_exactly_the_declared_encoders_of_its_dataset_s_modality():
    for dataset in DATASETS:
        path = "x.npz" if dataset in ("npz", "text", "images") else None
        for model in MODELS:
            declared = (model, MODALITY[dataset]) in DECLARATIONS
            try:
                ExperimentSpec(dataset=dataset, model=model, dataset_path=path)
            except ValidationError as exc:
                assert not declared, (dataset, model, exc)
                allowed = ", ".join(models_for(MODALITY[dataset]))
                assert f"does not apply to dataset {dataset!r}" in str(exc) and f"allowed: {allowed}" in str(exc)
            else:
                assert declared, (dataset, model)


def test_an_undeclared_encoder_is_refused_naming_the_allowed_ones():
    assert set(MODALITIES) == {d.modality for d in DECLARATIONS.values()}
    with pytest.raises(ValueError, match=r"model 'cnn' does not apply to vector inputs; allowed: ffnn"):
        encoder("cnn", "vector")


def test_text_inputs_follow_the_encoder_s_declared_input():
    from corel.data.text import _text_preprocessing

    class Vectors:
        dim = 50

        def describe(self) -> dict:
            return {}

    for name in models_for("text"):
        prep = _text_preprocessing(Vectors(), name, 40)  # type: ignore[arg-type]
        sequence = encoder(name, "text").input == "word-vector-sequence"
        assert prep["input_shape"] == ([40, 50] if sequence else [50])
        assert prep["representation"] == ("sequence" if sequence else "mean")


@pytest.mark.parametrize("key", [k for k, d in DECLARATIONS.items() if d.pretrained],
                         ids=lambda k: f"{k[0]}-{k[1]}")
def test_every_pretrained_encoder_has_a_family_that_keeps_the_contract(key):
    """Its family (the catalog's FAMILIES) implements the contract for its modality, and a
    packaged one's files (the catalog's ``files``) are installed and are what the family reads."""
    from corel.encoders import family_of, files
    from corel.encoders.contract import Family

    decl = DECLARATIONS[key]
    family = family_of(decl)
    assert isinstance(family, Family) and family.name == decl.family and family.modality == decl.modality
    if not decl.custom:
        family.check_files(files.packaged(decl))


def test_a_family_without_pretrained_files_says_so():
    from corel.encoders import family_of

    with pytest.raises(ValueError, match="family 'paper', which trains from scratch"):
        family_of(DECLARATIONS[("ffnn", "image")])
