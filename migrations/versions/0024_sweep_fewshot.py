"""sweeps.fewshot: a few-shot sweep's protocol (shots, splits, seed), so that its report and
page group its members by N and draw (issue 71).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04 03:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("fewshot", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("fewshot")
