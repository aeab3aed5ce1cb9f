"""Schema migrations of the audit store, run programmatically (``observer db upgrade``).

The Alembic scripts live in the repository's top-level ``migrations/`` folder, found relative to
this file (the project is installed in editable mode), so the current directory does not matter.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

from observer.errors import ConfigError

#: ``<repo>/migrations`` (this file is ``<repo>/observer/store/migrate.py``).
MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic ``Config`` for ``url`` without an ini file (so the application's logging
    configuration is left alone). Raises ``ConfigError`` when the migrations are not found."""
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise ConfigError(f"migrations not found at {MIGRATIONS_DIR} (is the project installed in editable mode?)")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    # Passed as an attribute, not a main option: configparser would interpolate "%" in passwords.
    config.attributes["url"] = url
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Brings the database at ``url`` to ``revision`` (``alembic upgrade head``). A SQLite
    file's folder is created first (trial finding: ``observer run --data-dir D --db
    sqlite:///D/x.db`` with a new D failed with "unable to open database file"). Raises
    SQLAlchemy's ``ArgumentError`` for an unparseable URL, ``OSError`` when the folder cannot be
    made."""
    _make_sqlite_folder(url)
    command.upgrade(alembic_config(url), revision)


def _make_sqlite_folder(url: str) -> None:
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:" and not path.startswith("file:"):
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def downgrade(url: str, revision: str) -> None:
    """Takes the database at ``url`` back to ``revision`` (``"base"`` drops every table)."""
    command.downgrade(alembic_config(url), revision)
