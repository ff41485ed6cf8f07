"""One serving pipeline: a trained model built from its checkpoint, and raw input to rows.

Everything that turns inputs into representations after training goes through
:class:`ServedModel`: the API's ``/embed`` and ``/predict``, the batch embedding jobs,
the exports, nearest-neighbour search and the benchmarks. It holds the model and what
serving needs to know of it (class names, the preprocessing recorded at training time,
the similarity its head scores with), and does the three steps:

* :meth:`ServedModel.prepare`: raw inputs (pixel arrays, feature vectors, texts) to the
  model's input tensor, exactly as the training data was prepared;
* :meth:`ServedModel.embed`: the encoder, h = F(x), as float32 on the CPU;
* :meth:`ServedModel.similarities`: the head's score of h against each class vector.

A run on a pretrained encoder offers two layers (:mod:`corel.layers`): the head's
representation h, the space the loss shaped, and the encoder's own output, the features
``prepare`` computes for a frozen encoder.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corel.data import prepare_images, prepare_texts, prepare_vectors, text_warnings
from corel.device import ieee_float32
from corel.encoders import Encoder, EncoderRecord, load, model_inputs, text_tokens
from corel.layers import LAYERS, Layer
from corel.loss_catalog import declaration
from corel.models import Classifier
from corel.spec import ExperimentSpec
from corel.train import checkpoint_from_bytes, model_from_checkpoint

BATCH = 4096
"""Rows per forward pass in :meth:`ServedModel.embed_all`."""


def _cpu32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 and t.device.type == "cpu" else t.float().cpu()


@dataclass(frozen=True)
class ServedModel:
    """A trained model ready to serve (eval mode, on its device)."""

    spec: ExperimentSpec
    model: Classifier
    class_names: list[str]
    preprocessing: dict[str, Any]
    input_shape: tuple[int, ...]  # of one prepared input, as the encoder takes it
    encoder_path: Path | None = None
    """A user's own encoder's files on this machine (given to :meth:`from_checkpoint`, else
    where the training machine held them, its spec's); a packaged encoder's are found
    without it. Checked against the recorded digest."""

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any], device: str | torch.device | None = None,
                        encoder_path: str | os.PathLike[str] | None = None) -> ServedModel:
        spec, model = model_from_checkpoint(checkpoint, device, encoder_path)
        return cls(spec=spec, model=model, class_names=[str(c) for c in checkpoint["class_names"]],
                   preprocessing=json.loads(checkpoint["preprocessing"]),
                   input_shape=tuple(int(s) for s in checkpoint["input_shape"]),
                   encoder_path=Path(spec.encoder_path) if spec.encoder_path is not None else None)

    @classmethod
    def from_bytes(cls, blob: bytes, device: str | torch.device | None = None,
                   encoder_path: str | os.PathLike[str] | None = None) -> ServedModel:
        """From a checkpoint as stored (``checkpoint_to_bytes``)."""
        return cls.from_checkpoint(checkpoint_from_bytes(blob), device, encoder_path)

    @property
    def modality(self) -> str:
        return self.spec.modality

    @property
    def dim(self) -> int:
        """The width of h: the class vectors' (spec.hidden, or a few-shot member's inputs')."""
        return self._dim  # type: ignore[attr-defined]

    @property
    def similarity(self) -> str:
        return declaration(self.spec.loss).similarity

    def __post_init__(self) -> None:
        # Where and in what precision the model computes, read once (not per batch).
        object.__setattr__(self, "_device", self.model.head.W.device)
        object.__setattr__(self, "_dtype", self.model.head.W.dtype)
        object.__setattr__(self, "_dim", int(self.model.head.W.shape[-1]))

    @property
    def device(self) -> torch.device:
        return self._device  # type: ignore[attr-defined]

    @functools.cached_property
    def encoder(self) -> Encoder | None:
        """The pretrained encoder the head was trained over, resolved on this machine once
        (its files checked against the recorded digest) and handed to every request's
        preparation; None where it has none."""
        if EncoderRecord.of(self.preprocessing) is None:
            return None
        return load(self.preprocessing, self.encoder_path)

    @property
    def pretrained_encoder(self) -> str | None:
        """The name of the pretrained encoder the head was trained over, or None."""
        record = EncoderRecord.of(self.preprocessing)
        return record.name if record is not None else None

    @property
    def pixels(self) -> dict[str, Any]:
        """What raw images go through first (their shape, channels first, and pixel scale): a
        run on a frozen image encoder records the dataset's own beside the encoder."""
        return dict(self.preprocessing.get("pixels", self.preprocessing))

    @property
    def layers(self) -> tuple[Layer, ...]:
        """The layers this model can return: "encoder" too for a run on a pretrained encoder."""
        return LAYERS if self.pretrained_encoder else ("head",)

    def width(self, layer: Layer = "head") -> int:
        """The width of a layer's rows."""
        self.check_layer(layer)
        record = EncoderRecord.of(self.preprocessing)
        return record.features if layer == "encoder" and record is not None else self.dim

    def check_layer(self, layer: str) -> None:
        """ValueError, saying what is allowed, unless this model has ``layer``."""
        if layer not in LAYERS:
            raise ValueError(f"unknown layer {layer!r}; allowed: {', '.join(LAYERS)}")
        if layer not in self.layers:
            raise ValueError(
                f"this run has no pretrained encoder (its {self.spec.model} trained on the "
                f"{self.modality} inputs themselves), so it has no layer {layer!r}; allowed here: "
                f"{', '.join(repr(x) for x in self.layers)}")

    def prepare(self, raw: np.ndarray | torch.Tensor | Sequence[str]) -> torch.Tensor:
        """Raw inputs -> the model's input tensor, as in training. ValueError says what is
        wrong with them (shape, range, dtype, ...)."""
        if self.modality == "text":
            if isinstance(raw, np.ndarray | torch.Tensor):
                raise ValueError(f"this model takes texts, got an array of shape {tuple(raw.shape)}")
            return prepare_texts(list(raw), self.preprocessing, encoder=self.encoder)
        if not isinstance(raw, np.ndarray | torch.Tensor):
            raise ValueError(f"this model takes {self.modality} arrays, not texts")
        if self.modality == "image":
            if "encoder" in self.preprocessing:  # the raw pixels, then the encoder's family
                out: torch.Tensor = model_inputs(prepare_images(raw, self.pixels),
                                                 self.encoder or self.preprocessing)
                return out
            return prepare_images(raw, self.preprocessing)
        return prepare_vectors(raw, self.preprocessing)

    def warnings(self, raw: np.ndarray | torch.Tensor | Sequence[str]) -> list[str | None]:
        """For each raw input, None or what to know before trusting the model's answer: a
        text it could not read (no words, or none it knows: :func:`corel.data.text_warnings`)."""
        if self.modality == "text" and not isinstance(raw, np.ndarray | torch.Tensor):
            return text_warnings(list(raw), self.preprocessing, self.encoder)
        return [None] * len(raw)

    def tokens(self, texts: Sequence[str]) -> list[int]:
        """For each text, the tokens a pretrained text encoder reads of it (what it costs to
        compute); words for a model on word vectors."""
        if self.modality != "text":
            raise ValueError(f"this model takes {self.modality} inputs, not texts")
        if "encoder" in self.preprocessing:
            return text_tokens(list(texts), self.encoder or self.preprocessing)
        return [max(1, len(text.split())) for text in texts]

    @torch.inference_mode()
    def forward(self, x: torch.Tensor,
                similarities: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h = F(x) of prepared inputs and (if asked) the head's similarities, both
        float32 on the CPU; the similarities are of h at the model's own precision."""
        dtype: torch.dtype = self._dtype  # type: ignore[attr-defined]
        if x.device != self.device or x.dtype != dtype:
            x = x.to(self.device, dtype)
        with ieee_float32(self.device):
            h = self.model.encoder(x)
            sims = _cpu32(self.model.head.similarities(h)) if similarities else None
        return _cpu32(h), sims

    def embed(self, x: torch.Tensor, layer: Layer = "head") -> torch.Tensor:
        """The representations h = F(x) of prepared inputs: float32, on the CPU. ``layer``
        "encoder": the pretrained encoder's features, which are the prepared inputs of a
        frozen-encoder run."""
        self.check_layer(layer)
        if layer == "encoder":
            tower = getattr(self.model.encoder, "tower", None)
            if tower is None:  # frozen: the prepared inputs are the encoder's features
                return _cpu32(x)
            with torch.inference_mode(), ieee_float32(self.device):
                return _cpu32(tower(x.to(self.device, self._dtype)))  # type: ignore[attr-defined]
        return self.forward(x, similarities=False)[0]

    @torch.inference_mode()
    def similarities(self, h: torch.Tensor) -> torch.Tensor:
        """The head's similarity of each representation to each class vector (float32, CPU)."""
        h = h.to(self.device, self.model.head.W.dtype)
        with ieee_float32(self.device):
            return self.model.head.similarities(h).float().cpu()

    def embed_all(self, raw: np.ndarray | Sequence[str], batch: int = BATCH) -> np.ndarray:
        """Every row of ``raw``, prepared and embedded ``batch`` rows at a time: (N, dim)."""
        n = len(raw)
        out = np.empty((n, self.dim), np.float32)
        for start in range(0, n, batch):
            out[start:start + batch] = self.embed(self.prepare(raw[start:start + batch])).numpy()
        return out

    def metadata(self) -> dict[str, Any]:
        """What a file holding this model records besides its weights (see corel.export)."""
        return {
            "inputs": {"x": {"dtype": "float32", "shape": ["N", *self.input_shape]}},
            "outputs": {"embeddings": ["N", self.dim],
                        "similarities": ["N", len(self.class_names)]},
            "preprocessing": self.preprocessing,
            "class_names": self.class_names,
            "similarity": self.similarity,
        }
