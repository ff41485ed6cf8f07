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
        context.configure(connection=connection, target_metadata=target_metadata,
                          render_as_batch=url.startswith("sqlite"), compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
