"""experiments record the device and the precision they trained in

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 21:15:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("device", sa.String(length=120), nullable=True))
        batch_op.add_column(sa.Column("precision", sa.String(length=8), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_column("precision")
        batch_op.drop_column("device")
