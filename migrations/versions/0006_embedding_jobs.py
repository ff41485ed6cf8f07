"""embedding_jobs and embedding_results: batch embedding of an uploaded dataset on a worker

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 07:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "embedding_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("n_total", sa.Integer(), nullable=False),
        sa.Column("n_done", sa.Integer(), nullable=False),
        sa.Column("dim", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"],
                                name=op.f("fk_embedding_jobs_dataset_id_datasets"), ondelete="RESTRICT"),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"],
                                name=op.f("fk_embedding_jobs_experiment_id_experiments"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_embedding_jobs")),
    )
    with op.batch_alter_table("embedding_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_embedding_jobs_dataset_id"), ["dataset_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_embedding_jobs_experiment_id"), ["experiment_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_embedding_jobs_status"), ["status"], unique=False)
    op.create_table(
        "embedding_results",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("representations", sa.LargeBinary(), nullable=False),
        sa.Column("labels", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["embedding_jobs.id"],
                                name=op.f("fk_embedding_results_job_id_embedding_jobs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_embedding_results")),
    )


def downgrade() -> None:
    op.drop_table("embedding_results")
    with op.batch_alter_table("embedding_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_embedding_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_embedding_jobs_experiment_id"))
        batch_op.drop_index(batch_op.f("ix_embedding_jobs_dataset_id"))
    op.drop_table("embedding_jobs")
