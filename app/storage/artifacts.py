"""What rows name, read from the artifact store: an experiment's checkpoints and latent
spaces, arrays stored as raw bytes. The row (app.core.lookup) names the artifact, the store
holds its bytes (verified as they are read)."""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.core.lookup import best_checkpoint, latent_row
from app.storage import Artifact, read, store_of


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


def put_array(session: Session, array: np.ndarray) -> Artifact:
    """An array's raw bytes (C order) into the store."""
    return store_of(session).put_bytes(np.ascontiguousarray(array).tobytes())


def read_array(session: Session, digest: str, dtype: Any, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An array stored by :func:`put_array` (read-only, as ``np.frombuffer`` makes it)."""
    array = np.frombuffer(read(session, digest), dtype=dtype)
    return array.reshape(shape) if shape is not None else array


def load_latent(session: Session, experiment_id: int, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(representations n x dim float32, labels int64) of one stored split."""
    latent = latent_row(session, experiment_id, split)
    reps = read_array(session, latent.representations_sha256, np.float32, (latent.n, latent.dim))
    return reps, read_array(session, latent.labels_sha256, np.int64)
