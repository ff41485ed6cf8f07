"""The status of every job, in a module of its own: the CLI's client commands read it
without importing the ORM (app.core.models re-exports it)."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """The status of every kind of job (a training run, a member of a stacked group, a batch
    embedding job, an index build), as the rows store it and the API shows it: the enum's
    members are the strings themselves ("queued" == Status.QUEUED)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # A member of a sweep that pruned it at a rung (corel.train.pruning): it keeps its
    # history up to the rung and its best checkpoint, which serves.
    PRUNED = "pruned"
