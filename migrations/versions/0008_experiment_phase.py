"""experiments get a phase (``preparing data`` while a worker downloads the dataset) and
a line saying how far it is

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.add_column(sa.Column("phase", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("phase_detail", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments", schema=None) as batch_op:
        batch_op.drop_column("phase_detail")
        batch_op.drop_column("phase")
