"""The indexes stats reads also hold the cache and reasoning token counts.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05

``GET /v1/stats`` sums, besides input and output tokens, the token classes that decide cost
(``cache_read_input_tokens``, ``cache_creation_input_tokens``, ``reasoning_output_tokens``:
columns of 0010) and counts, per class, the exchanges that reported it
(``observer.store.query.stats``). The indexes it reads, ``ix_exchanges_started_at_id`` (by day
on PostgreSQL), the filter indexes of the grouped columns (model, end_user, dialect, host) and,
on SQLite, ``ix_exchanges_day``, held what it summed (0006, 0007); they are made again with the
three counts after ``output_tokens``, so a stats call still reads an index, not the table. Each
index is dropped and made again (no rename: SQLite cannot rename an index), in the upgrade's
transaction on PostgreSQL, where an index of the partitioned table is made on every partition:
the table is locked against writes while the indexes are built (at 1,000,000 records ~25 s in all on SQLite, ~15 s on PostgreSQL with
``maintenance_work_mem`` 1 GB: docs/performance.md; a writer waits meanwhile, the proxies'
journals holding its records). Written by hand to match ``observer/store/models.py``; the
column lists are literals, never the model's.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: What stats read up to 0010 (0006, 0007), and from here on.
SUMMED_0010 = ("input_tokens", "output_tokens", "usage_reported")
SUMMED = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_output_tokens",
    "usage_reported",
)
STATS_GROUPED = ("model", "end_user", "dialect", "host")
TIME_INDEX = "ix_exchanges_started_at_id"
DAY_INDEX = "ix_exchanges_day"
SQLITE_DAY = "substr(started_at, 1, 10)"


def _remake(name: str, columns: Sequence[str | sa.TextClause]) -> None:
    op.drop_index(name, table_name="exchanges")
    op.create_index(name, "exchanges", list(columns))


def _indexes(summed: Sequence[str]) -> None:
    """Makes every index stats reads again with ``summed`` after its key columns."""
    _remake(TIME_INDEX, ["started_at", "id", *summed])
    for column in STATS_GROUPED:
        _remake(f"ix_exchanges_{column}_started_at_id", [column, "started_at", "id", *summed])
    if op.get_bind().dialect.name == "sqlite":
        _remake(DAY_INDEX, [sa.text(SQLITE_DAY), *summed])


def upgrade() -> None:
    _indexes(SUMMED)


def downgrade() -> None:
    _indexes(SUMMED_0010)
