"""Apply Alembic migrations from code (embedded default start-up, `corel db upgrade`)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from app.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def alembic_config(settings: Settings) -> Config:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.attributes["database_url"] = settings.db_url
    cfg.attributes["settings"] = settings  # the artifact store of migrations that move bytes
    return cfg


def upgrade(settings: Settings, revision: str = "head") -> None:
    if settings.is_sqlite:
        settings.var_dir.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), revision)
    if settings.is_sqlite:
        incremental_vacuum_mode(settings)


def incremental_vacuum_mode(settings: Settings) -> None:
    """A SQLite file made before its pages were given back (auto_vacuum NONE) is rebuilt
    once in INCREMENTAL mode (a VACUUM: at start, before the service writes)."""
    import sqlite3

    from sqlalchemy.engine import make_url

    database = make_url(settings.db_url).database
    if not database or database == ":memory:":
        return
    conn = sqlite3.connect(database, isolation_level=None, timeout=30)
    try:
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("VACUUM")
    finally:
        conn.close()


def check(settings: Settings) -> None:
    command.check(alembic_config(settings))


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)
