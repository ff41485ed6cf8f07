"""ORM rows. Blobs (checkpoints, latent spaces, uploads) live in their own tables so
that listing experiments never loads them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.core.db import Base
from app.core.status import Status
from corel.geometry import Geometry

STATUSES: tuple[Status, ...] = tuple(Status)
FINISHED: tuple[Status, ...] = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED, Status.PRUNED)
ACTIVE: tuple[Status, ...] = (Status.QUEUED, Status.RUNNING)


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """A timestamp read back from the database, with its offset. SQLite (the embedded
    default) keeps none, and every timestamp is written in UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


class DatasetUpload(Base):
    __tablename__ = "datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "npz" | "ag-news"
    filename: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Who created it (app.access.policy): None when created with no users (open mode)
    # or by the bootstrap admin (COREL_API_TOKEN). A plain indexed column, not a foreign
    # key: adding one would rebuild the table on SQLite, and users are never deleted.
    owner_id: Mapped[int | None] = mapped_column(Integer, index=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The owner as the read schemas show it: a read-only join on owner_id (no foreign key).
    owner: Mapped[User | None] = relationship(
        primaryjoin="foreign(DatasetUpload.owner_id) == User.id", viewonly=True)
    # The stored file (an artifact: app/storage): the upload as sent, or the .npz a table
    # or an image folder became. ``sha256`` above is the file the user sent.
    blob_sha256: Mapped[str] = mapped_column(String(64), index=True)


class EncoderUpload(Base):
    """A user's own encoder (POST /encoders): a sentence-transformers folder (zipped) or a
    weights file for a timm architecture, checked on arrival. Its file is an artifact
    (app/storage), its ``sha256``: stored once however many uploads name it."""

    __tablename__ = "encoders"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))  # "sentence-transformers" | "timm"
    modality: Mapped[str] = mapped_column(String(16))
    architecture: Mapped[str | None] = mapped_column(String(128))  # timm's name; None for a folder
    features: Mapped[int] = mapped_column(Integer)
    filename: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    # The encoder's content digest as runs record it (corel.encoders.files): the weights file's
    # sha256, or that of the sentence-transformers folder's files.
    digest: Mapped[str] = mapped_column(String(64), index=True)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    owner_id: Mapped[int | None] = mapped_column(Integer, index=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    owner: Mapped[User | None] = relationship(
        primaryjoin="foreign(EncoderUpload.owner_id) == User.id", viewonly=True)

    @property
    def spec_name(self) -> str:
        """How a spec names it: ``sentence-transformers`` or ``timm:<architecture>``."""
        return f"timm:{self.architecture}" if self.kind == "timm" else self.kind


class Sweep(Base):
    """A grid of experiments over a base spec (losses x lambdas x seeds x ...)."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(primary_key=True)
    base: Mapped[dict[str, Any]] = mapped_column(JSON)
    grid: Mapped[dict[str, Any]] = mapped_column(JSON)
    lam_by_loss: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    size: Mapped[int] = mapped_column(Integer)
    vectorize: Mapped[bool] = mapped_column(Boolean, default=True)
    # Successive halving within each stacked group (corel.train.pruning.Prune's fields), or None.
    prune: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The members' ids by the group they were queued and trained in, together as one stacked
    # model (corel.train.grouping.group_specs); None for a sweep made before groups were kept.
    member_groups: Mapped[list[list[int]] | None] = mapped_column(JSON, nullable=True)
    # A few-shot sweep's protocol ({"shots": [...], "splits": S, "seed": s}); None for a grid.
    fewshot: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Who created it (app.access.policy): None when created with no users (open mode)
    # or by the bootstrap admin (COREL_API_TOKEN). A plain indexed column, not a foreign
    # key: adding one would rebuild the table on SQLite, and users are never deleted.
    owner_id: Mapped[int | None] = mapped_column(Integer, index=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The owner as the read schemas show it: a read-only join on owner_id (no foreign key).
    owner: Mapped[User | None] = relationship(
        primaryjoin="foreign(Sweep.owner_id) == User.id", viewonly=True)


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(primary_key=True)
    sweep_id: Mapped[int | None] = mapped_column(
        ForeignKey("sweeps.id", ondelete="CASCADE"), index=True
    )
    status: Mapped[str] = mapped_column(String(16), index=True, default=Status.QUEUED.value)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    dataset: Mapped[str] = mapped_column(String(32), index=True)
    loss: Mapped[str] = mapped_column(String(16), index=True)
    dataset_id: Mapped[int | None] = mapped_column(
        ForeignKey("datasets.id", ondelete="RESTRICT"), index=True
    )
    epochs_total: Mapped[int] = mapped_column(Integer)
    current_epoch: Mapped[int] = mapped_column(Integer, default=0)
    best_epoch: Mapped[int | None] = mapped_column(Integer)
    best_val_accuracy: Mapped[float | None] = mapped_column(Float)
    test_accuracy: Mapped[float | None] = mapped_column(Float)
    train_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    # While running, before the first epoch: "preparing data" while a worker downloads
    # the dataset, with how far it is in phase_detail; None otherwise.
    phase: Mapped[str | None] = mapped_column(String(32))
    phase_detail: Mapped[str | None] = mapped_column(String(300))
    # What the worker trained on and in, from its first epoch: "cpu" or "cuda:0 (NVIDIA
    # H200)"; "fp32" or "bf16" (the spec's, where the device can).
    device: Mapped[str | None] = mapped_column(String(120))
    # The torch threads it trains on: fixed when it first starts (its worker's share of the
    # host then), used again when it resumes (worker/runner.py).
    threads: Mapped[int | None] = mapped_column(Integer)
    precision: Mapped[str | None] = mapped_column(String(8))
    # A frozen pretrained encoder's features, from the first epoch: the CPU path they were
    # computed on, what the spec asked and the parity gate's figures (corel.encoders.precision).
    features: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # A pruned member (status pruned): {"rung", "reason", "metrics"}.
    pruned: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When a task for this row was last sent, and how many times: the reconciler sends
    # a queued row again when its last send is older than a delay that doubles each time.
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    enqueues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Who created it (app.access.policy): None when created with no users (open mode)
    # or by the bootstrap admin (COREL_API_TOKEN). A plain indexed column, not a foreign
    # key: adding one would rebuild the table on SQLite, and users are never deleted.
    owner_id: Mapped[int | None] = mapped_column(Integer, index=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # The owner as the read schemas show it: a read-only join on owner_id (no foreign key).
    owner: Mapped[User | None] = relationship(
        primaryjoin="foreign(Experiment.owner_id) == User.id", viewonly=True)


class EpochMetric(Base):
    __tablename__ = "epoch_metrics"
    __table_args__ = (UniqueConstraint("experiment_id", "epoch"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    epoch: Mapped[int] = mapped_column(Integer)
    train_loss: Mapped[float] = mapped_column(Float)
    train_accuracy: Mapped[float] = mapped_column(Float)
    val_accuracy: Mapped[float] = mapped_column(Float)
    test_accuracy: Mapped[float | None] = mapped_column(Float)
    is_best: Mapped[bool] = mapped_column(Boolean)
    seconds: Mapped[float] = mapped_column(Float)


class Checkpoint(Base):
    """``resume``: the latest epoch's full training state; ``best``: the serving checkpoint.
    Its bytes are the artifact ``sha256`` in the artifact store (app/storage), written
    before this row is committed."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("experiment_id", "kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(16))
    epoch: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LatentSpace(Base):
    """Representations (float32, row-major n x dim) and labels (int64) of one split: two
    artifacts (app/storage), their raw bytes."""

    __tablename__ = "latent_spaces"
    __table_args__ = (UniqueConstraint("experiment_id", "split"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    split: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(Integer)
    dim: Mapped[int] = mapped_column(Integer)
    representations_sha256: Mapped[str] = mapped_column(String(64), index=True)
    labels_sha256: Mapped[str] = mapped_column(String(64), index=True)
    # The rows' positions in the file the split was read from (int64; corel's Dataset.rows):
    # a nearest neighbour's id. Null for runs stored before they were kept.
    rows_sha256: Mapped[str | None] = mapped_column(String(64), index=True, nullable=True)


class RetrievalResult(Base):
    """Retrieval metrics of a succeeded experiment (its test split against its training
    split), in one geometry: computed once from the stored latent spaces, then read."""

    __tablename__ = "retrieval_results"
    __table_args__ = (UniqueConstraint("experiment_id", "geometry"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    geometry: Mapped[Geometry] = mapped_column(String(16))
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ClusteringResult(Base):
    """A clustering report of one latent space, computed once and then read."""

    __tablename__ = "clustering_results"
    __table_args__ = (UniqueConstraint("experiment_id", "split", "metric", "algorithm"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    split: Mapped[str] = mapped_column(String(16))
    metric: Mapped[Geometry] = mapped_column(String(16))
    algorithm: Mapped[str] = mapped_column(String(16))
    result: Mapped[dict[str, Any]] = mapped_column(JSON)
    seconds: Mapped[float] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class FeatureSet(Base):
    """A frozen encoder's work on a dataset, kept for every host (issue 70): a split's
    features (``.npy``) or the parity gate's verdict (``.json``), by the name corel gives it
    (:mod:`corel.encoders.kept`: the encoder's digest, the computing path, the inputs'
    digest), its bytes an artifact. A run on any host reads it rather than computing it;
    ``corel gc`` drops one unused for ``COREL_FEATURES_KEEP_DAYS``, and its artifact with it."""

    __tablename__ = "feature_sets"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)  # the bytes, an artifact
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    used_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)


class Figure(Base):
    """A rendered picture (PNG) of an experiment, cached by name."""

    __tablename__ = "figures"
    __table_args__ = (UniqueConstraint("experiment_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64), index=True)  # the PNG, an artifact
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class LeasedJob:
    """The columns of a job that a worker runs from a message (a batch embedding job, an
    index build): its status and error, a cancel flag, the lease (``worker``,
    ``heartbeat_at``, ``attempts``) and the send record (``enqueued_at``, ``enqueues``),
    as an experiment has them (see there)."""

    status: Mapped[str] = mapped_column(String(16), index=True, default=Status.QUEUED.value)
    error: Mapped[str | None] = mapped_column(Text)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worker: Mapped[str | None] = mapped_column(String(255))
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    enqueues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Who created the job (app.access.policy): None when created with no users (open mode)
    # or by the bootstrap admin (COREL_API_TOKEN). A plain indexed column, not a foreign
    # key: adding one would rebuild the table on SQLite, and users are never deleted.
    owner_id: Mapped[int | None] = mapped_column(Integer, index=True)


class EmbeddingJob(LeasedJob, Base):
    """Every row of an uploaded dataset embedded by a trained experiment, on a worker."""

    __tablename__ = "embedding_jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"), index=True)
    n_total: Mapped[int] = mapped_column(Integer, default=0)
    n_done: Mapped[int] = mapped_column(Integer, default=0)
    dim: Mapped[int | None] = mapped_column(Integer)


class EmbeddingResult(Base):
    """A finished job's representations (float32, row-major n x dim) and labels (int64):
    two artifacts (app/storage)."""

    __tablename__ = "embedding_results"

    job_id: Mapped[int] = mapped_column(
        ForeignKey("embedding_jobs.id", ondelete="CASCADE"), primary_key=True
    )
    representations_sha256: Mapped[str] = mapped_column(String(64), index=True)
    labels_sha256: Mapped[str] = mapped_column(String(64), index=True)


class NeighborIndex(LeasedJob, Base):
    """A nearest-neighbour index over an experiment's training split or a batch
    embedding job's rows, built on a worker with the same lease as a training run; its file
    (``corel.index.VectorIndex.to_bytes``) is the artifact ``sha256`` (app/storage), which
    any API process can load."""

    __tablename__ = "neighbor_indexes"

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"), index=True
    )
    source: Mapped[str] = mapped_column(String(16))  # "train" | "embedding_job"
    embedding_job_id: Mapped[int | None] = mapped_column(
        ForeignKey("embedding_jobs.id", ondelete="CASCADE"), index=True
    )
    requested_kind: Mapped[str] = mapped_column(String(8))  # "auto" | "exact" | "hnsw"
    kind: Mapped[str | None] = mapped_column(String(8))  # decided when built
    geometry: Mapped[Geometry] = mapped_column(String(16))
    n_total: Mapped[int] = mapped_column(Integer, default=0)
    n_done: Mapped[int] = mapped_column(Integer, default=0)
    dim: Mapped[int | None] = mapped_column(Integer)
    size_bytes: Mapped[int | None] = mapped_column(BigInteger)
    build_seconds: Mapped[float | None] = mapped_column(Float)
    ef_search: Mapped[int | None] = mapped_column(Integer)
    recall: Mapped[float | None] = mapped_column(Float)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    sha256: Mapped[str | None] = mapped_column(String(64), index=True)  # set when built


# --- models with names: versions (app/services/models.py) ---

class RegisteredModel(Base):
    """A model with a name (POST /models): numbered versions, each a servable run. Version
    1 fixes its ``contract`` (the inputs it takes and its class names), which every later
    version must keep."""

    __tablename__ = "models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str | None] = mapped_column(Text)
    contract: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # set by version 1
    eval_dataset_id: Mapped[int | None] = mapped_column(
        ForeignKey("datasets.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    owner_id: Mapped[int | None] = mapped_column(Integer, index=True)
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    owner: Mapped[User | None] = relationship(
        primaryjoin="foreign(RegisteredModel.owner_id) == User.id", viewonly=True)


class ModelVersion(Base):
    """Version ``version`` of a model: the run that answers for it."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    # A run that is a version cannot be deleted (app/services/experiments.py says which).
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    created_by: Mapped[int | None] = mapped_column(Integer)  # the user who added it


class ModelAlias(Base):
    """An alias of a model (``news@production``) and the version it names now. It moves only
    by a promotion (app/services/promotions.py, worker/promotion.py); a ``protected`` one
    only by the model's owner or an admin."""

    __tablename__ = "model_aliases"
    __table_args__ = (UniqueConstraint("model_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    protected: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Promotion(LeasedJob, Base):
    """A request to point a model's alias at a version: gated on a worker, then flipped in
    one transaction if the alias still names ``expected_version``. The job's ``status`` is
    the lease's (queued, running, succeeded, failed); ``phase`` where it is while it runs
    (gating, embedding), ``outcome`` its verdict: succeeded, refused (the gate said no) or
    conflict (the alias moved meanwhile)."""

    __tablename__ = "promotions"

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    alias: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    expected_version: Mapped[int | None] = mapped_column(Integer)
    force: Mapped[bool] = mapped_column(Boolean, default=False)
    protect: Mapped[bool | None] = mapped_column(Boolean)  # mark the alias protected (or not) at the flip
    margin: Mapped[float] = mapped_column(Float)
    phase: Mapped[str | None] = mapped_column(String(16))
    outcome: Mapped[str | None] = mapped_column(String(16))
    report: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class ModelCollection(Base):
    """A dataset a model keeps embedded and indexed by each aliased version (POST
    /models/{name}/collections): its builds (:class:`CollectionBuild`) are per version, so
    an alias and the index it searches move together."""

    __tablename__ = "model_collections"
    __table_args__ = (UniqueConstraint("model_id", "dataset_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="RESTRICT"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CollectionBuild(LeasedJob, Base):
    """A collection embedded by one version's run (a batch embedding job) and indexed (an
    index of that job's rows), on a worker; a promotion runs its candidate's before the flip."""

    __tablename__ = "collection_builds"
    __table_args__ = (UniqueConstraint("collection_id", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    collection_id: Mapped[int] = mapped_column(
        ForeignKey("model_collections.id", ondelete="CASCADE"), index=True)
    version: Mapped[int] = mapped_column(Integer)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"), index=True)
    embedding_job_id: Mapped[int | None] = mapped_column(ForeignKey("embedding_jobs.id", ondelete="SET NULL"))
    index_id: Mapped[int | None] = mapped_column(ForeignKey("neighbor_indexes.id", ondelete="SET NULL"))


class AliasMove(Base):
    """One move of an alias: from which version to which, who asked, when, by which
    promotion, and its gate's summary."""

    __tablename__ = "alias_history"

    id: Mapped[int] = mapped_column(primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    alias: Mapped[str] = mapped_column(String(64))
    from_version: Mapped[int | None] = mapped_column(Integer)
    to_version: Mapped[int] = mapped_column(Integer)
    user_id: Mapped[int | None] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    promotion_id: Mapped[int | None] = mapped_column(ForeignKey("promotions.id", ondelete="SET NULL"))
    gate: Mapped[dict[str, Any] | None] = mapped_column(JSON)


# --- users, their tokens, sharing, and the audit log (app/access/tokens.py, app/access/policy.py) ---

class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiToken(Base):
    """A user's bearer token, stored only as the SHA-256 of the token (tokens are 256
    random bits: no salt or slow hash needed). Checked on every request, so revoking or
    expiring one takes effect on the next request in every API process."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scope: Mapped[str] = mapped_column(String(8))  # "read" | "write" | "admin"
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    name: Mapped[str | None] = mapped_column(String(64))
    # Written at most once a minute per token (app.access.tokens.lookup_token), not on every request.
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Share(Base):
    """One user's access ("read" or "write") to an experiment, a sweep, an upload, an
    uploaded encoder or a model: one of the five ids is set. Foreign keys with cascades, so that a deleted resource's
    shares go with it and never grant access to a later row with the same id."""

    __tablename__ = "shares"
    __table_args__ = (UniqueConstraint("experiment_id", "user_id"),
                      UniqueConstraint("sweep_id", "user_id"),
                      UniqueConstraint("dataset_id", "user_id"),
                      UniqueConstraint("encoder_id", "user_id"),
                      UniqueConstraint("model_id", "user_id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    experiment_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiments.id", ondelete="CASCADE"))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    encoder_id: Mapped[int | None] = mapped_column(ForeignKey("encoders.id", ondelete="CASCADE"))
    model_id: Mapped[int | None] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    access: Mapped[str] = mapped_column(String(8))  # "read" | "write"
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AuditEntry(Base):
    """One write through the API: who, when, what, which row, and how it ended. A write
    that succeeded is recorded in the write's own transaction, one that failed in a
    transaction of its own (app/access/audit.py)."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="SET NULL"), index=True)
    token_id: Mapped[int | None] = mapped_column(Integer)
    client: Mapped[str | None] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(160), index=True)  # "POST /experiments/{id}/cancel"
    resource: Mapped[str | None] = mapped_column(String(32), index=True)
    resource_id: Mapped[int | None] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))  # "ok" | "failed"
    status: Mapped[int | None] = mapped_column(Integer)
    detail: Mapped[str | None] = mapped_column(String(500))


class WorkerPresence(Base):
    """A live worker process, and the host it runs on (``host``: the kernel's boot id,
    the same in every container of one machine), written by the worker every few seconds
    (worker/tasks.py): the workers of one host divide its cores by counting each other
    here (app/jobs/workers.py). A row not written for a while is a worker gone."""

    __tablename__ = "worker_presence"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(64), index=True)
    cpus: Mapped[int] = mapped_column(Integer)
    threads: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
