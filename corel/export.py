"""A trained model in one self-contained file: ONNX or TorchScript.

The file holds the encoder and the head. A model trained from its inputs takes the model's
input tensor (``x``, float32, ``(N, *input_shape)``), that is the raw input after the
preprocessing recorded in the checkpoint. A run on a frozen pretrained encoder exports the
whole model, the encoder's weights included, and takes what comes before the encoder:

* text: ``input_ids`` and ``attention_mask`` (int64, ``(N, L)``) from the encoder's own
  tokenizer; inside the graph, the sentence-transformers modules the model lists (its
  modules.json: for all-MiniLM-L6-v2 the transformer, mean pooling over the attention mask
  and normalisation), then the head's layers. The tokenizer's files go beside the model: the
  export is a zip of ``model.onnx`` (or ``model.pt``), ``tokenizer/`` and ``corel.json``;
* images: ``x``, the pixels as the dataset's loader prepares them (``(N, C, H, W)`` in
  [0, 1], H and W those of the training images); inside the graph, grey repeated to three
  channels, the bilinear resize to the encoder's image size, its normalisation, the encoder,
  then the head's layers.

Outputs: ``embeddings`` ``(N, dim)`` (the final hidden layer, as ``POST /embed`` returns it),
``similarities`` ``(N, K)`` (their argmax is the predicted class) and, for a pretrained
encoder, ``encoder`` ``(N, features)`` (its own output, ``/embed``'s layer "encoder"). The
metadata (ONNX ``metadata_props``, TorchScript's extra file ``corel.json``) records the
inputs, the preprocessing, the tokenizer's files, the class names, the similarity and the
spec, so that the file alone can be served.
"""

from __future__ import annotations

import io
import json
import os
import warnings
import zipfile
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from corel.encoders import export_part, fine_tuned
from corel.encoders.contract import ONNX_OPSET, TOKENIZER_FOLDER
from corel.losses import LossHead
from corel.serving import ServedModel

__all__ = ["FORMATS", "Exported", "export", "export_file", "export_metadata"]

FORMATS = ("onnx", "torchscript")
OPSET = ONNX_OPSET
SUFFIX = {"onnx": "onnx", "torchscript": "pt"}


@dataclass(frozen=True)
class Exported:
    """An export's bytes and what they are (``suffix``): one model file (``onnx``, ``pt``),
    or a ``zip`` of the model and its tokenizer's files (a run on a text encoder)."""

    data: bytes
    suffix: str


class _EncoderAndHead(nn.Module):
    def __init__(self, encoder: nn.Module, head: LossHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        return h, self.head.similarities(h)


class _WholeModel(nn.Module):
    """A pretrained encoder, then the trained layers and the head: (h, similarities, features)."""

    def __init__(self, pretrained: nn.Module, encoder: nn.Module, head: LossHead) -> None:
        super().__init__()
        self.pretrained = pretrained
        self.encoder = encoder
        self.head = head

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.pretrained(*inputs)
        h = self.encoder(features)
        return h, self.head.similarities(h), features


def export_metadata(served: ServedModel,
                    trained_on: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the exported file records besides the weights: the served model's metadata
    (corel.serving; for a run on a pretrained encoder, the whole model's inputs and outputs
    instead), what it was trained on and its spec. ``trained_on`` says what the data was in
    its owner's terms (the service: the upload's id and file name); by default the built-in
    dataset's name, or "your own data" for a file. The spec's paths (where a file lay on the
    machine that trained) are left out."""
    spec = served.spec.model_dump(mode="json")
    own = spec.get("dataset_path") is not None
    for key in ("dataset_path", "word_vectors", "encoder_path"):
        spec.pop(key, None)
    if trained_on is None:
        trained_on = ({"dataset": "your own data", "format": spec["dataset"]} if own
                      else {"dataset": spec["dataset"]})
    meta = {"format_version": 1, **served.metadata(), "trained_on": trained_on, "spec": spec}
    if served.pretrained_encoder is not None:
        meta.update(_whole_model_interface(served))
    return meta


def _whole_model_interface(served: ServedModel) -> dict[str, Any]:
    outputs = {"embeddings": ["N", served.dim], "similarities": ["N", len(served.class_names)],
               "encoder": ["N", served.width("encoder")]}
    if served.modality == "text":
        ids = {"dtype": "int64", "shape": ["N", "L"]}
        return {"inputs": {"input_ids": {**ids, "description": "the texts' token ids, from the "
                                         f"tokenizer in {TOKENIZER_FOLDER}/"},
                           "attention_mask": {**ids, "description": "1 on each text's tokens, 0 on "
                                              "the padding"}},
                "outputs": outputs}
    pixels = served.preprocessing["pixels"]
    return {"inputs": {"x": {"dtype": "float32", "shape": ["N", *pixels["input_shape"]],
                             "description": "the pixels as the dataset's loader prepares them: raw "
                             "values / preprocessing.pixels.pixel_max, in [0, 1]"}},
            "outputs": outputs}


def export(checkpoint: dict[str, Any], fmt: str, trained_on: dict[str, Any] | None = None,
           encoder_path: str | os.PathLike[str] | None = None) -> bytes:
    """The checkpoint's model as an ONNX or TorchScript file (bytes; a zip of the model and
    its tokenizer for a run on a text encoder: :func:`export_file`); float32, on the CPU.
    ``trained_on``: see :func:`export_metadata`; ``encoder_path``: see :func:`export_file`."""
    return export_file(checkpoint, fmt, trained_on, encoder_path).data


def export_file(checkpoint: dict[str, Any], fmt: str, trained_on: dict[str, Any] | None = None,
                encoder_path: str | os.PathLike[str] | None = None) -> Exported:
    """The checkpoint's model exported as :data:`FORMATS` ``fmt`` says, and what the bytes
    are. ValueError says why a model cannot be exported in that format. ``encoder_path``:
    the files of the user's own encoder the model was trained over, on this machine."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
    served = ServedModel.from_checkpoint(checkpoint, "cpu", encoder_path)  # the API's own pipeline
    # A fine-tuned run's model holds its encoder (corel.encoders.finetune): the tower with the
    # trained weights, then the trained layers; a frozen run's, the layers over the features.
    tuned = fine_tuned(served.preprocessing)
    whole: Any = served.model.encoder
    layers: nn.Module = whole.layers if tuned else whole
    meta = export_metadata(served, trained_on)
    tokenizer: dict[str, bytes] | None = None
    module: nn.Module
    example: tuple[torch.Tensor, ...]
    if served.pretrained_encoder is None:
        module = _EncoderAndHead(served.model.encoder, served.model.head)
        inputs, example = ["x"], (torch.zeros(2, *served.input_shape),)
        outputs = ["embeddings", "similarities"]
    else:  # the encoder as its family exports it, then the trained layers and the head
        part = export_part(served.encoder or served.preprocessing, fmt, whole.tower if tuned else None)
        module = _WholeModel(part.module, layers, served.model.head)
        inputs, example, outputs = part.inputs, part.example, ["embeddings", "similarities", "encoder"]
        if part.files is not None:  # a tokenizer's files beside the model
            tokenizer, meta["tokenizer"] = part.files, part.about
            meta["files"] = {"model": f"model.{SUFFIX[fmt]}", "tokenizer": f"{part.about['folder']}/",
                             "metadata": "corel.json"}
    module = module.float().eval()
    model = _save(module, example, inputs, outputs, fmt, meta)
    if tokenizer is None:
        return Exported(model, SUFFIX[fmt])
    return Exported(_zip({meta["files"]["model"]: model, "corel.json": json.dumps(meta, indent=1).encode(),
                          **{f"{meta['tokenizer']['folder']}/{name}": data for name, data in tokenizer.items()}}),
                    "zip")


def _save(module: nn.Module, example: tuple[torch.Tensor, ...], inputs: list[str], outputs: list[str],
          fmt: str, meta: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # The tracer warns about the heads' shape checks, which hold for any batch size.
        warnings.simplefilter("ignore")
        if fmt == "torchscript":
            with torch.no_grad():
                traced = torch.jit.trace(module, example, check_trace=False)
            torch.jit.save(traced, buf, _extra_files={"corel.json": json.dumps(meta)})
            return buf.getvalue()
        try:
            import onnx
        except ImportError as exc:
            raise ImportError("ONNX export needs the onnx package: pip install 'corel[export]'") from exc
        # Token ids vary in length as well as in number; the rest only in number.
        dynamic = {name: ({0: "N", 1: "L"} if name in ("input_ids", "attention_mask") else {0: "N"})
                   for name in inputs + outputs}
        with torch.no_grad():
            torch.onnx.export(  # a file object works as well as a path
                module, example, buf, input_names=inputs,  # type: ignore[arg-type]
                output_names=outputs, dynamic_axes=dynamic, opset_version=OPSET, dynamo=False)
    proto = onnx.load_from_string(buf.getvalue())
    entry = proto.metadata_props.add()
    entry.key, entry.value = "corel", json.dumps(meta)
    return bytes(proto.SerializeToString())


def _zip(files: dict[str, bytes]) -> bytes:
    """The files in one zip, in this order, with fixed timestamps (the same model, the same
    bytes); the weights stored as they are (they hardly compress), the rest deflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED if name.startswith("model.") else zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()
