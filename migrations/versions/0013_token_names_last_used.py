"""API tokens get a name (what their user calls them) and when they were last used

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 22:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain added columns: SQLite takes them without rebuilding the table.
    op.add_column("api_tokens", sa.Column("name", sa.String(length=64), nullable=True))
    op.add_column("api_tokens", sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens", schema=None) as batch_op:
        batch_op.drop_column("last_used_at")
        batch_op.drop_column("name")
