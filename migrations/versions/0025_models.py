"""models and model_versions: models with names, their numbered versions (issue 72); the
shares table gains a fifth kind of row it may name.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("contract", sa.JSON(), nullable=True),
        sa.Column("eval_dataset_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("public", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(["eval_dataset_id"], ["datasets.id"],
                                name=op.f("fk_models_eval_dataset_id_datasets"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_models_owner_id"), ["owner_id"], unique=False)
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_model_versions_model_id_models"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["experiment_id"], ["experiments.id"],
                                name=op.f("fk_model_versions_experiment_id_experiments")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("model_id", "version", name=op.f("uq_model_versions_model_id")),
    )
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_versions_model_id"), ["model_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_model_versions_experiment_id"), ["experiment_id"], unique=False)
    with op.batch_alter_table("shares", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(batch_op.f("fk_shares_model_id_models"), "models",
                                    ["model_id"], ["id"], ondelete="CASCADE")
        batch_op.create_unique_constraint(batch_op.f("uq_shares_model_id"), ["model_id", "user_id"])


def downgrade() -> None:
    with op.batch_alter_table("shares", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_shares_model_id"), type_="unique")
        batch_op.drop_constraint(batch_op.f("fk_shares_model_id_models"), type_="foreignkey")
        batch_op.drop_column("model_id")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_versions_experiment_id"))
        batch_op.drop_index(batch_op.f("ix_model_versions_model_id"))
    op.drop_table("model_versions")
    with op.batch_alter_table("models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_models_owner_id"))
    op.drop_table("models")
