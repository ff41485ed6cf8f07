"""latent_spaces.rows_sha256: the positions of a split's rows in the file they were read
from (an int64 artifact), so that a nearest neighbour is named by its id, text or image.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-29 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("latent_spaces") as batch:
        batch.add_column(sa.Column("rows_sha256", sa.String(64), nullable=True))
        batch.create_index("ix_latent_spaces_rows_sha256", ["rows_sha256"])


def downgrade() -> None:
    with op.batch_alter_table("latent_spaces") as batch:
        batch.drop_index("ix_latent_spaces_rows_sha256")
        batch.drop_column("rows_sha256")
