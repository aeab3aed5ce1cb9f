"""SQLite's planner statistics (``sqlite_stat1``), refreshed by the store's writer as it grows.

Without statistics SQLite chooses between two equally usable indexes by their shape, not by
how many rows a value has: ``GET /v1/exchanges?host=…&user=…`` walked the host's index (125,000
records per host) rather than the user's (200), 742 ms p95 at 1,000,000 records instead of
~10 (docs/performance.md). PostgreSQL's autovacuum analyzes by itself; SQLite never does
(https://sqlite.org/lang_analyze.html: "Statistics gathered by ANALYZE are not automatically
updated as the content of the database changes").

``ANALYZE exchanges`` runs in full (``analysis_limit=0``: a sampled run estimated every column
at ~400 rows per value, host and user alike): ~2 s at 1,000,000 records on this machine, in a
write transaction (the writer's only; WAL readers go on). It runs after a ``write_many`` once
``FIRST`` records have been stored and then whenever the records stored reach twice the count
at the last run, so the statistics are at most a factor 2 old and all runs together cost about
two of the last. The count at the last run is kept in ``store_meta`` (``ANALYZED_KEY``), so a
restart neither repeats nor forgets it. The count is the stored-order counter
(``observer.store.stored``: every record ever stored, purged ones included).
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Connection, text

#: ``store_meta`` key: the stored-record count at the last ``ANALYZE``.
ANALYZED_KEY = "sqlite_analyzed_at"
#: No statistics below this many stored records (every plan is fast at that size).
FIRST = 10_000

log = logging.getLogger(__name__)


def due(analyzed_at: int, stored: int) -> bool:
    """Whether ``stored`` records call for a new analysis after one at ``analyzed_at`` (0: none)."""
    return stored >= max(FIRST, 2 * analyzed_at)


def analyzed_at(conn: Connection) -> int:
    """The stored-record count at the last analysis (0 when none was made)."""
    value = conn.execute(text("SELECT value FROM store_meta WHERE key = :k"), {"k": ANALYZED_KEY}).scalar()
    return int(value) if value else 0


def analyze(conn: Connection, stored: int) -> None:
    """Runs a full ``ANALYZE exchanges`` in the caller's transaction and records ``stored`` as
    the count it was made at."""
    t = time.perf_counter()
    conn.execute(text("PRAGMA analysis_limit = 0"))
    conn.execute(text("ANALYZE exchanges"))
    updated = conn.execute(
        text("UPDATE store_meta SET value = :v WHERE key = :k"), {"v": str(stored), "k": ANALYZED_KEY}
    ).rowcount
    if not updated:
        conn.execute(text("INSERT INTO store_meta (key, value) VALUES (:k, :v)"), {"k": ANALYZED_KEY, "v": str(stored)})
    log.info("audit store: SQLite statistics refreshed at %d records (%.1f s)", stored, time.perf_counter() - t)
