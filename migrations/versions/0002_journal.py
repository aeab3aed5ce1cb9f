"""Journal numbering on records, recording gaps, the store's identity.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(
            sa.Column(
                "writer_id",
                sa.String(36),
                nullable=True,
                comment="Journal (observer process) that wrote the record; null before journals",
            )
        )
        batch.add_column(
            sa.Column(
                "seq", sa.BigInteger(), nullable=True, comment="The record's number in its writer's journal (1, 2, ...)"
            )
        )
    op.create_index("ux_exchanges_writer_id_seq", "exchanges", ["writer_id", "seq"], unique=True)
    op.create_table(
        "gaps",
        sa.Column("writer_id", sa.String(36), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False, comment="First seq of the gap"),
        sa.Column("seq_end", sa.BigInteger(), nullable=False, comment="Last seq of the gap (= seq when it takes one)"),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=True, comment="First loss (UTC); null when unknown"),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=True, comment="Last loss (UTC); null when unknown"),
        sa.Column("dropped", sa.BigInteger(), nullable=True, comment="Records lost; null when unknown"),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("detail", sa.Text(), nullable=True, comment="Record id or error, where there is one"),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
            comment="Insert time (database clock)",
        ),
        sa.PrimaryKeyConstraint("writer_id", "seq", name="pk_gaps"),
        comment="Recording gaps: what was lost, when, how many, why.",
    )
    op.create_table(
        "store_meta",
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_store_meta"),
        comment="The store's own facts (store_id).",
    )


def downgrade() -> None:
    op.drop_table("store_meta")
    op.drop_table("gaps")
    op.drop_index("ux_exchanges_writer_id_seq", table_name="exchanges")
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("seq")
        batch.drop_column("writer_id")
