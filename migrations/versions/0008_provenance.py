"""Where an ingested record came from: ``exchanges.provenance``.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``observer ingest`` records exchanges read offline from saved captures (mitmproxy flow dumps,
HAR files); each says so in ``provenance`` (``observer.records.Provenance``: the file, its
SHA-256, the flow's id, when), null for the records observed live and for every record stored
before. The chain commits to it only when it is not null (``observer.store.chain.ADDED_KEYS``),
so the records already stored verify as before. A plain ``ADD COLUMN`` / ``DROP COLUMN`` on both
databases (SQLite 3.35 or later drops a column in place, so the downgrade does not rebuild the
table and its expression index); on PostgreSQL the partitions take the column from the
partitioned table. Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.add_column(
        "exchanges",
        sa.Column(
            "provenance",
            JSON,
            nullable=True,
            comment="Where an ingested record came from (observer.records.Provenance); null: observed live",
        ),
    )


def downgrade() -> None:
    op.drop_column("exchanges", "provenance")
