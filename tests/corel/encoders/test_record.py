"""A run's record of its pretrained encoder, typed (corel.encoders.record): what each family
records reads back as recorded, from the preprocessing or a checkpoint's JSON of it, and a
record that lacks what every encoder records is refused by name."""

from __future__ import annotations

import json

import pytest

from corel.data import load_dataset
from corel.encoders import Encoder, EncoderRecord, fine_tuned, load, run_preprocessing
from corel.spec import ExperimentSpec


@pytest.mark.parametrize(("name", "modality", "mode", "family"), [
    ("minilm", "text", "frozen", ()),
    ("minilm", "text", "finetune", ("max_length",)),
    ("wordllama", "text", "frozen", ()),
    ("efficientnet-lite0", "image", "frozen", ("image_size", "mean", "std")),
])
def test_each_family_s_record_reads_back_as_it_was_recorded(name, modality, mode, family):
    pixels = {"input_shape": [1, 28, 28]} if modality == "image" else None
    pre = run_preprocessing(name, modality, mode, None, pixels)
    record = EncoderRecord.of(pre)
    assert record is not None
    assert record.to_dict() == pre["encoder"]
    assert EncoderRecord.of(json.dumps(pre)) == record  # a checkpoint's JSON of it
    assert (record.name, record.mode, record.modality) == (name, mode, modality)
    assert record.fine_tuned == (mode == "finetune") == fine_tuned(pre)
    assert record.features == pre["encoder"]["features"] > 0
    assert sorted(record.extra) == sorted(family)
    assert all(record.field(k) == pre["encoder"][k] for k in family)
    assert dict(record.pixels) == (pixels or {})
    with pytest.raises(ValueError, match="has no 'tokens'"):
        record.field("tokens")
    # No path recorded (a run made before the choice existed): fp32, named by its digest.
    assert (record.precision, record.cache_name) == ("fp32", pre["encoder"]["digest"])
    enc = load(pre)
    assert isinstance(enc, Encoder) and enc.record == record and enc.path.exists()
    assert load(enc) is enc  # loaded once, handed on as it is


def test_a_chosen_path_names_the_features_and_a_run_without_an_encoder_has_no_record():
    pre = run_preprocessing("minilm", "text")
    chosen = {**pre, "encoder": {**pre["encoder"], "features_path": {"precision": "int8", "asked": "auto"}}}
    record = EncoderRecord.of(chosen)
    assert record is not None and record.precision == "int8"
    assert record.cache_name == f"{pre['encoder']['digest']}:int8"
    assert record.to_dict() == chosen["encoder"]
    digits = load_dataset(ExperimentSpec(dataset="digits"), None)
    assert EncoderRecord.of(digits.preprocessing) is None and EncoderRecord.of("") is None
    assert not fine_tuned(digits.preprocessing)
    with pytest.raises(ValueError, match="trained on no pretrained encoder"):
        load(digits.preprocessing)


def test_a_record_without_its_name_or_digest_is_refused_by_name():
    with pytest.raises(ValueError, match="lacks digest"):
        EncoderRecord.of({"modality": "text", "encoder": {"name": "minilm", "mode": "frozen"}})
    with pytest.raises(ValueError, match="lacks name, digest"):
        EncoderRecord.of({"encoder": {"mode": "frozen", "features": 384}})
