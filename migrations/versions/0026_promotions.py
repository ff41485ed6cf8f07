"""model_aliases, promotions and alias_history: a model's aliases, the jobs that move them
through a gate, and every move (issue 72).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04 06:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "model_aliases",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("protected", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_model_aliases_model_id_models"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_aliases")),
        sa.UniqueConstraint("model_id", "name", name=op.f("uq_model_aliases_model_id")),
    )
    with op.batch_alter_table("model_aliases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_aliases_model_id"), ["model_id"], unique=False)
    op.create_table(
        "promotions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("expected_version", sa.Integer(), nullable=True),
        sa.Column("force", sa.Boolean(), nullable=False),
        sa.Column("protect", sa.Boolean(), nullable=True),
        sa.Column("margin", sa.Float(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("report", sa.JSON(), nullable=True),
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
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_promotions_model_id_models"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_promotions")),
    )
    with op.batch_alter_table("promotions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_promotions_model_id"), ["model_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_promotions_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_promotions_owner_id"), ["owner_id"], unique=False)
    op.create_table(
        "alias_history",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("alias", sa.String(length=64), nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=True),
        sa.Column("to_version", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("promotion_id", sa.Integer(), nullable=True),
        sa.Column("gate", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"],
                                name=op.f("fk_alias_history_model_id_models"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["promotion_id"], ["promotions.id"],
                                name=op.f("fk_alias_history_promotion_id_promotions"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alias_history")),
    )
    with op.batch_alter_table("alias_history", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_alias_history_model_id"), ["model_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("alias_history", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_alias_history_model_id"))
    op.drop_table("alias_history")
    with op.batch_alter_table("promotions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_promotions_owner_id"))
        batch_op.drop_index(batch_op.f("ix_promotions_status"))
        batch_op.drop_index(batch_op.f("ix_promotions_model_id"))
    op.drop_table("promotions")
    with op.batch_alter_table("model_aliases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_aliases_model_id"))
    op.drop_table("model_aliases")
