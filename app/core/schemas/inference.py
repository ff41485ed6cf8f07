"""Serving: /embed, /predict and /neighbors, their inputs and answers."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from app.core.errors import MAX_ID
from corel.geometry import Geometry
from corel.layers import LAYER_DOCS, Layer


class BinaryArray(BaseModel):
    """A compact batch: base64 of a C-ordered float32 or uint8 array, with its shape."""

    dtype: Literal["float32", "uint8"]
    shape: list[Annotated[int, Field(ge=1)]] = Field(
        min_length=1, description="First axis: one entry per input.")
    data: str = Field(description="base64 of the array's bytes (little-endian, C order)")


INPUT_KINDS = ("images", "texts", "arrays", "rows", "binary")


class InferenceRequest(BaseModel):
    """Inputs for POST /embed and POST /predict: exactly one of images, texts, arrays, rows,
    binary."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "oneOf": [{"required": [kind]} for kind in INPUT_KINDS]})

    experiment_id: int | None = Field(default=None, ge=1, le=MAX_ID,
                                      description="The run that answers; or name a model's version "
                                      "in model.")
    model: str | None = Field(default=None, max_length=200,
                              description='A model\'s version by name, in place of experiment_id: '
                              '"news:3" (version 3 of model news).')
    # Absent (or null) when not given: exactly one input kind is present (the schema's
    # oneOf; app/api/openapi.py drops the nulls from the document, as a client need not send them).
    images: Annotated[list[str], Field(min_length=1)] | None = Field(
        default=None, description="base64 PNG or JPEG files")
    texts: Annotated[list[str], Field(min_length=1)] | None = Field(
        default=None, description="raw strings (text models)")
    arrays: Annotated[list[Any], Field(min_length=1)] | None = Field(
        default=None, description="one nested list per input: (H, W) images or vectors"
    )
    rows: Annotated[list[dict[str, Any]], Field(min_length=1)] | None = Field(
        default=None,
        description="one object per input, the feature columns by name (models trained from "
        "a feature table), or the text's column (text models: the column the model's table "
        "trained from, else the one column not named like a label, else one named text, body, "
        "...; AG News's title and description are joined); other keys, such as the label, are "
        "ignored")
    binary: BinaryArray | None = None
    output: Literal["json", "binary"] = Field(
        default="json", description="embeddings as JSON lists, or as a BinaryArray (float32)"
    )
    # Fields besides the inputs that a form or an octet-stream query may carry.
    EXTRA_FIELDS: ClassVar[tuple[str, ...]] = ()
    # The bytes of a raw application/octet-stream body (``binary`` then holds its shape).
    _raw: bytes | None = PrivateAttr(default=None)
    # Multipart: each input's file name ("iris.csv, row 3" for a CSV's rows), echoed back.
    _names: list[str] | None = PrivateAttr(default=None)
    # The model version ``model`` named, once resolved (app.services.models.Served).
    _served: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for kind in INPUT_KINDS:
                if kind in data and data[kind] is None:
                    raise ValueError(f"{kind} is null: give its inputs, or leave the field out")
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> InferenceRequest:
        if (self.experiment_id is None) == (self.model is None):
            raise ValueError("name the model that answers: experiment_id (a run's id) or model "
                             '("name:N", a model\'s version), exactly one of the two')
        given = [k for k in INPUT_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "send exactly one of images, texts, arrays, rows or binary"
                + (f"; got {', '.join(given)}" if given else "")
            )
        return self


class EmbedRequest(InferenceRequest):
    """Inputs for POST /embed, and which layer's representations to return."""

    EXTRA_FIELDS: ClassVar[tuple[str, ...]] = ("layer",)
    layer: Layer = Field(default="head", description="Which representation: " + "; ".join(
        f"{name}: {doc}" for name, doc in LAYER_DOCS.items()) + ".")


MAX_K = 1000
"""The most neighbours /neighbors returns per input."""


class NeighborsRequest(InferenceRequest):
    """Inputs as for /embed (the experiment is the path's), and how many neighbours."""

    EXTRA_FIELDS: ClassVar[tuple[str, ...]] = ("k", "index_id")
    k: int = Field(default=10, ge=1, le=MAX_K, description="Neighbours per input, nearest first.")
    index_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="A succeeded index of this experiment (POST /experiments/{id}/index); default: "
        "its latest, else exact search over its training split.")


class CheckpointRef(BaseModel):
    """The checkpoint that answered: the run's best (the epoch of best validation accuracy)."""

    id: int
    epoch: int
    sha256: str


class BinaryEmbeddings(BaseModel):
    """A float32 array as base64 of its little-endian bytes, row-major (``output: binary``)."""

    dtype: Literal["float32"]
    shape: list[int]
    data: str


class EmbedRead(BaseModel):
    """POST /embed's answer."""

    experiment_id: int
    model: str | None = Field(default=None, description="The model named in the request (absent "
                              "when it named an experiment).")
    model_version: int | None = Field(default=None, description="The version that answered.")
    checkpoint: CheckpointRef
    layer: Layer
    dim: int = Field(description="Width of each representation.")
    n: int = Field(description="How many inputs (rows).")
    inputs: list[str] | None = Field(default=None, description="multipart: which file (or CSV "
                                     "row) each row is.")
    warnings: list[str | None] | None = Field(default=None, description="One per input, null where "
                                              "there is nothing to say (a text cut to the "
                                              "encoder's length); absent when none has one.")
    embeddings: list[list[float]] | BinaryEmbeddings = Field(description="n x dim: nested lists, or "
                                                        "(output: binary) base64.")


class Prediction(BaseModel):
    class_index: int
    class_name: str
    similarities: list[float] = Field(description="To every class vector, in class_names' order.")
    input: str | None = Field(default=None, description="multipart: the file (or CSV row).")
    warning: str | None = Field(default=None, description="An answer not to trust, and why.")


class PredictRead(BaseModel):
    """POST /predict's answer."""

    experiment_id: int
    model: str | None = Field(default=None, description="The model named in the request (absent "
                              "when it named an experiment).")
    model_version: int | None = Field(default=None, description="The version that answered.")
    checkpoint: CheckpointRef
    similarity: str = Field(description="The head's similarity function.")
    class_names: list[str]
    predictions: list[Prediction]


class ClassRef(BaseModel):
    class_index: int
    class_name: str


class Neighbor(BaseModel):
    """One neighbour, nearest first."""

    row: int = Field(description="Its place in the searched reference (the stored training "
                     "split, or a batch job's rows).")
    id: int | None = Field(description="Its row in the file it was read from (source); null "
                           "for a run trained before its rows' positions were kept.")
    label: int
    class_name: str
    distance: float = Field(description="1 - cosine similarity, or the Euclidean distance.")
    text: str | None = Field(default=None, description="Text data: its text.")
    image_url: str | None = Field(default=None, description="Image data: a PNG of it.")


class NeighborsResult(BaseModel):
    neighbors: list[Neighbor]
    knn_prediction: ClassRef = Field(description="The neighbours' majority class (a tie: the "
                                     "nearer class).")
    prediction: ClassRef = Field(description="The head's own.")
    input: str | None = Field(default=None, description="multipart: the file (or CSV row).")


class NeighborsSource(BaseModel):
    """The file the neighbours' ids count rows of: a built-in dataset's or an upload."""

    dataset: str | None = None
    dataset_id: int | None = None


class NeighborsRead(BaseModel):
    """POST /experiments/{id}/neighbors's answer."""

    experiment_id: int
    index_id: int | None
    k: int
    geometry: Geometry
    n_reference: int = Field(description="Rows searched.")
    source: NeighborsSource
    results: list[NeighborsResult]
