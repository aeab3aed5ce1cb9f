"""Alembic environment of the audit store.

The database URL comes from, in order: ``config.attributes["url"]`` (``observer.store.migrate``),
``alembic -x url=...``, the ``OBSERVER_DB`` environment variable. It is never read from
``alembic.ini``. A caller may instead hand over an open connection as
``config.attributes["connection"]``.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection, create_engine, pool
from sqlalchemy.engine import make_url

from observer.store.migrate import compare_server_default, include_name, include_object
from observer.store.models import Base

config = context.config

if config.config_file_name is not None:
    # Keep the application's loggers alive when migrations run inside it.
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = (
        config.attributes.get("url")
        or context.get_x_argument(as_dictionary=True).get("url")
        or os.environ.get("OBSERVER_DB")
    )
    if not url:
        raise RuntimeError(
            "no database URL: pass -x url=..., set OBSERVER_DB, or use observer.store.migrate.upgrade(url)"
        )
    return str(url)


def _configure(**kwargs: object) -> None:
    dialect_name = kwargs.pop("dialect_name")
    context.configure(
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: emit "move and copy" batch operations there.
        render_as_batch=dialect_name == "sqlite",
        compare_type=True,
        compare_server_default=compare_server_default,
        include_name=include_name,
        include_object=include_object,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    """Emits the SQL script (``alembic upgrade head --sql``) without connecting."""
    url = _url()
    _configure(
        dialect_name=make_url(url).get_backend_name(),
        url=url,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_online(connection: Connection) -> None:
    _configure(dialect_name=connection.dialect.name, connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Runs the migrations on the caller's connection or on a fresh one."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_online(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run_online(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
