"""The layers a served model returns representations from, declared once.

``head``: the head's representation h = F(x), the final hidden layer, the space the loss
shaped (what ``/embed`` returns by default, and every run has); ``encoder``: a pretrained
encoder's own output, the features the head takes as its input (only a run on a pretrained
encoder has it). :class:`corel.serving.ServedModel` computes them; the API's ``/embed`` takes
one by name.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = ["LAYERS", "LAYER_DOCS", "Layer"]

Layer = Literal["head", "encoder"]
LAYERS: tuple[Layer, ...] = get_args(Layer)
LAYER_DOCS: dict[Layer, str] = {
    "head": "the head's representation h, the final hidden layer (the space the loss shaped); "
            "the default",
    "encoder": "the pretrained encoder's own output (its features, the head's input); only a run "
               "on a pretrained encoder has it",
}
"""Each layer in words (the API's documentation reads them)."""
