"""An experiment's spec as the API takes it (POST /experiments), and a run as it reads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from app.core.errors import MAX_ID
from app.core.schemas.common import OWNER, OwnerRead, Status, Timestamp
from corel.loss_catalog import DECLARATIONS, OPTION_FIELDS
from corel.spec import (
    MODALITY,
    MODELS,
    MODELS_BY_MODALITY,
    UPLOADED,
    ExperimentSpec,
    FewShotDraw,
    spec_warnings,
)


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
    # A few-shot sweep's member's (POST /sweeps with fewshot documents the protocol): out of
    # this body's document, whose one nested object it would be (schemathesis cannot generate
    # from the spec's rules with it).
    fewshot: SkipJsonSchema[FewShotDraw | None] = None
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
