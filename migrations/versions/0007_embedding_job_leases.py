"""embedding_jobs get the training runs' lease: worker, heartbeat_at, attempts, enqueued_at
and enqueues, so that a job is claimed once, taken over when its worker dies, and sent
again when the broker loses its message

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("embedding_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("attempts", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("enqueued_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("enqueues", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("embedding_jobs", schema=None) as batch_op:
        batch_op.drop_column("enqueues")
        batch_op.drop_column("enqueued_at")
        batch_op.drop_column("attempts")
        batch_op.drop_column("heartbeat_at")
        batch_op.drop_column("worker")
