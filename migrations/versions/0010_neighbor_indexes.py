"""neighbor_indexes and neighbor_index_chunks: nearest-neighbour indexes built on a
worker (with a training run's lease) and stored in the database in pieces

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "neighbor_indexes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("embedding_job_id", sa.Integer(), nullable=True),
        sa.Column("requested_kind", sa.String(length=8), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=True),
        sa.Column("geometry", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n_total", sa.Integer(), nullable=False),
        sa.Column("n_done", sa.Integer(), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("build_seconds", sa.Float(), nullable=True),
        sa.Column("ef_search", sa.Integer(), nullable=True),
        sa.Column("recall", sa.Float(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=True),
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
        sa.ForeignKeyConstraint(["embedding_job_id"], ["embedding_jobs.id"],
                                name=op.f("fk_neighbor_indexes_embedding_job_id_embedding_jobs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"],
                                name=op.f("fk_neighbor_indexes_experiment_id_experiments"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_neighbor_indexes")),
    )
    with op.batch_alter_table("neighbor_indexes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_neighbor_indexes_embedding_job_id"), ["embedding_job_id"],
                              unique=False)
        batch_op.create_index(batch_op.f("ix_neighbor_indexes_experiment_id"), ["experiment_id"],
                              unique=False)
        batch_op.create_index(batch_op.f("ix_neighbor_indexes_status"), ["status"], unique=False)
    op.create_table(
        "neighbor_index_chunks",
        sa.Column("index_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["index_id"], ["neighbor_indexes.id"],
                                name=op.f("fk_neighbor_index_chunks_index_id_neighbor_indexes"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("index_id", "seq", name=op.f("pk_neighbor_index_chunks")),
    )


def downgrade() -> None:
    op.drop_table("neighbor_index_chunks")
    with op.batch_alter_table("neighbor_indexes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_neighbor_indexes_status"))
        batch_op.drop_index(batch_op.f("ix_neighbor_indexes_experiment_id"))
        batch_op.drop_index(batch_op.f("ix_neighbor_indexes_embedding_job_id"))
    op.drop_table("neighbor_indexes")
