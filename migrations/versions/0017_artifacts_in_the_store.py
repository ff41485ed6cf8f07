"""Every other artifact leaves its rows for the artifact store: uploads (dataset_blobs),
uploaded encoders' files (encoder_blobs), latent spaces, batch embedding results, figures
and index files (neighbor_index_chunks). The rows keep the digests. Down moves them back.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DIGEST = sa.String(length=64)
# (table, its key columns, [(bytes column, digest column)])
MOVED = (
    ("latent_spaces", ("id",), (("representations", "representations_sha256"),
                                ("labels", "labels_sha256"))),
    ("embedding_results", ("job_id",), (("representations", "representations_sha256"),
                                        ("labels", "labels_sha256"))),
    ("figures", ("id",), (("png", "sha256"),)),
)


def _store():  # type: ignore[no-untyped-def]
    from app.core.settings import Settings
    from app.storage import make_store

    settings = context.config.attributes.get("settings") or Settings()
    return make_store(settings)


def _rows(query: str, **params: object) -> list[sa.Row]:  # type: ignore[type-arg]
    return list(op.get_bind().execute(sa.text(query), params))


def upgrade() -> None:
    store = _store()
    conn = op.get_bind()
    # Columns that hold bytes -> the digests of their artifacts.
    for table, key, pairs in MOVED:
        with op.batch_alter_table(table) as batch:
            for _, digest in pairs:
                batch.add_column(sa.Column(digest, DIGEST, nullable=True))
        where = " AND ".join(f"{k} = :{k}" for k in key)
        for (row_key,) in _rows(f"SELECT {key[0]} FROM {table}"):
            for data_column, digest in pairs:
                (data,) = _rows(f"SELECT {data_column} FROM {table} WHERE {where}", **{key[0]: row_key})[0]
                art = store.put_bytes(bytes(data))
                conn.execute(sa.text(f"UPDATE {table} SET {digest} = :d WHERE {where}"),
                             {"d": art.sha256, key[0]: row_key})
        with op.batch_alter_table(table) as batch:
            for data_column, digest in pairs:
                batch.drop_column(data_column)
                batch.alter_column(digest, existing_type=DIGEST, nullable=False)
                batch.create_index(batch.f(f"ix_{table}_{digest}"), [digest], unique=False)

    # An upload's stored file (the .npz a table became, or the file as sent).
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(sa.Column("blob_sha256", DIGEST, nullable=True))
    for dataset_id, data in _rows("SELECT dataset_id, data FROM dataset_blobs"):
        art = store.put_bytes(bytes(data))
        conn.execute(sa.text("UPDATE datasets SET blob_sha256 = :d WHERE id = :id"),
                     {"d": art.sha256, "id": dataset_id})
    with op.batch_alter_table("datasets") as batch:
        batch.alter_column("blob_sha256", existing_type=DIGEST, nullable=False)
        batch.create_index(batch.f("ix_datasets_blob_sha256"), ["blob_sha256"], unique=False)
    op.drop_table("dataset_blobs")

    # An uploaded encoder's file: its sha256 already names it.
    for sha, data in _rows("SELECT sha256, data FROM encoder_blobs"):
        art = store.put_bytes(bytes(data))
        assert art.sha256 == sha, f"encoder_blobs row {sha} holds other bytes ({art.sha256})"
    with op.batch_alter_table("encoders") as batch:
        batch.drop_constraint(batch.f("fk_encoders_sha256_encoder_blobs"), type_="foreignkey")
    op.drop_table("encoder_blobs")

    # An index's file: its pieces, joined, one artifact.
    with op.batch_alter_table("neighbor_indexes") as batch:
        batch.add_column(sa.Column("sha256", DIGEST, nullable=True))
    for (index_id,) in _rows("SELECT DISTINCT index_id FROM neighbor_index_chunks"):
        pieces = _rows("SELECT data FROM neighbor_index_chunks WHERE index_id = :i ORDER BY seq",
                       i=index_id)
        art = store.put_stream(bytes(p[0]) for p in pieces)
        conn.execute(sa.text("UPDATE neighbor_indexes SET sha256 = :d WHERE id = :id"),
                     {"d": art.sha256, "id": index_id})
    with op.batch_alter_table("neighbor_indexes") as batch:
        batch.create_index(batch.f("ix_neighbor_indexes_sha256"), ["sha256"], unique=False)
    op.drop_table("neighbor_index_chunks")


def downgrade() -> None:
    store = _store()
    conn = op.get_bind()
    op.create_table(
        "neighbor_index_chunks",
        sa.Column("index_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["index_id"], ["neighbor_indexes.id"],
                                name=op.f("fk_neighbor_index_chunks_index_id_neighbor_indexes"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("index_id", "seq", name=op.f("pk_neighbor_index_chunks")),
    )
    chunk = 64 << 20
    for index_id, sha in _rows("SELECT id, sha256 FROM neighbor_indexes WHERE sha256 IS NOT NULL"):
        with store.open(sha) as f:
            seq = 0
            while piece := f.read(chunk):
                conn.execute(sa.text("INSERT INTO neighbor_index_chunks (index_id, seq, data) "
                                     "VALUES (:i, :s, :d)"), {"i": index_id, "s": seq, "d": piece})
                seq += 1
    with op.batch_alter_table("neighbor_indexes") as batch:
        batch.drop_index(batch.f("ix_neighbor_indexes_sha256"))
        batch.drop_column("sha256")

    op.create_table(
        "encoder_blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_encoder_blobs")),
    )
    for (sha,) in _rows("SELECT DISTINCT sha256 FROM encoders"):
        conn.execute(sa.text("INSERT INTO encoder_blobs (sha256, data) VALUES (:s, :d)"),
                     {"s": sha, "d": store.read_bytes(sha)})
    with op.batch_alter_table("encoders") as batch:
        batch.create_foreign_key(batch.f("fk_encoders_sha256_encoder_blobs"), "encoder_blobs",
                                 ["sha256"], ["sha256"])

    op.create_table(
        "dataset_blobs",
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"],
                                name=op.f("fk_dataset_blobs_dataset_id_datasets"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("dataset_id", name=op.f("pk_dataset_blobs")),
    )
    for dataset_id, sha in _rows("SELECT id, blob_sha256 FROM datasets"):
        conn.execute(sa.text("INSERT INTO dataset_blobs (dataset_id, data) VALUES (:i, :d)"),
                     {"i": dataset_id, "d": store.read_bytes(sha)})
    with op.batch_alter_table("datasets") as batch:
        batch.drop_index(batch.f("ix_datasets_blob_sha256"))
        batch.drop_column("blob_sha256")

    for table, key, pairs in MOVED:
        with op.batch_alter_table(table) as batch:
            for data_column, digest in pairs:
                batch.drop_index(batch.f(f"ix_{table}_{digest}"))
                batch.add_column(sa.Column(data_column, sa.LargeBinary(), nullable=True))
        where = f"{key[0]} = :k"
        for row in _rows(f"SELECT {key[0]}, {', '.join(d for _, d in pairs)} FROM {table}"):
            for (data_column, _), sha in zip(pairs, row[1:], strict=True):
                conn.execute(sa.text(f"UPDATE {table} SET {data_column} = :d WHERE {where}"),
                             {"d": store.read_bytes(sha), "k": row[0]})
        with op.batch_alter_table(table) as batch:
            for data_column, digest in pairs:
                batch.drop_column(digest)
                batch.alter_column(data_column, existing_type=sa.LargeBinary(), nullable=False)
