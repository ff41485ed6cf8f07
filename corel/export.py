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
import tempfile
import warnings
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from corel.losses import LossHead
from corel.serving import ServedModel

__all__ = ["FORMATS", "Exported", "export", "export_file", "export_metadata"]

FORMATS = ("onnx", "torchscript")
OPSET = 17
SUFFIX = {"onnx": "onnx", "torchscript": "pt"}
TOKENIZER_FOLDER = "tokenizer"


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


class _SentenceEncoder(nn.Module):
    """A sentence-transformers model's modules in their order, from token ids and attention
    mask (its tokenizer stays outside the graph)."""

    def __init__(self, steps: Sequence[nn.Module], token_type_ids: bool) -> None:
        super().__init__()
        self.steps = nn.ModuleList(steps)
        self.token_type_ids = token_type_ids

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        features: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.token_type_ids:  # one text per row: the tokenizer's are all zero
            features["token_type_ids"] = torch.zeros_like(input_ids)
        for step in self.steps:
            features = step(features)
        out: torch.Tensor = features["sentence_embedding"]
        return out


class _ImageEncoder(nn.Module):
    """corel.pretrained's image steps on pixels in [0, 1]: grey repeated to three channels, the
    bilinear resize to the encoder's side (antialiased when it shrinks the width, as there),
    the encoder's normalisation, then the encoder."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, encoder: nn.Module, channels: int, size: int, antialias: bool,
                 mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.encoder = encoder
        self.grey = channels == 1
        self.size = size
        self.antialias = antialias
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.grey:
            x = x.expand(-1, 3, -1, -1)
        x = nn.functional.interpolate(x, size=(self.size, self.size), mode="bilinear",
                                      align_corners=False, antialias=self.antialias)
        out: torch.Tensor = self.encoder((x - self.mean) / self.std)
        return out


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


def export(checkpoint: dict[str, Any], fmt: str, trained_on: dict[str, Any] | None = None) -> bytes:
    """The checkpoint's model as an ONNX or TorchScript file (bytes; a zip of the model and
    its tokenizer for a run on a text encoder: :func:`export_file`); float32, on the CPU.
    ``trained_on``: see :func:`export_metadata`."""
    return export_file(checkpoint, fmt, trained_on).data


def export_file(checkpoint: dict[str, Any], fmt: str,
                trained_on: dict[str, Any] | None = None) -> Exported:
    """The checkpoint's model exported as :data:`FORMATS` ``fmt`` says, and what the bytes
    are. ValueError says why a model cannot be exported in that format."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
    served = ServedModel.from_checkpoint(checkpoint, "cpu")  # the API's own pipeline
    # A fine-tuned run's model holds its encoder (corel.finetune): the tower with the trained
    # weights, then the trained layers; a frozen run's, the layers over the encoder's features.
    tuned = served.preprocessing.get("encoder", {}).get("mode") == "finetune"
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
    elif served.modality == "text":
        text, example, tokenizer, meta["tokenizer"] = _text_encoder(served.preprocessing)
        if tuned:  # the pretrained modules' copy for tracing, with the fine-tuned weights
            cast(Any, text).steps.load_state_dict(whole.tower.steps.state_dict())
        module = _WholeModel(text, layers, served.model.head)
        inputs, outputs = ["input_ids", "attention_mask"], ["embeddings", "similarities", "encoder"]
        meta["files"] = {"model": f"model.{SUFFIX[fmt]}", "tokenizer": f"{TOKENIZER_FOLDER}/",
                         "metadata": "corel.json"}
    else:
        image, example = _image_encoder(served.preprocessing, fmt, whole.tower if tuned else None)
        module = _WholeModel(image, layers, served.model.head)
        inputs, outputs = ["x"], ["embeddings", "similarities", "encoder"]
    module = module.float().eval()
    model = _save(module, example, inputs, outputs, fmt, meta)
    if tokenizer is None:
        return Exported(model, SUFFIX[fmt])
    return Exported(_zip({meta["files"]["model"]: model, "corel.json": json.dumps(meta, indent=1).encode(),
                          **{f"{TOKENIZER_FOLDER}/{name}": data for name, data in tokenizer.items()}}),
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


def _text_encoder(preprocessing: dict[str, Any]) -> tuple[
        nn.Module, tuple[torch.Tensor, ...], dict[str, bytes], dict[str, Any]]:
    """The run's sentence-transformers model as a module from token ids, an example input,
    its tokenizer's files (name -> bytes) and what the metadata says of them."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from corel.pretrained import encoder_files

    name = preprocessing["encoder"]["name"]
    # A copy of its own, with the attention written out: a traced graph then applies the
    # attention mask as it is given, where a fused kernel's path may depend on its values.
    model = SentenceTransformer(str(encoder_files(preprocessing)), device="cpu", local_files_only=True,
                                model_kwargs={"attn_implementation": "eager"}).eval()
    steps = list(model)
    first = steps[0] if steps else None
    tok = getattr(first, "tokenizer", None)
    if tok is None or not hasattr(tok, "backend_tokenizer"):
        raise ValueError(f"encoder {name!r}: its first module has no fast (tokenizers) tokenizer to ship "
                         "beside the exported model")
    if getattr(first, "do_lower_case", False):
        raise ValueError(f"encoder {name!r} lower-cases its texts before its tokenizer does, which the "
                         "exported tokenizer would not; it cannot be exported yet")
    max_length = int(getattr(first, "max_seq_length", None) or tok.model_max_length)
    token_type_ids = "token_type_ids" in tok.model_input_names
    sample = tok(["a", "an example of the texts this model reads, longer than the first"], padding=True,
                 truncation=True, max_length=max_length, return_tensors="pt")
    if token_type_ids and bool(sample["token_type_ids"].any()):
        raise ValueError(f"encoder {name!r}: its tokenizer gives one text non-zero token type ids, "
                         "which the exported model does not take")
    example = (sample["input_ids"].long(), sample["attention_mask"].long())

    with tempfile.TemporaryDirectory() as tmp:
        tok.save_pretrained(tmp)
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    # tokenizer.json with the settings sentence-transformers applies at each call: its
    # truncation at the model's max_seq_length, each batch padded to its longest text.
    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.enable_truncation(max_length=max_length)
    backend.enable_padding(pad_id=int(tok.pad_token_id), pad_token=str(tok.pad_token),
                           pad_type_id=int(getattr(tok, "pad_token_type_id", 0) or 0))
    files["tokenizer.json"] = backend.to_str().encode()
    if "tokenizer_config.json" in files:
        config = json.loads(files["tokenizer_config.json"])
        config["model_max_length"] = max_length
        files["tokenizer_config.json"] = json.dumps(config, indent=2).encode()
    about = {
        "folder": TOKENIZER_FOLDER, "files": sorted(files), "max_length": max_length,
        "truncation": "each text cut to max_length tokens, its special tokens included",
        "padding": "each batch padded to its longest text (attention_mask 0 there)",
        "use": f"tokenizers.Tokenizer.from_file('{TOKENIZER_FOLDER}/tokenizer.json').encode_batch(texts) "
               "(its ids and attention_mask), or transformers.AutoTokenizer.from_pretrained("
               f"'{TOKENIZER_FOLDER}')(texts, padding=True, truncation=True, return_tensors='np')",
        "modules": [type(step).__name__ for step in steps],
    }
    return _SentenceEncoder(steps, token_type_ids), example, files, about


def _image_encoder(preprocessing: dict[str, Any], fmt: str, tuned: nn.Module | None = None
                   ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The run's image steps and encoder as one module from pixels in [0, 1], and an example
    input (two images of the training images' shape); ``tuned``: a fine-tuned run's tower,
    whose network the module then holds."""
    from corel.pretrained import frozen_image_encoder

    meta = preprocessing["encoder"]
    channels, height, width = (int(s) for s in preprocessing["pixels"]["input_shape"])
    size = int(meta["image_size"])
    antialias = width > size  # as corel.pretrained resizes them
    if antialias and fmt == "onnx":
        raise ValueError(
            f"this run's images are {width} pixels wide and its encoder takes {size}: serving "
            f"shrinks them with an antialiased bilinear resize, which ONNX (opset {OPSET}) cannot "
            "express, and an export without it would give other numbers; export it as TorchScript "
            "(format torchscript), which holds the same steps")
    network: nn.Module = cast(nn.Module, tuned.model) if tuned is not None else frozen_image_encoder(preprocessing)
    module = _ImageEncoder(network, channels, size, antialias, meta["mean"], meta["std"])
    return module, (torch.zeros(2, channels, height, width),)
