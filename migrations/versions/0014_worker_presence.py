"""worker_presence: the live workers and their hosts, so that the workers of one host
divide its cores among themselves

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 23:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "worker_presence",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=64), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("threads", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_worker_presence")),
    )
    with op.batch_alter_table("worker_presence", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_worker_presence_host"), ["host"], unique=False)
        batch_op.create_index(batch_op.f("ix_worker_presence_seen_at"), ["seen_at"], unique=False)


def downgrade() -> None:
    op.drop_table("worker_presence")
