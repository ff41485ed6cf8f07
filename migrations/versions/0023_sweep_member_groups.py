"""sweeps.member_groups: the members' ids by the stacked group they were queued and trained
in, so that the sweep's answer and page say which members trained together (issue 70).

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-03 09:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("member_groups", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("member_groups")
