"""retrieval_results: precision@1, R-precision and MAP@R of an experiment's test split
against its training split, once per geometry

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 13:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "retrieval_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("geometry", sa.String(length=16), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"],
                                name=op.f("fk_retrieval_results_experiment_id_experiments"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retrieval_results")),
        sa.UniqueConstraint("experiment_id", "geometry",
                            name=op.f("uq_retrieval_results_experiment_id")),
    )
    with op.batch_alter_table("retrieval_results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_retrieval_results_experiment_id"), ["experiment_id"],
                              unique=False)


def downgrade() -> None:
    with op.batch_alter_table("retrieval_results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_retrieval_results_experiment_id"))
    op.drop_table("retrieval_results")
