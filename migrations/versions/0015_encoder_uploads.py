"""encoders and encoder_blobs: a user's own encoders (POST /encoders), their files stored
once per content; shares may name an encoder

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 05:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "encoder_blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_encoder_blobs")),
    )
    op.create_table(
        "encoders",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("modality", sa.String(length=16), nullable=False),
        sa.Column("architecture", sa.String(length=128), nullable=True),
        sa.Column("features", sa.Integer(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("owner_id", sa.Integer(), nullable=True),
        sa.Column("public", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(["sha256"], ["encoder_blobs.sha256"],
                                name=op.f("fk_encoders_sha256_encoder_blobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_encoders")),
    )
    with op.batch_alter_table("encoders", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_encoders_digest"), ["digest"], unique=False)
        batch_op.create_index(batch_op.f("ix_encoders_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_encoders_sha256"), ["sha256"], unique=False)
    # The shares table gains a fourth kind of row it may name (rebuilt on SQLite: nothing
    # references it, so nothing cascades).
    with op.batch_alter_table("shares", schema=None) as batch_op:
        batch_op.add_column(sa.Column("encoder_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(batch_op.f("fk_shares_encoder_id_encoders"), "encoders",
                                    ["encoder_id"], ["id"], ondelete="CASCADE")
        batch_op.create_unique_constraint(batch_op.f("uq_shares_encoder_id"), ["encoder_id", "user_id"])


def downgrade() -> None:
    with op.batch_alter_table("shares", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_shares_encoder_id"), type_="unique")
        batch_op.drop_constraint(batch_op.f("fk_shares_encoder_id_encoders"), type_="foreignkey")
        batch_op.drop_column("encoder_id")
    with op.batch_alter_table("encoders", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_encoders_sha256"))
        batch_op.drop_index(batch_op.f("ix_encoders_owner_id"))
        batch_op.drop_index(batch_op.f("ix_encoders_digest"))
    op.drop_table("encoders")
    op.drop_table("encoder_blobs")
