"""A throw-away PostgreSQL database for the benchmarks that write PostgreSQL from several
processes (``scaleout.py``)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.engine import make_url


class PgDatabase:
    """A throw-away PostgreSQL database ``bench_<random>`` on the server of ``admin_url``,
    dropped by ``drop()`` (connections to it are terminated first)."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"bench_{uuid.uuid4().hex[:12]}"
        self._admin = sa.create_engine(
            admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
        )
        with self._admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{self.name}"'))
        self.url = make_url(admin_url).set(database=self.name).render_as_string(hide_password=False)

    def schema_url(self, schema: str) -> str:
        """The database URL with ``search_path`` set to a new schema ``schema``."""
        eng = sa.create_engine(self.url, poolclass=sa.NullPool)
        with eng.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        eng.dispose()
        return (
            make_url(self.url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )

    def drop(self) -> None:
        with self._admin.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :d AND pid <> pg_backend_pid()"
                ),
                {"d": self.name},
            )
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.name}"'))
        self._admin.dispose()
