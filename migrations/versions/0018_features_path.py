"""experiments.features: the CPU path a frozen encoder's features were computed on (fp32,
bf16 or int8), what the run asked for, and the parity gate's figures.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("features", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("features")
