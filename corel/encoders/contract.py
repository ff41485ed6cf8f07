"""The contract every pretrained encoder family implements.

A family (sentence-transformers text models, timm image networks, ...) knows how to read
its files, what a run on it records, how raw inputs become its features (frozen) or the
rows its trainable tower takes (fine-tuned), how to build that tower with the blocks it can
unfreeze, what to export, and how to check a user's upload. Everything else in corel asks
the family (:func:`corel.encoders.family_of`) and never the encoder's name or kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from corel.encoder_catalog import EncoderDeclaration
from corel.encoders.record import Encoder

__all__ = ["ONNX_OPSET", "TOKENIZER_FOLDER", "ExportPart", "Family", "texts_of"]

ONNX_OPSET = 17
"""The ONNX opset exports are written in."""

TOKENIZER_FOLDER = "tokenizer"
"""Where an export zips a text encoder's tokenizer's files."""


def texts_of(raw: Any) -> list[str]:
    """Raw inputs as a text family takes them: a list of strings; ValueError otherwise."""
    if isinstance(raw, str):
        raise ValueError("texts must be a list of strings, not one string; wrap it: [text]")
    bad = [type(t).__name__ for t in raw if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts must be strings; got {bad[0]}")
    return list(raw)


@dataclass
class ExportPart:
    """What an export holds of the encoder: ``module`` maps the exported model's raw inputs
    (named ``inputs``; ``example`` is one) to the encoder's features; ``files`` go beside the
    model (a tokenizer's), ``about`` is what the metadata says of them."""

    module: nn.Module
    example: tuple[torch.Tensor, ...]
    inputs: list[str]
    files: dict[str, bytes] | None = None
    about: dict[str, Any] = field(default_factory=dict)


class Family(ABC):
    """One kind of pretrained encoder. Stateless: the :class:`~corel.encoders.record.Encoder`
    each method is given says which encoder and files (its record, declaration and path)."""

    name: str
    """As the catalog's ``family`` names it."""
    modality: str
    """The inputs it reads: ``text`` or ``image``."""

    @abstractmethod
    def check_files(self, path: Path) -> None:
        """ValueError unless ``path`` holds this family's files (a user's own encoder's)."""

    @abstractmethod
    def preprocessing(self, decl: EncoderDeclaration, name: str, path: Path, digest: str, *, mode: str,
                      pixels: dict[str, Any] | None = None) -> dict[str, Any]:
        """What a run on encoder ``name`` (``decl``'s, or ``timm:<architecture>`` of a user's
        own) records (its checkpoint's ``preprocessing``): the
        encoder (its ``name``, ``mode``, content ``digest``, ``features``' width and what the
        family needs to prepare inputs again), the model's ``input_shape``. ``pixels``: an
        image dataset's own preprocessing, which raw images go through first."""

    @abstractmethod
    def features(self, raw: Any, enc: Encoder, cache_dir: str | Path | None = None, *,
                 keep: bool = True) -> torch.Tensor:
        """The frozen encoder's features of raw inputs (texts, or pixels in [0, 1]), (N, width)
        float32; kept in the features cache unless ``keep`` is False (a served request's)."""

    @abstractmethod
    def inputs(self, raw: Any, enc: Encoder) -> torch.Tensor:
        """Raw inputs as a fine-tuned run's model takes them (one float row each)."""

    @abstractmethod
    def tower(self, enc: Encoder, trainable_blocks: int | None) -> nn.Module:
        """The trainable encoder (its last ``trainable_blocks`` blocks trainable; None: all),
        from the rows :meth:`inputs` gives to the features."""

    @abstractmethod
    def export_part(self, enc: Encoder, fmt: str, tuned: nn.Module | None = None) -> ExportPart:
        """The encoder as an export holds it; ``tuned``: a fine-tuned run's tower, whose
        weights the exported encoder then has."""

    @abstractmethod
    def check_upload(self, path: Path, architecture: str | None = None) -> dict[str, Any]:
        """A user's upload (unpacked folder or weights file) checked by loading and running
        it: its summary (``features``, ``blocks``, ...); ValueError says what is wrong."""

    def paths(self) -> tuple[str, ...]:
        """The CPU paths its frozen features can be computed on (corel.encoders.precision):
        fp32 alone unless it says more."""
        return ("fp32",)

    def compute(self, precision: str, raw: Any, enc: Encoder) -> torch.Tensor:
        """Raw inputs' features on path ``precision``, uncached and unreported (the parity
        gate's rows)."""
        if precision != "fp32":
            raise ValueError(f"the {self.name} family computes fp32 features only")
        return self.features(raw, enc, keep=False)

    def cut(self, texts: list[str], enc: Encoder) -> list[str | None]:
        """For each text, None, or what the encoder leaves out of it (a text longer than it
        reads): a served answer's warning. None for every text unless the family cuts them."""
        return [None] * len(texts)

    def tokens(self, texts: list[str], enc: Encoder) -> list[int]:
        """For each text, the tokens the encoder reads of it (what a batch of texts costs:
        a server's token budget counts these). Words unless the family says more."""
        return [max(1, len(text.split())) for text in texts]

    def blocks(self, decl: EncoderDeclaration, path: Path) -> int | None:
        """How many blocks ``trainable_blocks`` may count (None: none such)."""
        return decl.blocks
