"""Store events (holds, purges), legal holds and the record ids they name, purged runs; the
store chain's head in writers' checkpoints.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _time(name: str, nullable: bool, comment: str | None = None) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, comment=comment)


def upgrade() -> None:
    op.create_table(
        "store_events",
        sa.Column(
            "seq", sa.BigInteger(), autoincrement=False, nullable=False, comment="1, 2, ... in the store's chain"
        ),
        sa.Column("kind", sa.String(64), nullable=False, comment="hold_created, hold_released or purge"),
        _time("at", False, "When the command ran (UTC)"),
        sa.Column("actor", sa.Text(), nullable=False, comment="Who ran it (--by, else the operating system user)"),
        sa.Column("detail", JSON, nullable=False, comment="The event's facts (observer.store.events)"),
        sa.Column("record_hash", sa.String(64), nullable=False, comment="Chain hash (hex), as for a record"),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
            comment="Insert time (database clock)",
        ),
        sa.PrimaryKeyConstraint("seq", name="pk_store_events"),
        comment="Chained store events: holds created and released, purges.",
    )
    op.create_table(
        "holds",
        sa.Column("id", sa.String(36), nullable=False, comment="Hold id (UUID)"),
        sa.Column("reason", sa.Text(), nullable=False),
        _time("created_at", False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("created_seq", sa.BigInteger(), nullable=False, comment="The store event that made it"),
        _time("since", True, "Scope: records started at or after (UTC)"),
        _time("until", True, "Scope: records started at or before (UTC)"),
        sa.Column("end_user", sa.Text(), nullable=True, comment="Scope: enduser.id"),
        sa.Column("host", sa.Text(), nullable=True, comment="Scope: server.address"),
        sa.Column("exchange_ids", JSON, nullable=True, comment="Scope: these record ids"),
        _time("released_at", True),
        sa.Column("released_by", sa.Text(), nullable=True),
        sa.Column("release_reason", sa.Text(), nullable=True),
        sa.Column("released_seq", sa.BigInteger(), nullable=True, comment="The store event that released it"),
        sa.PrimaryKeyConstraint("id", name="pk_holds"),
        comment="Legal holds: scope, reason, who made and released them.",
    )
    op.create_table(
        "hold_records",
        sa.Column("hold_id", sa.String(36), nullable=False),
        sa.Column("exchange_id", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("hold_id", "exchange_id", name="pk_hold_records"),
        comment="Record ids named by legal holds.",
    )
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(
            sa.Column(
                "events_seq",
                sa.BigInteger(),
                nullable=True,
                comment="The store chain's head seen when signed (a writer's checkpoint; null: none)",
            )
        )
        batch.add_column(
            sa.Column(
                "events_hash", sa.String(64), nullable=True, comment="record_hash of store event events_seq (hex)"
            )
        )
    op.create_table(
        "purged_runs",
        sa.Column("writer_id", sa.String(36), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False, comment="record_hash of entry last_seq (hex)"),
        sa.Column("event_seq", sa.BigInteger(), nullable=False, comment="The purge's store event"),
        sa.PrimaryKeyConstraint("writer_id", "first_seq", name="pk_purged_runs"),
        comment="Chain entries removed by purges, as runs of seqs per writer.",
    )


def downgrade() -> None:
    op.drop_table("purged_runs")
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("events_hash")
        batch.drop_column("events_seq")
    op.drop_table("hold_records")
    op.drop_table("holds")
    op.drop_table("store_events")
