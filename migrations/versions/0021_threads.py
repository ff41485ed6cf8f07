"""experiments.threads: the torch threads a run trains on, fixed when it first starts (its
worker's share of the host then, or COREL_WORKER_TORCH_THREADS) and used again when it
resumes, so that its figures do not depend on the workers around it.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-01 20:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("threads", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("threads")
