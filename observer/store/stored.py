"""The order records were stored in (``exchanges.stored_seq``), for ``recorded_after``.

An incremental reader (``GET /v1/exchanges?recorded_after=``) must see every record exactly once
although records arrive late (a long stream started earlier is stored later) and several writers
commit at once. So the key must follow *commit* order, and a reader must never pass a key that a
still-open transaction may yet commit below.

- SQLite: one writer at a time (the database lock), so a counter in ``store_meta``
  (``stored_seq``), advanced by the storing transaction itself, is commit order: ``reserve``.
- PostgreSQL: writers commit concurrently; a counter row would serialise them. The key is the
  storing transaction's id (``pg_current_xact_id()``, the column's default, set by migration
  0006), and a read only returns rows below ``pg_snapshot_xmin(pg_current_snapshot())``, the
  oldest transaction still running (``horizon``): rows of transactions at or above it may still
  be committed, always with a larger key than any returned. The technique of transactional
  outbox readers; https://www.postgresql.org/docs/15/functions-info.html Table 9.76. A
  long-running transaction holds the horizon back: records then wait, never vanish.

Keys are shared by the records of one transaction, so positions are ``(stored_seq, id)``.
Records stored before migration 0006 have ``stored_seq`` 0 on PostgreSQL (1.. by ``created_at``
on SQLite).
"""

from __future__ import annotations

from sqlalchemy import Connection, text

#: ``store_meta`` key of the SQLite counter (the last ``stored_seq`` given).
COUNTER_KEY = "stored_seq"
PG_DEFAULT = "(pg_current_xact_id()::text)::bigint"


def reserve(conn: Connection, count: int) -> int:
    """SQLite: advances the counter by ``count`` inside the caller's (write) transaction and
    returns the first of the ``count`` keys reserved. The UPDATE takes SQLite's write lock, so
    no other transaction can reserve until this one ends."""
    first = conn.execute(
        text("UPDATE store_meta SET value = CAST(CAST(value AS INTEGER) + :n AS TEXT) WHERE key = :k RETURNING value"),
        {"n": count, "k": COUNTER_KEY},
    ).scalar_one()
    return int(first) - count + 1


def horizon(conn: Connection) -> int | None:
    """PostgreSQL: the smallest key a running transaction may still commit (rows with a smaller
    ``stored_seq`` are final); ``None`` on SQLite, where every committed row is final."""
    if conn.dialect.name != "postgresql":
        return None
    return int(conn.execute(text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")).scalar_one())
