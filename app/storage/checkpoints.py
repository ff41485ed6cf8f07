"""An experiment's stored checkpoints as the services read them: the row (app.core.lookup)
names the artifact, the store holds its bytes."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.core.lookup import best_checkpoint
from app.storage import read


def best_checkpoint_bytes(session: Session, experiment_id: int) -> bytes:
    """The best checkpoint's bytes (Conflict if there is none), verified."""
    return read(session, best_checkpoint(session, experiment_id))


def best_checkpoint_dict(session: Session, experiment_id: int) -> dict[str, Any]:
    """The best checkpoint, loaded (``corel.train.checkpoint_from_bytes``)."""
    from corel.train import checkpoint_from_bytes  # torch: not for the CLI's users commands

    return checkpoint_from_bytes(best_checkpoint_bytes(session, experiment_id))


def class_names(session: Session, experiment_id: int) -> list[str]:
    """The class names the experiment was trained with (its best checkpoint's)."""
    return [str(c) for c in best_checkpoint_dict(session, experiment_id)["class_names"]]
