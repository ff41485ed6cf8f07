"""sweeps.prune: a sweep's successive halving (metric, eta, min_epochs; corel.train.pruning);
experiments.pruned: a member's rung, the reason and its figures there, once pruned.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-29 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("prune", sa.JSON(), nullable=True))
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("pruned", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("pruned")
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("prune")
