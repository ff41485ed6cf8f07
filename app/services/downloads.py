"""What a succeeded experiment offers for download: its test latent space, its best
checkpoint, and the trained model exported as one file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from app.core.errors import InvalidInput
from app.core.lookup import best_checkpoint, succeeded_experiment
from app.core.models import DatasetUpload
from app.core.settings import Settings
from app.services.figures import latent_file
from app.storage import store_of
from app.storage.artifacts import best_checkpoint_bytes, class_names, load_latent
from app.storage.local_copies import files_for_model

if TYPE_CHECKING:
    from corel.export import Exported


def latent_space_file(session: Session, experiment_id: int, fmt: str) -> bytes:
    """The stored test representations with their labels (and class names, but in npy)."""
    succeeded_experiment(session, experiment_id, "the latent-space download")
    reps, labels = load_latent(session, experiment_id, "test")
    names = class_names(session, experiment_id) if fmt != "npy" else None
    return latent_file(reps, labels, fmt, names)


def checkpoint(session: Session, experiment_id: int) -> tuple[Path, str]:
    """The best-validation checkpoint as a local file to stream from (verified against its
    digest), and that digest."""
    succeeded_experiment(session, experiment_id, "the checkpoint download")
    digest: str = best_checkpoint(session, experiment_id)
    return store_of(session).local_path(digest), digest


def exported_model(session: Session, experiment_id: int, fmt: str, settings: Settings) -> Exported:
    """The encoder and head as one ONNX or TorchScript file, saying what it was trained on
    (for a run on a text encoder, a zip of that file and the tokenizer's files)."""
    exp = succeeded_experiment(session, experiment_id, "an export")
    blob = best_checkpoint_bytes(session, experiment_id)
    from corel.export import export_file
    from corel.train import checkpoint_from_bytes

    trained_on: dict[str, Any] | None = None
    if exp.dataset_id is not None:  # the user's upload, as they know it
        upload = session.get(DatasetUpload, exp.dataset_id)
        trained_on = {"dataset": "upload", "dataset_id": exp.dataset_id, "format": exp.dataset,
                      "filename": upload.filename if upload is not None else None}
    checkpoint = checkpoint_from_bytes(blob)
    encoder_files = files_for_model(session, settings, json.loads(checkpoint["preprocessing"]))
    try:
        return export_file(checkpoint, fmt, trained_on, encoder_files)
    except ValueError as exc:  # this model in this format: the library says why not
        raise InvalidInput(f"experiment {experiment_id}: {exc}") from exc
