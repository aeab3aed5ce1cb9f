"""Shared fixtures: database URLs for the store tests, on SQLite and on PostgreSQL.

``db_url`` is parametrised: ``sqlite`` (a file in ``tmp_path``) and ``postgres`` (a fresh schema
per test on the server at ``OBSERVER_TEST_PG_URL``, selected through ``search_path``, dropped
afterwards). Without a reachable PostgreSQL the postgres cases are skipped, or fail when ``CI``
is set.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from observer.records import Exchange
from observer.store.migrate import upgrade
from observer.store.store import AuditStore

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _pg_admin_engine() -> sa.Engine:
    url = os.environ.get("OBSERVER_TEST_PG_URL", DEFAULT_PG_URL)
    engine = sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        engine.dispose()
        message = f"PostgreSQL unreachable at {make_url(url).render_as_string(hide_password=True)}: {exc.orig}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return engine


@contextmanager
def _pg_schema_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL schema (selected through ``search_path``), dropped afterwards."""
    admin = _pg_admin_engine()
    schema = f"test_{uuid.uuid4().hex[:16]}"
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(admin.url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text("SET LOCAL lock_timeout = '10s'"))
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database (no tables) as a SQLAlchemy URL string."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'audit.db'}"
        return
    with _pg_schema_url() as url:
        yield url


@pytest.fixture
def pg_migrated_url() -> Iterator[str]:
    """A PostgreSQL schema brought to the latest migration."""
    with _pg_schema_url() as url:
        upgrade(url)
        yield url


@pytest.fixture
def migrated_url(db_url: str) -> str:
    """``db_url`` brought to the latest migration."""
    upgrade(db_url)
    return db_url


@pytest.fixture
def store(migrated_url: str) -> Iterator[AuditStore]:
    """An ``AuditStore`` on a migrated, empty database."""
    audit_store = AuditStore(migrated_url)
    try:
        yield audit_store
    finally:
        audit_store.dispose()


def minimal_exchange(id: str, started_at: datetime, **fields: object) -> Exchange:  # noqa: A002
    """A small completed chat exchange; ``fields`` override any attribute."""
    values: dict[str, object] = {
        "dialect": "openai-chat",
        "host": "api.openai.com",
        "path": "/v1/chat/completions",
        "method": "POST",
        "http_version": "HTTP/1.1",
        "status_code": 200,
        "outcome": "completed",
    }
    values.update(fields)
    return Exchange(id=id, started_at=started_at, **values)  # type: ignore[arg-type]


@pytest.fixture
def make_exchange() -> Callable[..., Exchange]:
    """Factory of small exchanges: ``make_exchange(id, started_at, **overrides)``."""
    return minimal_exchange
