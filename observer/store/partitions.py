"""Monthly range partitions of the exchange tables on PostgreSQL (SQLite has none).

``exchanges`` and its child tables (``exchange_blocks``, ``exchange_tool_calls``,
``exchange_violations``) are ``PARTITION BY RANGE`` on the record's start time, one partition
per calendar month in UTC, named ``<table>_pYYYY_MM`` and holding ``[first of the month, first
of the next)``. A record and its child rows are always in the same month, so a month past
retention goes with one ``DROP TABLE`` per table (``drop_month``) instead of a row-by-row delete.

Partitions are made ahead and on demand (``Partitions.ensure``): the writer makes the months of
every batch it stores, plus the current and the next month, before it inserts (a row outside
every partition would be refused), remembering the months it made; ``observer db upgrade`` makes
the months of the rows already stored and the next ones. There is no default partition: one
holding rows would stop the month they belong to from being made later. Several writers making
one month at once is harmless (``CREATE TABLE IF NOT EXISTS``, a lost race retried).

Names and bounds are pure functions (``month_of``, ``partition_name``, ``bounds``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, text
from sqlalchemy import exc as sa_exc

#: The partitioned tables, parent first (children reference it: dropped first, made after).
TABLES = ("exchanges", "exchange_blocks", "exchange_tool_calls", "exchange_violations")
#: A partition's name: ``<table>_pYYYY_MM``.
NAME_RE = re.compile(r"^(exchanges|exchange_blocks|exchange_tool_calls|exchange_violations)_p(\d{4})_(\d{2})$")
#: Months made ahead of the current one.
AHEAD = 1

Month = tuple[int, int]


def month_of(when: datetime) -> Month:
    """(year, month) of an aware time, in UTC."""
    utc = when.astimezone(timezone.utc)
    return utc.year, utc.month


def next_month(month: Month) -> Month:
    year, m = month
    return (year + 1, 1) if m == 12 else (year, m + 1)


def bounds(month: Month) -> tuple[datetime, datetime]:
    """[start, end) of the month in UTC."""
    year, m = month
    n_year, n_m = next_month(month)
    return datetime(year, m, 1, tzinfo=timezone.utc), datetime(n_year, n_m, 1, tzinfo=timezone.utc)


def partition_name(table: str, month: Month) -> str:
    if table not in TABLES:
        raise ValueError(f"{table} is not partitioned")
    return f"{table}_p{month[0]:04d}_{month[1]:02d}"


def is_partition(name: str) -> bool:
    """Whether a table name is one of the partitions (Alembic's comparison leaves them out)."""
    return NAME_RE.match(name) is not None


def existing(conn: Connection) -> set[Month]:
    """The months with a partition of ``exchanges`` (in the connection's search path)."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'exchanges'::regclass"
        )
    ).scalars()
    return {(int(m.group(2)), int(m.group(3))) for name in rows if (m := NAME_RE.match(name))}


def create_month(conn: Connection, month: Month) -> None:
    """Makes the month's partition of every partitioned table (already there: nothing)."""
    start, end = bounds(month)
    for table in TABLES:
        conn.execute(
            text(
                f'CREATE TABLE IF NOT EXISTS "{partition_name(table, month)}" PARTITION OF "{table}"'
                f" FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
            )
        )


def drop_month(conn: Connection, month: Month) -> None:
    """Drops the month's partitions, children first; the parent's is detached before it is
    dropped (a partition of a table that foreign keys reference cannot be dropped attached)."""
    for table in reversed(TABLES[1:]):
        conn.execute(text(f'DROP TABLE IF EXISTS "{partition_name(table, month)}"'))
    name = partition_name("exchanges", month)
    conn.execute(text(f'ALTER TABLE "exchanges" DETACH PARTITION "{name}"'))
    conn.execute(text(f'DROP TABLE "{name}"'))


class Partitions:
    """The months known to exist, for one store; ``ensure`` makes the missing ones."""

    def __init__(self) -> None:
        self._known: set[Month] = set()

    def forget(self) -> None:
        """Forgets the months known (a purge may have dropped some since)."""
        self._known.clear()

    def ensure(self, engine: Engine, times: Iterable[datetime], now: datetime | None = None) -> None:
        """Makes the partitions of the months of ``times`` and of ``now``'s month and the
        ``AHEAD`` next ones (each in its own transaction), unless known to exist. Nothing on
        SQLite. Raises SQLAlchemy errors when the database refuses (retried by the caller)."""
        if engine.dialect.name != "postgresql":
            return
        wanted = {month_of(t) for t in times}
        month = month_of(now or datetime.now(timezone.utc))
        for _ in range(AHEAD + 1):
            wanted.add(month)
            month = next_month(month)
        missing = wanted - self._known
        if not missing:
            return
        with engine.connect() as conn:
            self._known |= existing(conn)
        for month in sorted(missing - self._known):
            for attempt in range(3):
                try:
                    with engine.begin() as conn:
                        create_month(conn, month)
                    break
                except (sa_exc.IntegrityError, sa_exc.ProgrammingError):  # another writer made it meanwhile
                    if attempt == 2:
                        raise
            self._known.add(month)


__all__ = [
    "AHEAD",
    "TABLES",
    "Partitions",
    "bounds",
    "create_month",
    "drop_month",
    "existing",
    "is_partition",
    "month_of",
    "next_month",
    "partition_name",
]
