"""Request and response bodies (pydantic v2), separate from ORM rows."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic.json_schema import SkipJsonSchema

from app.core.errors import MAX_ID
from app.core.models import STATUSES, as_utc
from corel.geometry import Geometry
from corel.layers import LAYER_DOCS, Layer
from corel.loss_catalog import DECLARATIONS, OPTION_FIELDS
from corel.spec import MODALITY, MODELS, MODELS_BY_MODALITY, UPLOADED, ExperimentSpec, spec_warnings

T = TypeVar("T")

Status = Literal["queued", "running", "succeeded", "failed", "cancelled", "pruned"]
"""app.core.models.Status, as the OpenAPI document states it."""
if set(get_args(Status)) != set(STATUSES):
    raise ImportError("app.core.schemas.Status differs from app.core.models.Status")

# Query and answer types of the reports: FastAPI refuses another value with a 422 that
# names the allowed ones and what was sent (app.core.errors.describe_error).
Split = Literal["test", "validation"]
"""The stored latent spaces a clustering report reads."""


# A timestamp as the API shows it: always with its UTC offset, whatever the database.
Timestamp = Annotated[datetime, AfterValidator(as_utc)]

def _combination_rules() -> dict[str, Any]:
    """The spec's rules across fields, in JSON Schema (``anyOf`` branches, an ``if``/``then``), so that the OpenAPI
    document tells a client all of what is accepted. The validators enforce the same."""
    null = {"type": "null"}
    # Which dataset takes what: an upload needs its id (and only an upload takes fractions), a
    # built-in dataset takes no id (AG News may: an upload of its CSV), and a dataset's
    # modality limits the models. One branch per kind of dataset, not an if/then per rule:
    # each if/then doubles the branches a generator (schemathesis) has to work through.
    kinds: dict[tuple[bool, bool, tuple[str, ...]], list[str]] = {}
    for dataset, modality in MODALITY.items():
        models = tuple(MODELS_BY_MODALITY[modality])
        kinds.setdefault((dataset in UPLOADED, dataset in TAKES_UPLOAD, models), []).append(dataset)
    datasets: list[dict[str, Any]] = []
    for (uploaded, takes_id, models), names in kinds.items():
        props: dict[str, Any] = {"dataset": {"enum": names}}
        branch: dict[str, Any] = {"properties": props}
        if uploaded:
            branch["required"] = ["dataset_id"]
            props["dataset_id"] = {"type": "integer"}
        else:
            props.update({key: null for key in ("val_fraction", "test_fraction")})
            if not takes_id:
                props["dataset_id"] = null
        if set(models) != set(MODELS):
            props["model"] = {"enum": list(models)}
        datasets.append(branch)
    rules: list[dict[str, Any]] = [{"anyOf": datasets}, {
        "if": {"properties": {"learn_gamma": {"const": True}}, "required": ["learn_gamma"]},
        "then": {"properties": {"loss": {"const": "gaussian"}}},
    }]
    # Each loss's own options (margin, scale, ...): within its ranges for a loss that takes
    # them, null for the others; one branch per loss with options, one for the rest (which
    # holds when the loss is absent too: gaussian takes none).
    plain = [d.name for d in DECLARATIONS.values() if not d.options]
    branches: list[dict[str, Any]] = [{"properties": {
        "loss": {"enum": plain}, **{f: null for f in OPTION_FIELDS}}}]
    for d in DECLARATIONS.values():
        if d.options:
            own = {o.field: o.json_schema() for o in d.options}
            branches.append({"required": ["loss"], "properties": {
                "loss": {"const": d.name}, **{f: own.get(f, null) for f in OPTION_FIELDS}}})
    rules.append({"anyOf": branches})
    return {"allOf": rules}


TAKES_UPLOAD = (*UPLOADED, "ag-news")
"""Datasets a spec may name with a dataset_id (an AG News CSV is uploaded as ag-news)."""

MAX_FRACTION = 0.45
"""Each of val_fraction and test_fraction over HTTP (so that together they leave at least
0.1 of the rows for training, a rule the schema can state field by field)."""


class ExperimentCreate(ExperimentSpec):
    """An experiment spec as submitted over HTTP.

    Files are referenced by ``dataset_id`` (from ``POST /datasets``), never by a
    server path: ``dataset_path`` and ``word_vectors`` are not accepted here. The rules
    across fields are in the schema too (``allOf`` of ``if``/``then``).
    """

    # strict: a JSON true is not the number 1, nor "5" the integer 5 (as the schema says).
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              json_schema_extra=lambda schema: schema.update(_combination_rules()))

    dataset_path: SkipJsonSchema[str | None] = None
    word_vectors: SkipJsonSchema[str | None] = None
    encoder_path: SkipJsonSchema[str | None] = None
    encoder_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="Id of your own encoder (POST /encoders): the model trains over it, frozen. "
        "Leave encoder out (it becomes the upload's: sentence-transformers or "
        "timm:<architecture>).")
    dataset_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="Id of an uploaded dataset (POST /datasets); required for npz, text and "
        "images, and only for them."
    )
    val_fraction: float | None = Field(
        default=None, gt=0.0, le=MAX_FRACTION,
        description="Uploaded datasets (npz, text, images): the share of rows held out for "
        "validation, stratified and seeded; default 0.15. The others keep the paper's split.",
    )
    test_fraction: float | None = Field(
        default=None, gt=0.0, le=MAX_FRACTION,
        description="Uploaded datasets: the share of rows held out for test; default 0.15.",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_server_paths(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("dataset_path", "word_vectors"):
                if data.get(key) is not None:
                    raise ValueError(
                        f"{key} is not accepted over HTTP; upload the file with POST /datasets "
                        "and pass its id as dataset_id"
                    )
            if data.get("encoder_path") is not None:
                raise ValueError("encoder_path is not accepted over HTTP; upload your encoder with "
                                 "POST /encoders and pass its id as encoder_id")
            data = _encoder_reference(data)
            if data.get("dataset") in UPLOADED and data.get("dataset_id") is None:
                raise ValueError(
                    f"dataset {data.get('dataset')!r} needs dataset_id: upload it with POST "
                    "/datasets first"
                )
            if data.get("dataset") not in TAKES_UPLOAD and data.get("dataset_id") is not None:
                raise ValueError(
                    f"dataset_id applies to uploaded datasets ({', '.join(TAKES_UPLOAD)}); "
                    f"{data.get('dataset')!r} is built in")
            if data.get("dataset") in UPLOADED:
                # ExperimentSpec requires a path for uploads; the worker resolves the upload.
                data = {**data, "dataset_path": f"upload:{data.get('dataset_id')}"}
        return data

    def to_spec(self) -> ExperimentSpec:
        return ExperimentSpec.model_validate(self.model_dump(exclude={"dataset_id", "encoder_id"}))


UPLOADED_ENCODER = {"text": "sentence-transformers", "image": "timm:uploaded"}
"""What a spec with an ``encoder_id`` and no ``encoder`` names until the service has read the
upload (app.services.encoders.check_spec_encoder puts its own name in)."""


def _encoder_reference(data: dict[str, Any]) -> dict[str, Any]:
    """A spec naming ``encoder_id``: the worker fetches the files (``encoder_path`` says
    which upload), and the encoder is the upload's family until the service names it."""
    from corel.encoder_catalog import DECLARATIONS as ENCODERS
    from corel.encoder_catalog import declared_name

    if data.get("encoder_id") is None:
        named = data.get("encoder")
        if isinstance(named, str) and ("timm:" in named or named in ("sentence-transformers", "timm")):
            raise ValueError(f"encoder {named!r} is your own: upload it with POST /encoders and pass "
                             "its id as encoder_id")
        return data
    named = data.get("encoder")
    modality = MODALITY.get(str(data.get("dataset")))
    if named is None:
        named = UPLOADED_ENCODER.get(modality or "", "sentence-transformers")
    elif not any(d.custom and d.name == declared_name(str(named)) for d in ENCODERS.values()):
        raise ValueError(f"encoder_id names your own encoder, and encoder {named!r} is installed with "
                         "corel: give one of them")
    return {**data, "encoder": named, "encoder_path": f"upload:{data['encoder_id']}"}


class OwnerRead(BaseModel):
    """Who owns a row: a user's id and name; null for rows made with no users (the open
    mode) or by the bootstrap admin (COREL_API_TOKEN)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str


OWNER = Field(default=None, description="Its owner (id and name); null: made with no users "
              "or by the bootstrap admin (COREL_API_TOKEN).")


class ExperimentRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    status: Status
    spec: dict[str, Any]
    dataset_id: int | None
    current_epoch: int
    epochs_total: int
    best_epoch: int | None
    best_val_accuracy: float | None
    test_accuracy: float | None
    train_seconds: float
    error: str | None
    phase: Literal["preparing data", "computing features", "reading features", "storing results"] | None = Field(
        description="While running, a step outside the epochs: before the first, 'preparing "
        "data' while a worker downloads the dataset, 'computing features' while a frozen "
        "encoder's features of it are computed and 'reading features' while they are read from "
        "the artifact store (another worker host computed them); after the last, 'storing results' while it "
        "writes the best checkpoint and the latent spaces; null otherwise.")
    phase_detail: str | None = Field(
        description="How far the phase is, e.g. 'MNIST: train-images-idx3-ubyte.gz (file 1 "
        "of 4): 4.2 of 9.9 MB', or 'minilm features of 3,072 of 5,320 rows'.")
    device: str | None = Field(
        default=None, description="The device it trained on, from its first epoch: 'cpu', or "
        "'cuda:0 (NVIDIA H200)'.")
    threads: int | None = Field(
        default=None, description="The torch threads it trains on (CPU), fixed when it first "
        "starts: its worker's share of the host's cores then, or COREL_WORKER_TORCH_THREADS; a "
        "resumed run trains on them again, so that its figures are those of the same spec "
        "trained alone on that many threads, whatever workers come and go around it.")
    precision: Literal["fp32", "bf16"] | None = Field(
        default=None, description="The precision it trained in, from its first epoch: the "
        "spec's, where the device can (a GPU without bfloat16 trains a bf16 spec in fp32).")
    features: dict[str, Any] | None = Field(
        default=None, description="A frozen pretrained encoder's features, from the first epoch: "
        "the CPU path they were computed on (precision: fp32, bf16 or int8), what the spec asked "
        "(asked: the spec's precision), the parity gate's figures on held-out rows (gate: per "
        "path rows_per_s, cos_p1, cos_min, map_at_r, passed, why), and where this attempt's "
        "features came from (source: 'computed'; 'from the store', computed by a run on another "
        "worker host and kept in the artifact store; 'cached', on this worker already).")
    pruned: dict[str, Any] | None = Field(
        default=None, description="A member its sweep pruned (status pruned): the rung (epoch) it "
        "left at, why, and its figures there (metrics).")
    cancel_requested: bool
    attempts: int
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    owner: OwnerRead | None = OWNER
    warnings: list[str] = Field(
        default_factory=list,
        description="What the spec allows but will most likely not train (Gaussian-COREL "
        "with lam < 0.5), and what the frozen encoder's features' path did not use and why (a "
        "path that failed the parity gate, an encoder that does not export).")
    prediction: str | None = Field(
        default=None,
        description="How /predict and the test accuracy predict for this loss: 'class vectors' "
        "(the similarity to each class's vector) or 'nearest class mean' (pair-based losses: "
        "the class means of the training representations, stored with the checkpoint).")

    @model_validator(mode="after")
    def _warnings(self) -> ExperimentRead:
        # A stored spec's loss and lam (its defaults when absent): no spec built per row.
        defaults = ExperimentSpec.model_fields
        loss = self.spec.get("loss", defaults["loss"].default)
        self.warnings = spec_warnings(loss, self.spec.get("lam", defaults["lam"].default), self.spec)
        self.warnings += [str(w) for w in (self.features or {}).get("warnings") or []]
        decl = DECLARATIONS.get(loss)
        self.prediction = decl.prediction if decl else None
        return self


class ExperimentQueued(BaseModel):
    id: int
    status: Status
    warnings: list[str] = Field(
        default_factory=list,
        description="What the spec allows but will most likely not train (Gaussian-COREL "
        "with lam < 0.5); the run is queued all the same.")


class EpochMetricRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    epoch: int
    train_loss: float
    train_accuracy: float
    val_accuracy: float
    test_accuracy: float | None
    is_best: bool
    seconds: float


class MetricsRead(BaseModel):
    experiment_id: int
    items: list[EpochMetricRead]


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class BuiltinDatasetRead(BaseModel):
    """A built-in dataset on this server: ``present`` (with the folder or file training
    reads, if any), ``downloadable`` (a worker downloads it when a run first needs it), or
    ``unavailable`` (with why, and the setting to change)."""

    model_config = ConfigDict(from_attributes=True)

    dataset: Literal["mnist", "fashion-mnist", "ag-news", "digits"]
    status: Literal["present", "downloadable", "unavailable"]
    where: str | None
    why: str | None


class BuiltinDatasets(BaseModel):
    items: list[BuiltinDatasetRead]


class DatasetRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    filename: str
    size: int = Field(description="Bytes of the file as uploaded.")
    sha256: str = Field(description="sha256 of the file as uploaded (a table or an image "
                        "folder is stored converted; this is of the user's own file).")
    summary: dict[str, Any]
    created_at: Timestamp
    owner: OwnerRead | None = OWNER


class EncoderUploadRead(BaseModel):
    """A user's own encoder (POST /encoders): a spec names it by ``encoder_id``."""

    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="A spec names it as encoder_id.")
    name: str
    kind: str = Field(description="sentence-transformers (a zipped folder) or timm (a weights file).")
    modality: str = Field(description="The inputs it reads: text or image.")
    architecture: str | None = Field(description="timm's architecture; null for a folder.")
    spec_name: str = Field(description="How the runs trained on it name it (their spec's encoder).")
    features: int = Field(description="The width of its output, which the head trains over.")
    filename: str
    size: int = Field(description="Bytes of the file as uploaded.")
    sha256: str = Field(description="sha256 of the file as uploaded: its files are stored once "
                        "per sha256, however many uploads send them.")
    digest: str = Field(description="The encoder's content digest, as the runs on it record it.")
    summary: dict[str, Any]
    created_at: Timestamp
    owner: OwnerRead | None = OWNER


class ErrorBody(BaseModel):
    error: str
    detail: Any


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

    experiment_id: int = Field(ge=1, le=MAX_ID)
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


IndexKind = Literal["auto", "exact", "hnsw"]


class IndexCreate(BaseModel):
    """What to index: the run's training split (the default) or a finished batch
    embedding job's rows; and how (``auto``: exact below COREL_INDEX_EXACT_BELOW_ROWS
    rows, HNSW from there)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "not": {"required": ["source", "embedding_job_id"]}})

    source: Literal["train"] | None = Field(
        default=None, description="The experiment's training split (the default when no "
        "embedding_job_id is given).")
    embedding_job_id: int | None = Field(
        default=None, ge=1, le=MAX_ID,
        description="A succeeded batch embedding job of this experiment: its rows, in order.")
    kind: IndexKind = Field(default="auto", description="exact, hnsw, or auto (by size).")

    @model_validator(mode="after")
    def _one_source(self) -> IndexCreate:
        if self.source is not None and self.embedding_job_id is not None:
            raise ValueError('give either "source": "train" or "embedding_job_id", not both')
        return self


class IndexRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int
    source: Literal["train", "embedding_job"]
    embedding_job_id: int | None
    requested_kind: IndexKind
    kind: Literal["exact", "hnsw"] | None = Field(description="Decided when built.")
    geometry: Geometry
    status: Status
    n_total: int = Field(description="Rows to index.")
    n_done: int = Field(description="Rows indexed so far.")
    dim: int | None
    size_bytes: int | None = Field(description="The stored index's size.")
    build_seconds: float | None
    ef_search: int | None = Field(description="HNSW: the efSearch chosen at build time.")
    recall: float | None = Field(
        description="HNSW: recall@10 against exact search measured at build time on held-out rows.")
    params: dict[str, Any] | None
    error: str | None
    cancel_requested: bool
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None


GRID_KEYS = ("loss", "lam", "seed", "gamma", "alpha", *OPTION_FIELDS)


def grid_items() -> dict[str, dict[str, Any]]:
    """Each grid field's values, as the spec's own fields take them (a loss's own options:
    any number, or miner name; each member is checked against its loss's range)."""
    number = {"type": "number"}
    return {
        "loss": {"type": "string", "enum": list(DECLARATIONS)},
        "lam": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0},
        "seed": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
        "gamma": {"type": "number", "exclusiveMinimum": 0.0},
        "alpha": {"type": "number", "exclusiveMinimum": 0.0, "maximum": 1.0},
        **{f: {"type": "string"} if f == "miner" else number for f in OPTION_FIELDS},
    }


def _grid_schema(schema: dict[str, Any]) -> None:
    schema.update({"minProperties": 1, "additionalProperties": False, "properties": {
        key: {"type": "array", "minItems": 1, "items": item} for key, item in grid_items().items()}})


PruneMetric = Literal["val_accuracy", "val_map_at_r"]


class PruneCreate(BaseModel):
    """How a sweep's stacked groups prune (corel.train.pruning)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    metric: PruneMetric | list[PruneMetric] = Field(
        default="val_accuracy", description="What a rung judges by: validation accuracy, "
        "validation MAP@R, or both (a list: their Pareto front).")
    eta: int = Field(default=3, ge=2, le=1000, description="Keep the best 1/eta at each rung.")
    min_epochs: int = Field(default=2, ge=1, le=100_000, description="The first rung (epoch); "
                            "below the spec's epochs.")


class SweepCreate(BaseModel):
    """A base spec and a grid; every combination of the grid's values is one experiment."""

    # strict: vectorize is a JSON boolean, not 0 or "yes" (as the schema says).
    model_config = ConfigDict(extra="forbid", strict=True)

    # In the OpenAPI document: ExperimentCreate's schema (app/api/openapi.py points it there).
    base: dict[str, Any] = Field(description="An experiment spec (as for POST /experiments).")
    grid: dict[str, list[Any]] = Field(
        description="Values to try per field; fields: " + ", ".join(GRID_KEYS) + ". Every "
        "combination is one experiment: at most COREL_MAX_SWEEP_SIZE of them.",
        json_schema_extra=_grid_schema,
    )
    vectorize: bool = Field(
        default=True,
        description="Train members that share dataset, model, batch size and data order "
        "together as one stacked model (same results, less time).",
    )
    prune: PruneCreate | None = Field(
        default=None,
        description="Successive halving inside each stacked group: at each rung (min_epochs, "
        "then times eta, below the spec's epochs) the group keeps the best 1/eta of its "
        "configurations by the metric (seeds of a configuration judged by their mean); the "
        "others end 'pruned', with their best checkpoint. Needs vectorize and groups of at "
        "least 2 members.")
    lam_by_loss: dict[str, float] | None = Field(
        default=None,
        description="lambda per loss, in place of the base's and the grid's for that loss: "
        "the paper's protocol of each loss at its own tuned lambda "
        '(e.g. {"center": 0.5, "cosine": 0.85}). Losses: those with a lambda '
        "(GET /losses: params has lam).",
    )

    @model_validator(mode="after")
    def _check_grid(self) -> SweepCreate:
        with_lam = [d.name for d in DECLARATIONS.values() if "lam" in d.params]
        for loss, lam in (self.lam_by_loss or {}).items():
            if loss not in with_lam:
                raise ValueError(f"lam_by_loss: {loss!r} has no lambda; allowed: {', '.join(with_lam)}")
            if not (isinstance(lam, int | float) and 0.0 < lam <= 1.0):
                raise ValueError(f"lam_by_loss: {loss} must be a number in (0, 1]; got {lam!r}")
        if not self.grid:
            raise ValueError(f"grid is empty; give values for any of {', '.join(GRID_KEYS)}")
        for key, values in self.grid.items():
            if key not in GRID_KEYS:
                raise ValueError(f"grid field {key!r} is not allowed; allowed: {', '.join(GRID_KEYS)}")
            if not values:
                raise ValueError(f"grid field {key!r} has no values")
        return self


MEMBER_GROUPS = ("The members' experiment ids by the group they are queued and trained in: the members "
                 "of a group train together as one stacked model, in lockstep over the same batches "
                 "(a sweep's members are split by what cannot stack: another model, data or encoder, the "
                 "triplet miner, a fine-tuned encoder, COREL_MAX_GROUP_SIZE; vectorize: false, one each).")


class SweepQueued(BaseModel):
    id: int
    size: int
    groups: int = Field(description="How many groups its members were queued in (member_groups).")
    member_groups: list[list[int]] = Field(description=MEMBER_GROUPS)


class SweepSummary(BaseModel):
    """A sweep in a list: its progress without its members' ids."""

    id: int
    base: dict[str, Any]
    grid: dict[str, Any]
    losses: list[str] = Field(description="The losses its members train: the grid's, else the "
                              "base's, else the spec's default.")
    lam_by_loss: dict[str, float] | None = None
    size: int
    counts: dict[str, int]
    done: int
    finished: bool
    created_at: Timestamp
    owner: OwnerRead | None = OWNER


class SweepRead(SweepSummary):
    """One sweep: its progress and its members' ids."""

    vectorize: bool
    prune: dict[str, Any] | None = Field(default=None, description="Its successive halving, if it prunes.")
    experiment_ids: list[int]
    member_groups: list[list[int]] | None = Field(
        default=None, description=MEMBER_GROUPS + " Null for a sweep made before groups were kept.")


class EmbeddingJobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    dataset_id: int = Field(description="An uploaded dataset (POST /datasets): every row is embedded.")


class EmbeddingJobRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    experiment_id: int
    dataset_id: int
    status: Status
    n_total: int
    n_done: int
    dim: int | None
    error: str | None
    cancel_requested: bool
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None


# --- users, tokens, shares and the audit log (issue 25) --------------------------------

class UserCreate(BaseModel):
    # strict: a JSON boolean is not 0, nor "5" the integer 5 (as the schema says).
    model_config = ConfigDict(strict=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$")
    admin: bool = False


class UserRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    admin: bool
    created_at: Timestamp


class TokenCreate(BaseModel):
    model_config = ConfigDict(strict=True)

    scope: Literal["read", "write", "admin"] = "write"
    expires_days: float | None = Field(default=None, gt=0, le=3650,
                                       description="days until the token stops working; none: never")
    name: str | None = Field(default=None, min_length=1, max_length=64,
                             pattern=r"^[^\x00-\x1f\x7f]+$",
                             description="what the token is for (a laptop, a CI job), to tell it "
                             "apart in the list; printable characters")


class TokenRead(BaseModel):
    """A token as listed: never the token itself (only its hash is stored)."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    user_id: int
    name: str | None
    scope: str
    created_at: Timestamp
    expires_at: Timestamp | None
    revoked_at: Timestamp | None
    last_used_at: Timestamp | None = Field(
        description="the last request it authenticated, to the minute (written at most once a minute)")


class TokenCreated(TokenRead):
    token: str = Field(description="The token itself: shown this once, stored only as a hash.")


class ShareCreate(BaseModel):
    """Share with a user (``user_id`` and ``access``), or make readable by every user or
    not (``public``)."""

    model_config = ConfigDict(strict=True)

    user_id: int | None = Field(default=None, ge=1, le=MAX_ID)
    access: Literal["read", "write"] = "read"
    public: bool | None = None

    @model_validator(mode="after")
    def _one_of(self) -> ShareCreate:
        if (self.user_id is None) == (self.public is None):
            raise ValueError('give either "user_id" (with "access") or "public"')
        return self


class ShareRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int = Field(description="The share's id: DELETE .../shares/{share_id} removes it.")
    user_id: int
    access: str


class SharesRead(BaseModel):
    resource: str
    id: int
    owner_id: int | None
    public: bool
    shares: list[ShareRead]


class AuditRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: Timestamp
    user_id: int | None
    token_id: int | None
    client: str | None
    action: str
    resource: str | None
    resource_id: int | None
    outcome: str
    status: int | None
    detail: str | None


class MeRead(BaseModel):
    """Who the caller is, as its token says (the dashboard shows the admin pages by it)."""

    user_id: int | None = Field(description="The user; null for the open mode (no token and no "
                                "users), the bootstrap admin (COREL_API_TOKEN) and anonymous readers.")
    name: str
    scope: Literal["read", "write", "admin"]
    admin: bool
