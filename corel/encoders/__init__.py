"""Encoders F(x) = h, one module per family behind one contract.

* :mod:`corel.encoders.paper`: the paper's encoders, trained from scratch (FFNN, CNNs);
* :mod:`corel.encoders.text_transformers`: sentence-transformers text encoders;
* :mod:`corel.encoders.timm_images`: timm image networks;
* :mod:`corel.encoders.static_words`: static token embeddings (WordLlama);

each pretrained family implementing :class:`corel.encoders.contract.Family`. Beside them,
:mod:`~corel.encoders.files` finds and checks every encoder's files, :mod:`~corel.encoders.features`
keeps frozen features, :mod:`~corel.encoders.finetune` holds what fine-tuning shares.
:mod:`corel.encoder_catalog` stays the table of contents: it says which family each encoder
is of, and where its files come from.

The rest of corel asks this module, never an encoder's name or kind:
:func:`run_preprocessing` (what a new run records), :func:`load` (what a run recorded, typed
(:class:`EncoderRecord`) and resolved on this machine once: an :class:`Encoder`, which the
families take), :func:`model_inputs` (raw inputs as a
recorded model takes them), :func:`choose_features` (the CPU path a frozen run's features
are computed on: :mod:`~corel.encoders.precision`), :func:`build_encoder` (the spec's F),
:func:`export_part`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from corel.encoder_catalog import DECLARATIONS, FAMILIES, EncoderDeclaration, encoder, pretrained
from corel.encoders import files, precision
from corel.encoders.contract import ExportPart, Family
from corel.encoders.features import FeaturesProgress, features_progress
from corel.encoders.features import progress as features_heard
from corel.encoders.finetune import FineTuned
from corel.encoders.paper import FFNN
from corel.encoders.record import Encoder, EncoderRecord

__all__ = ["FAMILIES", "Encoder", "EncoderRecord", "ExportPart", "Family", "FeaturesProgress", "build_encoder",
           "choose_features", "cut_texts", "export_part", "family_of", "features_progress", "fine_tuned", "load",
           "model_inputs", "run_preprocessing", "text_tokens", "upload_summary"]

Recorded = dict[str, Any] | Encoder
"""A model's encoder as the entry points take it: its run's recorded ``preprocessing``, or
that encoder already loaded (:func:`load`; resolve once, then hand it on)."""


def family_of(decl: EncoderDeclaration) -> Family:
    """The family that implements pretrained encoder ``decl``."""
    found: Family | None = getattr(importlib.import_module(FAMILIES[decl.family]), "FAMILY", None)
    if found is None:
        raise ValueError(f"encoder {decl.name!r} is of family {decl.family!r}, which trains from scratch "
                         "(no pretrained files)")
    return found


def fine_tuned(preprocessing: Recorded) -> bool:
    """Whether a model's recorded ``preprocessing`` is a fine-tuned encoder's (its inputs are
    what comes before the encoder) rather than a frozen one's (its inputs are the features)."""
    record = preprocessing.record if isinstance(preprocessing, Encoder) else EncoderRecord.of(preprocessing)
    return record is not None and record.fine_tuned


def load(preprocessing: Recorded, path: Any = None) -> Encoder:
    """The encoder a model's ``preprocessing`` records, on this machine: its record,
    declaration, family and files (checked against the recorded digest); ValueError if the
    run has none, or its files are not here. ``path``: a user's own encoder's files on this
    machine (the library's ``encoder_path``; the service's copy of the upload); a packaged
    encoder's are found without it."""
    if isinstance(preprocessing, Encoder):
        return preprocessing
    record = EncoderRecord.of(preprocessing)
    if record is None:
        raise ValueError("this model was trained on no pretrained encoder")
    decl = pretrained(record.name, record.modality)
    return Encoder(record, decl, family_of(decl), files.recorded(decl, record.digest, path))


def run_preprocessing(name: str, modality: str, mode: str = "frozen", path: Any = None,
                      pixels: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a new run on pretrained encoder ``name`` records (its checkpoint's
    ``preprocessing``): the encoder by name and content digest, in ``mode`` (``frozen`` or
    ``finetune``). ``path``: a user's own encoder's files; ``pixels``: an image dataset's own
    preprocessing."""
    decl = pretrained(name, modality)
    fam = family_of(decl)
    where = files.resolve(decl, path)
    if decl.custom:
        fam.check_files(where)
    digest = files.digest(where)
    return fam.preprocessing(decl, name, where, digest, mode=mode, pixels=pixels)


def model_inputs(raw: Any, preprocessing: Recorded, cache_dir: Any = None, *,
                 keep: bool = False) -> Any:
    """Raw inputs (texts; pixels in [0, 1]) as a model on a pretrained encoder takes them:
    the frozen encoder's features (kept in the features cache when ``keep``), or a fine-tuned
    run's rows."""
    enc = load(preprocessing)
    if enc.record.fine_tuned:
        return enc.family.inputs(raw, enc)
    return enc.family.features(raw, enc, cache_dir, keep=keep)


def cut_texts(texts: list[str], preprocessing: Recorded) -> list[str | None]:
    """For each text, None, or what the recorded encoder leaves out of it (too long)."""
    enc = load(preprocessing)
    return enc.family.cut(texts, enc)


def text_tokens(texts: list[str], preprocessing: Recorded) -> list[int]:
    """For each text, the tokens the recorded encoder reads of it (its family's count)."""
    enc = load(preprocessing)
    return enc.family.tokens(texts, enc)


def choose_features(preprocessing: dict[str, Any], held_out: Any, labels: torch.Tensor,
                    asked: str = "auto", cache_dir: Any = None, path: Any = None) -> dict[str, Any]:
    """A frozen run's ``preprocessing`` with the CPU path its features are computed on
    (``encoder.features_path``: corel.encoders.precision chooses it, on ``held_out`` raw rows
    of the run's own data and their ``labels``); a fine-tuned run's unchanged. ``path``: as
    :func:`load` takes it."""
    if fine_tuned(preprocessing):
        return preprocessing
    enc = load(preprocessing, path)
    heard = features_heard()
    if heard is not None:  # (name, 0, 0): the encoder loads, and its path is chosen
        heard(enc.name, 0, 0)
    record = precision.choose(enc.record.digest, enc.family.paths(), asked, held_out, labels,
                              lambda p, rows: enc.family.compute(p, rows, enc), cache_dir)
    return {**preprocessing, "encoder": {**preprocessing["encoder"], "features_path": record}}


def build_encoder(spec: Any, input_shape: tuple[int, ...], preprocessing: dict[str, Any] | None = None
                  ) -> nn.Module:
    """The spec's encoder for its modality, as its declaration says to build it. Over a
    frozen pretrained encoder: the paper's FFNN over its features; fine-tuned: the family's
    tower, then the FFNN (``preprocessing``: the run's, else made again from the spec)."""
    if spec.encoder and spec.fine_tunes:
        pre = preprocessing or run_preprocessing(spec.encoder, spec.modality, "finetune", spec.encoder_path,
                                                 {"input_shape": list(input_shape)})
        enc = load(pre, spec.encoder_path)
        tower = enc.family.tower(enc, spec.trainable_blocks)
        return FineTuned(tower, FFNN((enc.record.features,), spec.hidden))
    decl = pretrained(spec.encoder, spec.modality) if spec.encoder else encoder(spec.model, spec.modality)
    module_name, _, class_name = decl.builder.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    built: nn.Module = cls(input_shape, spec.hidden, **dict(decl.builder_args))
    return built


def export_part(preprocessing: Recorded, fmt: str, tuned: nn.Module | None = None) -> ExportPart:
    """The recorded encoder as an export holds it (its family's :meth:`Family.export_part`)."""
    enc = load(preprocessing)
    return enc.family.export_part(enc, fmt, tuned)


def upload_summary(kind: str, path: Path, architecture: str | None = None) -> dict[str, Any]:
    """A user's upload of family ``kind`` checked by its family; ValueError says what is wrong."""
    decl = next((d for d in DECLARATIONS.values() if d.custom and d.family == kind), None)
    if decl is None:
        raise ValueError(f"unknown kind {kind!r}; allowed: "
                         f"{', '.join(d.family for d in DECLARATIONS.values() if d.custom)}")
    return family_of(decl).check_upload(path, architecture)
