"""Indexes for the filters that walked too far (tool, violation, model with outcome) and for stats.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

``GET /v1/exchanges?tool=`` and ``?violation=`` walk (name / kind, exchange_started_at,
exchange_id) newest first into the exchanges (``observer.store.query.page``) instead of
collecting the matching record ids; these replace the single-column ``ix_exchange_tool_calls_name``
and ``ix_exchange_violations_kind``. ``model`` with ``outcome`` gets (outcome, model,
started_at, id): error records have no response model, so the pair walked every error record.
The indexes of the columns stats groups by (model, end_user, dialect, host) also hold what it
sums, as ``ix_exchanges_started_at_id`` does since 0006: stats reads the index, not the table.
On SQLite ``ix_exchanges_day`` on ``substr(started_at, 1, 10)`` (the UTC day) lets stats by day
read the days in order instead of sorting every record's day.
On PostgreSQL an index on a partitioned table is made on every partition. Written by hand to
match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: (table, column) of each child filter.
WALKED = (("exchange_tool_calls", "name"), ("exchange_violations", "kind"))
OUTCOME_MODEL = ("ix_exchanges_outcome_model_started_at_id", ["outcome", "model", "started_at", "id"])
STATS_GROUPED = ("model", "end_user", "dialect", "host")
STATS_SUMMED = ["input_tokens", "output_tokens", "usage_reported"]
DAY_INDEX = "ix_exchanges_day"
SQLITE_DAY = "substr(started_at, 1, 10)"


def _filter_index(column: str, summed: list[str]) -> None:
    name = f"ix_exchanges_{column}_started_at_id"
    op.drop_index(name, table_name="exchanges")
    op.create_index(name, "exchanges", [column, "started_at", "id", *summed])


def upgrade() -> None:
    for table, column in WALKED:
        op.drop_index(f"ix_{table}_{column}", table_name=table)
        op.create_index(f"ix_{table}_{column}_started_at_id", table, [column, "exchange_started_at", "exchange_id"])
    op.create_index(OUTCOME_MODEL[0], "exchanges", OUTCOME_MODEL[1])
    for column in STATS_GROUPED:
        _filter_index(column, STATS_SUMMED)
    if op.get_bind().dialect.name == "sqlite":
        op.create_index(DAY_INDEX, "exchanges", [sa.text(SQLITE_DAY), *STATS_SUMMED])


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index(DAY_INDEX, table_name="exchanges")
    for column in STATS_GROUPED:
        _filter_index(column, [])
    op.drop_index(OUTCOME_MODEL[0], table_name="exchanges")
    for table, column in WALKED:
        op.drop_index(f"ix_{table}_{column}_started_at_id", table_name=table)
        op.create_index(f"ix_{table}_{column}", table, [column])
