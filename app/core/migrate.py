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
    return cfg


def upgrade(settings: Settings, revision: str = "head") -> None:
    if settings.is_sqlite:
        settings.var_dir.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(settings), revision)


def check(settings: Settings) -> None:
    command.check(alembic_config(settings))
