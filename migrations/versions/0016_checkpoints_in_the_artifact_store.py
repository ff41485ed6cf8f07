"""checkpoints: their bytes move into the artifact store (COREL_ARTIFACTS: a local folder
or S3); the row keeps the digest and size. Down moves them back into the rows.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _store():  # type: ignore[no-untyped-def]
    from app.core.settings import Settings
    from app.storage import make_store

    settings = context.config.attributes.get("settings") or Settings()
    return make_store(settings)


def upgrade() -> None:
    conn = op.get_bind()
    ids = [row[0] for row in conn.execute(sa.text("SELECT id FROM checkpoints ORDER BY id"))]
    if ids:
        store = _store()
        for checkpoint_id in ids:  # one row's bytes in memory at a time
            data = conn.execute(sa.text("SELECT data FROM checkpoints WHERE id = :id"),
                                {"id": checkpoint_id}).scalar_one()
            art = store.put_bytes(bytes(data))
            conn.execute(sa.text("UPDATE checkpoints SET sha256 = :sha, size = :size WHERE id = :id"),
                         {"sha": art.sha256, "size": art.size, "id": checkpoint_id})
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("data")
        batch.alter_column("size", existing_type=sa.Integer(), type_=sa.BigInteger(),
                           existing_nullable=False)
        batch.create_index(batch.f("ix_checkpoints_sha256"), ["sha256"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_index(batch.f("ix_checkpoints_sha256"))
        batch.alter_column("size", existing_type=sa.BigInteger(), type_=sa.Integer(),
                           existing_nullable=False)
        batch.add_column(sa.Column("data", sa.LargeBinary(), nullable=True))
    conn = op.get_bind()
    rows = list(conn.execute(sa.text("SELECT id, sha256 FROM checkpoints ORDER BY id")))
    if rows:
        store = _store()
        for checkpoint_id, sha256 in rows:
            conn.execute(sa.text("UPDATE checkpoints SET data = :data WHERE id = :id"),
                         {"data": store.read_bytes(sha256), "id": checkpoint_id})
    with op.batch_alter_table("checkpoints") as batch:
        batch.alter_column("data", existing_type=sa.LargeBinary(), nullable=False)
