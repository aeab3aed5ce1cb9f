"""Alembic migrations: no drift from the models, reversible, runnable from anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from observer.store.migrate import (
    MIGRATIONS_DIR,
    compare_server_default,
    downgrade,
    include_name,
    include_object,
    upgrade,
)
from observer.store.models import Base

REPO = Path(__file__).resolve().parents[2]
TABLES = {
    "alembic_version",
    "alerts",
    "exchanges",
    "exchange_blocks",
    "exchange_tool_calls",
    "exchange_violations",
    "gaps",
    "store_meta",
    "checkpoints",
    "store_events",
    "holds",
    "hold_records",
    "purged_runs",
    "api_tokens",
    "key_owners",
    "access_log",
    "incidents",
    "incident_notes",
    "incident_exchanges",
}


def _drift(url: str) -> list[object]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "compare_server_default": compare_server_default,
                    "target_metadata": Base.metadata,
                    "include_name": include_name,
                    "include_object": include_object,
                },
            )
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return {t for t in sa.inspect(engine).get_table_names() if include_name(t, "table", {})}
    finally:
        engine.dispose()


def test_no_drift_between_models_and_migrations(migrated_url: str) -> None:
    """After ``upgrade head`` autogenerate finds nothing to change (``alembic check``)."""
    assert _drift(migrated_url) == []


def test_the_sqlite_only_day_index_is_made_there_alone(migrated_url: str) -> None:
    """``ix_exchanges_day`` (an expression index the comparison above cannot see) exists after
    ``upgrade head`` on SQLite, with its expression, and not on PostgreSQL; a downgrade to 0006
    removes it."""
    engine = sa.create_engine(migrated_url)
    sqlite = engine.dialect.name == "sqlite"
    made = (
        "SELECT sql FROM sqlite_master WHERE name = :n"
        if sqlite
        else "SELECT indexdef FROM pg_indexes WHERE indexname = :n AND schemaname = current_schema()"
    )

    def index(name: str) -> str | None:
        with engine.connect() as conn:
            return conn.execute(sa.text(made), {"n": name}).scalar()

    try:
        assert index("ix_exchanges_day") == (
            "CREATE INDEX ix_exchanges_day ON exchanges"
            " (substr(started_at, 1, 10), input_tokens, output_tokens, usage_reported)"
            if sqlite
            else None
        )
        assert index("ix_exchanges_outcome_model_started_at_id") is not None
        downgrade(migrated_url, "0006")
        assert index("ix_exchanges_day") is None
        assert index("ix_exchanges_outcome_model_started_at_id") is None
    finally:
        engine.dispose()


def test_drift_check_sees_a_difference(db_url: str) -> None:
    """Control: on an empty database the comparison reports the missing tables."""
    diffs = _drift(db_url)
    assert {d[1].name for d in diffs if isinstance(d, tuple) and d[0] == "add_table"} == TABLES - {"alembic_version"}


def test_downgrade_and_upgrade_again(migrated_url: str) -> None:
    """The initial revision is reversible."""
    assert _tables(migrated_url) == TABLES
    downgrade(migrated_url, "base")
    assert _tables(migrated_url) == {"alembic_version"}
    upgrade(migrated_url)
    assert _tables(migrated_url) == TABLES
    assert _drift(migrated_url) == []


def test_upgrade_from_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The migrations are found relative to the package, whatever the current directory."""
    monkeypatch.chdir(tmp_path)
    assert MIGRATIONS_DIR == REPO / "migrations"
    upgrade("sqlite:///from-elsewhere.db")
    assert _tables(f"sqlite:///{tmp_path / 'from-elsewhere.db'}") == TABLES


def test_alembic_command_line_takes_the_url_from_x_argument(tmp_path: Path) -> None:
    """``alembic -x url=... upgrade head`` with the repository's alembic.ini (no URL in it)."""
    db = tmp_path / "cli.db"
    env = {k: v for k, v in os.environ.items() if k != "OBSERVER_DB"}
    subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini"), "-x", f"url=sqlite:///{db}"]
        + ["upgrade", "head"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert _tables(f"sqlite:///{db}") == TABLES
    assert "sqlalchemy.url" not in (REPO / "alembic.ini").read_text()


def test_alembic_check_is_clean(migrated_url: str, tmp_path: Path) -> None:
    """``alembic check`` (autogenerate finds nothing to do) on SQLite and PostgreSQL, as an
    operator runs it; control: on an empty database it fails."""
    env = {k: v for k, v in os.environ.items() if k != "OBSERVER_DB"}

    def check(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "alembic", "-c", str(REPO / "alembic.ini"), "-x", f"url={url}", "check"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = check(migrated_url)
    assert done.returncode == 0, done.stderr
    assert "No new upgrade operations detected" in done.stdout + done.stderr
    empty = check(f"sqlite:///{tmp_path / 'empty.db'}")
    assert empty.returncode != 0
