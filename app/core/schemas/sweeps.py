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
