"""Hash chain over records and gaps; signed checkpoints.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("exchanges") as batch:
        batch.add_column(
            sa.Column(
                "record_hash",
                sa.String(64),
                nullable=True,
                comment="Chain hash (hex) over this record and its writer's previous entry (observer.store.chain)",
            )
        )
    with op.batch_alter_table("gaps") as batch:
        batch.add_column(
            sa.Column("record_hash", sa.String(64), nullable=False, comment="Chain hash (hex), as for a record")
        )
    op.create_table(
        "checkpoints",
        sa.Column("writer_id", sa.String(36), nullable=False),
        sa.Column("number", sa.BigInteger(), nullable=False, comment="1, 2, ... per writer"),
        sa.Column("seq", sa.BigInteger(), nullable=False, comment="Entries of the chain covered (its last seq)"),
        sa.Column("head_hash", sa.String(64), nullable=False, comment="record_hash of entry seq (hex)"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, comment="When it was signed (UTC)"),
        sa.Column(
            "prev_hash", sa.String(64), nullable=False, comment="SHA-256 of the previous checkpoint's note (hex)"
        ),
        sa.Column("key_id", sa.String(16), nullable=False, comment="First 8 bytes of SHA-256 of the public key (hex)"),
        sa.Column("note", sa.Text(), nullable=False, comment="The signed text"),
        sa.Column("signature", sa.Text(), nullable=False, comment="Ed25519 signature of the note (base64)"),
        sa.PrimaryKeyConstraint("writer_id", "number", name="pk_checkpoints"),
        comment="Signed checkpoints of each writer's hash chain.",
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    with op.batch_alter_table("gaps") as batch:
        batch.drop_column("record_hash")
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("record_hash")
