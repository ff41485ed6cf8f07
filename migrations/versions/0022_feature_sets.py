"""feature_sets: a frozen encoder's features (and its path's verdict) kept in the artifact
store by their content's name, so that a run on any host reads them rather than computing
them again (issue 70).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03 09:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "feature_sets",
        sa.Column("name", sa.String(length=200), primary_key=True),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_feature_sets_sha256", "feature_sets", ["sha256"])
    op.create_index("ix_feature_sets_used_at", "feature_sets", ["used_at"])


def downgrade() -> None:
    op.drop_index("ix_feature_sets_used_at", table_name="feature_sets")
    op.drop_index("ix_feature_sets_sha256", table_name="feature_sets")
    op.drop_table("feature_sets")
