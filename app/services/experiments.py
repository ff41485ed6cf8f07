"""Experiment use cases. Services only flush; the session scope commits."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.access import policy
from app.core.errors import Conflict, InvalidInput
from app.core.lookup import get_or_404, page_of
from app.core.models import EpochMetric, Experiment, Status, utcnow
from app.core.schemas.experiments import ExperimentCreate
from app.jobs import lifecycle
from app.services.datasets import referenced_upload
from app.services.encoders import check_spec_encoder, referenced_encoder
from app.services.models import versions_of_experiment
from app.storage import release_after_commit
from app.storage.refs import of_experiment
from corel.spec import ExperimentSpec


def get_experiment(session: Session, experiment_id: int) -> Experiment:
    return get_or_404(session, Experiment, experiment_id, "experiment")


def create_experiment(session: Session, body: ExperimentCreate) -> Experiment:
    if body.dataset_id is not None:
        upload = referenced_upload(session, body.dataset_id)
        if upload.kind != body.dataset:
            raise InvalidInput(
                f"dataset_id {body.dataset_id} is a {upload.kind!r} upload but the spec's dataset "
                f"is {body.dataset!r}"
            )
        if upload.summary.get("split_column") and (body.val_fraction or body.test_fraction):
            raise InvalidInput(
                f"dataset_id {body.dataset_id} names its own splits (column "
                f"{upload.summary['split_column']!r}); leave val_fraction and test_fraction unset"
            )
    spec = body.to_spec()
    if body.dataset_id is not None:
        _check_rows(body.dataset_id, upload.summary, spec)
    stored = spec.model_dump(mode="json", exclude={"dataset_path", "word_vectors", "encoder_path"})
    if body.encoder_id is not None:
        row = referenced_encoder(session, body.encoder_id)
        name = check_spec_encoder(row, spec.modality, spec.dataset, body.encoder, spec.trainable_blocks)
        spec = spec.model_copy(update={"encoder": name})
        stored = {**stored, "encoder": name, "encoder_id": body.encoder_id}
    now = utcnow()
    exp = Experiment(
        status=Status.QUEUED,
        spec=stored,
        dataset=spec.dataset,
        loss=spec.loss,
        dataset_id=body.dataset_id,
        epochs_total=spec.epochs,
        current_epoch=0,
        train_seconds=0.0,
        cancel_requested=False,
        attempts=0,
        created_at=now,
        # The route sends its task right after the commit.
        enqueued_at=now,
        enqueues=1,
    )
    session.add(exp)
    session.flush()
    return exp


def _upload_training_rows(summary: dict[str, Any], spec: ExperimentSpec) -> int | None:
    """How many training rows an upload's split gives a run, before ``train_subset`` (None
    for a summary that does not say)."""
    from corel.data.splits import training_rows

    if summary.get("split_counts"):
        return int(summary["split_counts"].get("train", 0))
    if "n" in summary and "num_classes" in summary:
        return training_rows(int(summary["n"]), int(summary["num_classes"]), spec.val_fraction,
                             spec.test_fraction)
    return None


def _check_rows(dataset_id: int, summary: dict[str, Any], spec: ExperimentSpec) -> None:
    """A 422 when ``train_subset`` asks for more training rows than the upload's split
    holds, or a fine-tuned run would have fewer training rows than one batch."""
    rows = _upload_training_rows(summary, spec)
    if rows is None:
        return
    if spec.train_subset is not None and spec.train_subset > rows:
        raise InvalidInput(f"train_subset is {spec.train_subset}, but dataset_id {dataset_id}'s "
                           f"training split holds {rows} rows; ask for at most {rows}, or leave "
                           "train_subset unset to train on all of them")
    rows = rows if spec.train_subset is None else spec.train_subset
    if spec.fine_tunes and rows < spec.batch_size:
        raise InvalidInput(f"fine-tuning needs at least one full batch of training rows: this dataset "
                           f"gives {rows} training rows, batch_size is {spec.batch_size}; lower batch_size "
                           f"to at most {rows}")


def list_experiments(
    session: Session,
    *,
    status: str | None,
    dataset: str | None,
    loss: str | None,
    limit: int,
    offset: int,
    sweep_id: int | None = None,
) -> tuple[list[Experiment], int]:
    query = select(Experiment).where(policy.readable(policy.principal_of(session), Experiment))
    if sweep_id is not None:
        query = query.where(Experiment.sweep_id == sweep_id)
    if status:
        query = query.where(Experiment.status == status)
    if dataset:
        query = query.where(Experiment.dataset == dataset)
    if loss:
        query = query.where(Experiment.loss == loss)
    return page_of(session, query.order_by(Experiment.id.desc()), limit, offset)


def get_metrics(session: Session, experiment_id: int) -> list[EpochMetric]:
    get_experiment(session, experiment_id)
    rows = session.scalars(
        select(EpochMetric).where(EpochMetric.experiment_id == experiment_id).order_by(EpochMetric.epoch)
    )
    return list(rows)


def cancel_experiment(session: Session, experiment_id: int) -> Experiment:
    """Queued: cancelled at once. Running: flagged; the worker stops between batches."""
    return lifecycle.cancel(session, get_experiment(session, experiment_id),
                            f"experiment {experiment_id}")


def delete_experiment(session: Session, experiment_id: int) -> None:
    exp = get_experiment(session, experiment_id)
    if exp.status in (Status.QUEUED, Status.RUNNING):
        raise Conflict(
            f"experiment {experiment_id} is {exp.status}; cancel it first (POST "
            f"/experiments/{experiment_id}/cancel), then delete it"
        )
    named = versions_of_experiment(session, experiment_id)
    if named:
        raise Conflict(f"experiment {experiment_id} answers for model version(s) {', '.join(named)}; "
                       "a model's versions keep their runs, so it cannot be deleted")
    # Its artifacts go once the delete has committed, those nothing else references.
    release_after_commit(session, of_experiment(session, experiment_id))
    session.execute(delete(Experiment).where(Experiment.id == experiment_id))
    session.flush()
