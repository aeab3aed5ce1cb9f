"""Schema migrations of the audit store, run programmatically (``observer db upgrade``).

The Alembic scripts live in the repository's top-level ``migrations/`` folder, found relative to
this file (the project is installed in editable mode), so the current directory does not matter.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

from observer.errors import ConfigError
from observer.store import search
from observer.store.models import SQLITE_ONLY_INDEXES
from observer.store.partitions import is_partition

log = logging.getLogger("observer.store")

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


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's ``include_name`` hook: leaves the monthly partitions
    (``observer.store.partitions``) out of autogenerate's comparison (``alembic check``): they
    are made at run time, not declared in the models. So are the full-text search objects
    (``observer.store.search``), which SQLAlchemy cannot declare: the FTS5 table (SQLite) and the
    GIN index of the search column (PostgreSQL, an index SQLAlchemy cannot declare per engine)."""
    if type_ == "table" and name is not None:
        # ... and SQLite's FTS5 table with its shadow tables (observer.store.search).
        return not (is_partition(name) or name.startswith(search.FTS_TABLE))
    return not (type_ == "index" and name == search.SEARCH_INDEX_PG)


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Alembic's ``include_object`` hook: leaves out the foreign keys PostgreSQL keeps for each
    partition a partitioned foreign key references (reflected as keys to ``exchanges_pYYYY_MM``),
    and the SQLite-only expression indexes (``models.SQLITE_ONLY_INDEXES``: made on SQLite alone,
    which cannot reflect an expression index, so there is nothing to compare on either engine)."""
    if type_ == "index" and name in SQLITE_ONLY_INDEXES:
        return False
    if type_ == "foreign_key_constraint" and reflected:
        referred = getattr(obj, "referred_table", None)
        return not (referred is not None and is_partition(referred.name))
    return True


def compare_server_default(
    context: object,
    inspected_column: object,
    metadata_column: object,
    inspected_default: str | None,
    metadata_default: object,
    rendered_metadata_default: str | None,
) -> bool | None:
    """Alembic's ``compare_server_default`` hook: ``exchanges.stored_seq`` has its default (the
    transaction id) on PostgreSQL only, set by migration 0006 (``observer.store.stored``), which
    a model cannot declare per engine; every other column is compared as usual (``None``)."""
    table = getattr(getattr(metadata_column, "table", None), "name", None)
    if table == "exchanges" and getattr(metadata_column, "name", None) == "stored_seq":
        return False
    return None


def upgrade(url: str, revision: str = "head") -> None:
    """Brings the database at ``url`` to ``revision`` (``alembic upgrade head``). A SQLite
    file's folder is created first (trial finding: ``observer run --data-dir D --db
    sqlite:///D/x.db`` with a new D failed with "unable to open database file"). Raises
    SQLAlchemy's ``ArgumentError`` for an unparseable URL, ``OSError`` when the folder cannot be
    made."""
    prepare_sqlite_file(url)
    command.upgrade(alembic_config(url), revision)


def prepare_sqlite_file(url: str, *, make_folder: bool = True) -> None:
    """A SQLite URL's file made ahead, mode 0600 (``create_private_file``), and its folder
    (``make_folder``; else nothing is made when the folder is missing)."""
    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:" and not path.startswith("file:"):
        if make_folder:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        elif not Path(path).parent.is_dir():
            return
        create_private_file(Path(path))


def create_private_file(path: Path) -> None:
    """Creates ``path`` empty with mode 0600 unless it exists, so that SQLite, which gives its
    ``-wal`` and ``-shm`` files the mode of the database file, keeps every prompt readable by the
    owner only (SQLite would create it 0644 under the usual umask). An existing file keeps its
    mode; one readable by others is logged."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if path.stat().st_mode & 0o077:
            log.warning(
                "the audit store file %s is readable by other users (mode %o)", path, path.stat().st_mode & 0o777
            )
        return
    os.close(fd)


def downgrade(url: str, revision: str) -> None:
    """Takes the database at ``url`` back to ``revision`` (``"base"`` drops every table)."""
    command.downgrade(alembic_config(url), revision)
