"""A trained model in one self-contained file: ONNX or TorchScript.

The file holds the encoder and the head. Its input is the model's input tensor
(float32, ``(N, *input_shape)``), that is the raw input after the preprocessing
recorded in the checkpoint; its outputs are ``embeddings`` ``(N, dim)`` (the final
hidden layer, as ``POST /embed`` returns it) and ``similarities`` ``(N, K)`` (their
argmax is the predicted class). The metadata (ONNX ``metadata_props``, TorchScript's
extra file ``corel.json``) records the preprocessing, the class names, the similarity
and the spec, so that the file alone can be served.
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any

import torch
from torch import nn

from corel.losses import LossHead
from corel.serving import ServedModel

__all__ = ["FORMATS", "export", "export_metadata"]

FORMATS = ("onnx", "torchscript")
OPSET = 17


class _EncoderAndHead(nn.Module):
    def __init__(self, encoder: nn.Module, head: LossHead) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.encoder(x)
        return h, self.head.similarities(h)


def export_metadata(served: ServedModel,
                    trained_on: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the exported file records besides the weights: the served model's metadata
    (corel.serving), what it was trained on and its spec. ``trained_on`` says what the
    data was in its owner's terms (the service: the upload's id and file name); by
    default the built-in dataset's name, or "your own data" for a file. The spec's paths
    (where a file lay on the machine that trained) are left out."""
    spec = served.spec.model_dump(mode="json")
    own = spec.get("dataset_path") is not None
    for key in ("dataset_path", "word_vectors"):
        spec.pop(key, None)
    if trained_on is None:
        trained_on = ({"dataset": "your own data", "format": spec["dataset"]} if own
                      else {"dataset": spec["dataset"]})
    return {"format_version": 1, **served.metadata(), "trained_on": trained_on, "spec": spec}


def export(checkpoint: dict[str, Any], fmt: str, trained_on: dict[str, Any] | None = None) -> bytes:
    """The checkpoint's model as an ONNX or TorchScript file (bytes); float32, on the CPU.
    ``trained_on``: see :func:`export_metadata`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; allowed: {', '.join(FORMATS)}")
    served = ServedModel.from_checkpoint(checkpoint, "cpu")  # the API's own pipeline
    wrapped = _EncoderAndHead(served.model.encoder, served.model.head).float().eval()
    meta = export_metadata(served, trained_on)
    example = torch.zeros(2, *served.input_shape)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # The tracer warns about the heads' shape checks, which hold for any batch size.
        warnings.simplefilter("ignore")
        if fmt == "torchscript":
            with torch.no_grad():
                traced = torch.jit.trace(wrapped, example, check_trace=False)
            torch.jit.save(traced, buf, _extra_files={"corel.json": json.dumps(meta)})
            return buf.getvalue()
        try:
            import onnx
        except ImportError as exc:
            raise ImportError("ONNX export needs the onnx package: pip install 'corel[export]'") from exc
        with torch.no_grad():
            torch.onnx.export(  # a file object works as well as a path
                wrapped, (example,), buf, input_names=["x"],  # type: ignore[arg-type]
                output_names=["embeddings", "similarities"],
                dynamic_axes={"x": {0: "N"}, "embeddings": {0: "N"}, "similarities": {0: "N"}},
                opset_version=OPSET, dynamo=False)
    proto = onnx.load_from_string(buf.getvalue())
    entry = proto.metadata_props.add()
    entry.key, entry.value = "corel", json.dumps(meta)
    return bytes(proto.SerializeToString())
