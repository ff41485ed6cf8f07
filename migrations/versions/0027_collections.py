"""model_collections and collection_builds: datasets a model keeps embedded and indexed by
each aliased version (issue 72).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-04 06:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_collections",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_model_collections_model_id_models"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"],
                                name=op.f("fk_model_collections_dataset_id_datasets"), ondelete="RESTRICT"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_collections")),
        sa.UniqueConstraint("model_id", "dataset_id", name=op.f("uq_model_collections_model_id")),
    )
    with op.batch_alter_table("model_collections", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_collections_model_id"), ["model_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_model_collections_dataset_id"), ["dataset_id"], unique=False)
    op.create_table(
        "collection_builds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("collection_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("embedding_job_id", sa.Integer(), nullable=True),
        sa.Column("index_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("enqueues", sa.Integer(), server_default="0", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["collection_id"], ["model_collections.id"],
                                name=op.f("fk_collection_builds_collection_id_model_collections"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"],
                                name=op.f("fk_collection_builds_experiment_id_experiments")),
        sa.ForeignKeyConstraint(["embedding_job_id"], ["embedding_jobs.id"],
                                name=op.f("fk_collection_builds_embedding_job_id_embedding_jobs"),
                                ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["index_id"], ["neighbor_indexes.id"],
                                name=op.f("fk_collection_builds_index_id_neighbor_indexes"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_collection_builds")),
        sa.UniqueConstraint("collection_id", "version", name=op.f("uq_collection_builds_collection_id")),
    )
    with op.batch_alter_table("collection_builds", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_collection_builds_collection_id"), ["collection_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_collection_builds_experiment_id"), ["experiment_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_collection_builds_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_collection_builds_owner_id"), ["owner_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("collection_builds", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_collection_builds_owner_id"))
        batch_op.drop_index(batch_op.f("ix_collection_builds_status"))
        batch_op.drop_index(batch_op.f("ix_collection_builds_experiment_id"))
        batch_op.drop_index(batch_op.f("ix_collection_builds_collection_id"))
    op.drop_table("collection_builds")
    with op.batch_alter_table("model_collections", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_collections_dataset_id"))
        batch_op.drop_index(batch_op.f("ix_model_collections_model_id"))
    op.drop_table("model_collections")
