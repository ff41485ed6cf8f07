"""Alembic environment: the URL comes from corel's settings."""

from __future__ import annotations

from alembic import context

import app.core.models  # noqa: F401  (registers the tables)
from app.core.db import Base, make_engine
from app.core.settings import Settings

config = context.config
url = config.attributes.get("database_url") or Settings().db_url
target_metadata = Base.metadata


def run_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = make_engine(url)
    with engine.connect() as connection:
        if url.startswith("sqlite"):
            # A batch migration rebuilds a table (SQLite alters little in place): with foreign
            # keys on, dropping a table other tables reference fails. Off for the migration
            # (outside its transaction, where SQLite reads the pragma), checked after it.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=url.startswith("sqlite"), compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
        if url.startswith("sqlite"):
            broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            connection.commit()
            if broken:
                raise RuntimeError(f"the migration left rows whose foreign keys point at nothing: {broken[:5]}")
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
