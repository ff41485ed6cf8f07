"""Sweeps: a base spec and a grid, their pruning, their progress."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.core.schemas.common import OWNER, OwnerRead, Timestamp
from corel.loss_catalog import DECLARATIONS, OPTION_FIELDS

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


FEWSHOT_SETS = ("fewshot", "train_subset", "epochs", "lr", "batch_size", "budget")
"""Fields of a few-shot sweep's members that its protocol sets (beside each draw's seed)."""


class FewShotCreate(BaseModel):
    """A few-shot protocol (corel.fewshot): for each N of ``shots`` and each of ``splits``
    seeded draws of N rows per class, every member of the grid trains a head on the draw alone
    and is tested on the same evaluation rows."""

    model_config = ConfigDict(extra="forbid", strict=True)

    shots: list[int] = Field(default=[8, 16, 64], min_length=1, max_length=20,
                             description="Examples per class, each N of them (default 8, 16, 64).")
    splits: int = Field(default=10, ge=1, le=100, description="Seeded draws at each N (1 to 100).")
    seed: int = Field(default=0, ge=0, le=2_000_000, description="The protocol's seed: the same seed "
                      "and dataset, the same evaluation rows and draws.")
    unlabeled: bool = Field(default=False, description="Each member also trains on the pool's other "
                            "rows without their labels (self-training: each labelled from the shots "
                            "and its inputs, the most confident 80 % of each class kept; never an "
                            "evaluation row). Most few-label work has many rows and few labels; a "
                            "comparison with a method that reads the shots alone should say so.")

    @model_validator(mode="after")
    def _check_shots(self) -> FewShotCreate:
        if any(n < 1 or n > 100_000 for n in self.shots):
            raise ValueError(f"shots must be numbers of examples per class from 1 to 100000; got {self.shots}")
        if len(set(self.shots)) != len(self.shots):
            raise ValueError(f"shots must not repeat a number; got {self.shots}")
        return self


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
    fewshot: FewShotCreate | None = Field(
        default=None,
        description="A few-shot sweep: each grid combination is trained, as a head over the "
        "inputs (a frozen encoder's features), on each seeded draw of N rows per class for each "
        "N of shots, and tested on the same evaluation rows (half of each class of the dataset's "
        "training and validation rows; the draws come from the other half). The protocol sets "
        "each member's " + ", ".join(FEWSHOT_SETS) + " and seed: neither the base nor the grid "
        "may. The report's fewshot part gives, per N and method, the mean, sd, min, max and the "
        "paired difference against the best with its p-value.")
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
        if self.fewshot is not None:
            if "seed" in self.grid:
                raise ValueError("grid field 'seed' is set by the few-shot protocol (each draw's own); "
                                 "allowed with fewshot: " + ", ".join(k for k in GRID_KEYS if k != "seed"))
            set_ = [k for k in FEWSHOT_SETS if self.base.get(k) is not None] + \
                (["seed"] if self.base.get("seed") not in (None, 0) else [])
            if set_:
                raise ValueError(f"base field {set_[0]!r} is set by the few-shot protocol; leave "
                                 f"{', '.join(FEWSHOT_SETS)} and seed out of a few-shot sweep")
            if self.prune is not None:
                raise ValueError("prune does not apply to a few-shot sweep: its members train on "
                                 "their own draws, each to the end")
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
    fewshot: dict[str, Any] | None = Field(default=None, description="Its few-shot protocol (shots, "
                                           "splits, seed), if it is one.")
    experiment_ids: list[int]
    member_groups: list[list[int]] | None = Field(
        default=None, description=MEMBER_GROUPS + " Null for a sweep made before groups were kept.")
