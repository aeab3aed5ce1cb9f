"""Exchange tables keyed by (id, started_at); on PostgreSQL range-partitioned by month.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

The child tables get ``exchange_started_at`` (their record's start, filled from it) and a
foreign key on (``exchange_id``, ``exchange_started_at``). On PostgreSQL each of the four tables
is rebuilt as ``PARTITION BY RANGE`` (``observer.store.partitions``): the old table is renamed
(its indexes too), the new one made ``LIKE`` it, a partition made for each month holding rows
and for the current and next month, the rows copied, the old table dropped. On SQLite the
tables are rebuilt by Alembic's batch mode. Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

from observer.store import partitions

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHILDREN = ("exchange_blocks", "exchange_tool_calls", "exchange_violations")
STARTED_COMMENT = "Request start (UTC); the partition key on PostgreSQL"
OLD_STARTED_COMMENT = "Request start (UTC)"
CHILD_COMMENT = "The record's started_at (the partition key)"
EXCHANGE_INDEXES = (
    ("ix_exchanges_started_at_id", ["started_at", "id"]),
    ("ix_exchanges_host", ["host"]),
    ("ix_exchanges_end_user", ["end_user"]),
    ("ix_exchanges_model", ["model"]),
    ("ix_exchanges_outcome", ["outcome"]),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _add_child_column_pg()
        _rebuild_pg(partitioned=True)
        return
    for child in CHILDREN:
        with op.batch_alter_table(child) as batch:
            batch.add_column(sa.Column("exchange_started_at", sa.DateTime(timezone=True), nullable=True))
        op.execute(
            f"UPDATE {child} SET exchange_started_at ="
            f" (SELECT e.started_at FROM exchanges e WHERE e.id = {child}.exchange_id)"
        )
    op.drop_index("ux_exchanges_writer_id_seq", table_name="exchanges")
    with op.batch_alter_table("exchanges", recreate="always") as batch:
        batch.drop_constraint("pk_exchanges", type_="primary")
        batch.create_primary_key("pk_exchanges", ["id", "started_at"])
    op.create_index("ux_exchanges_writer_id_seq", "exchanges", ["writer_id", "seq", "started_at"], unique=True)
    for child in CHILDREN:
        with op.batch_alter_table(child, recreate="always") as batch:
            batch.alter_column("exchange_started_at", nullable=False, existing_type=sa.DateTime(timezone=True))
            batch.drop_constraint(f"fk_{child}_exchange_id_exchanges", type_="foreignkey")
            batch.drop_constraint(f"pk_{child}", type_="primary")
            batch.create_primary_key(f"pk_{child}", ["exchange_id", "exchange_started_at", "position"])
            batch.create_foreign_key(
                f"fk_{child}_exchange_id_exchanges",
                "exchanges",
                ["exchange_id", "exchange_started_at"],
                ["id", "started_at"],
                ondelete="CASCADE",
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _rebuild_pg(partitioned=False)
        for child in CHILDREN:
            op.drop_column(child, "exchange_started_at")
        return
    for child in CHILDREN:
        with op.batch_alter_table(child, recreate="always") as batch:
            batch.drop_constraint(f"fk_{child}_exchange_id_exchanges", type_="foreignkey")
            batch.drop_constraint(f"pk_{child}", type_="primary")
            batch.create_primary_key(f"pk_{child}", ["exchange_id", "position"])
    op.drop_index("ux_exchanges_writer_id_seq", table_name="exchanges")
    with op.batch_alter_table("exchanges", recreate="always") as batch:
        batch.drop_constraint("pk_exchanges", type_="primary")
        batch.create_primary_key("pk_exchanges", ["id"])
    op.create_index("ux_exchanges_writer_id_seq", "exchanges", ["writer_id", "seq"], unique=True)
    for child in CHILDREN:
        with op.batch_alter_table(child, recreate="always") as batch:
            batch.drop_column("exchange_started_at")
            batch.create_foreign_key(
                f"fk_{child}_exchange_id_exchanges", "exchanges", ["exchange_id"], ["id"], ondelete="CASCADE"
            )


def _add_child_column_pg() -> None:
    for child in CHILDREN:
        op.add_column(child, sa.Column("exchange_started_at", sa.DateTime(timezone=True), nullable=True))
        op.execute(
            f"UPDATE {child} c SET exchange_started_at = e.started_at FROM exchanges e WHERE e.id = c.exchange_id"
        )
        op.alter_column(child, "exchange_started_at", nullable=False, comment=CHILD_COMMENT)


def _rebuild_pg(*, partitioned: bool) -> None:
    """Rebuilds the four tables (partitioned, or plain again), keeping their rows."""
    conn = op.get_bind()
    tables = ("exchanges", *CHILDREN)
    for table in tables:
        op.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_old"')
        for (index,) in conn.execute(
            sa.text("SELECT indexname FROM pg_indexes WHERE tablename = :t AND schemaname = current_schema()"),
            {"t": f"{table}_old"},
        ):
            op.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_old"')
    for table in tables:
        key = "started_at" if table == "exchanges" else "exchange_started_at"
        by = f" PARTITION BY RANGE ({key})" if partitioned else ""
        op.execute(f'CREATE TABLE "{table}" (LIKE "{table}_old" INCLUDING DEFAULTS INCLUDING COMMENTS){by}')
        comment = conn.execute(sa.text("SELECT obj_description(:t ::regclass, 'pg_class')"), {"t": f"{table}_old"})
        op.create_table_comment(table, comment.scalar())
    op.create_primary_key("pk_exchanges", "exchanges", ["id", "started_at"] if partitioned else ["id"])
    for name, columns in EXCHANGE_INDEXES:
        op.create_index(name, "exchanges", columns)
    unique = ["writer_id", "seq", "started_at"] if partitioned else ["writer_id", "seq"]
    op.create_index("ux_exchanges_writer_id_seq", "exchanges", unique, unique=True)
    op.alter_column(
        "exchanges",
        "started_at",
        existing_type=sa.DateTime(timezone=True),
        comment=STARTED_COMMENT if partitioned else OLD_STARTED_COMMENT,
    )
    for child in CHILDREN:
        op.create_primary_key(
            f"pk_{child}",
            child,
            ["exchange_id", "exchange_started_at", "position"] if partitioned else ["exchange_id", "position"],
        )
        op.create_foreign_key(
            f"fk_{child}_exchange_id_exchanges",
            child,
            "exchanges",
            ["exchange_id", "exchange_started_at"] if partitioned else ["exchange_id"],
            ["id", "started_at"] if partitioned else ["id"],
            ondelete="CASCADE",
        )
    op.create_index("ix_exchange_violations_kind", "exchange_violations", ["kind"])
    if partitioned:
        this = partitions.month_of(datetime.now(timezone.utc))
        months = {this, partitions.next_month(this)}
        held = conn.execute(
            sa.text("SELECT DISTINCT date_trunc('month', started_at AT TIME ZONE 'UTC') FROM exchanges_old")
        ).scalars()
        months |= {(m.year, m.month) for m in held}  # only the months holding rows (not all between)
        for month in sorted(months):
            partitions.create_month(conn, month)
    for table in tables:
        columns = ", ".join(f'"{c}"' for c in _columns(conn, table))
        op.execute(f'INSERT INTO "{table}" ({columns}) SELECT {columns} FROM "{table}_old"')
    for table in reversed(tables):
        op.execute(f'DROP TABLE "{table}_old"')


def _columns(conn: sa.Connection, table: str) -> list[str]:
    return list(
        conn.execute(
            sa.text(
                "SELECT column_name FROM information_schema.columns WHERE table_name = :t"
                " AND table_schema = current_schema() ORDER BY ordinal_position"
            ),
            {"t": table},
        ).scalars()
    )
