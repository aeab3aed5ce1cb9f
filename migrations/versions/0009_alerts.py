"""Alerts: ``alerts`` (``observer.alerting``: what a proxy's rule fired, and its deliveries).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

A new table on both databases (not partitioned on PostgreSQL: alerts are few). Written by hand
to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(36), nullable=False, comment="Alert id (UUID)"),
        sa.Column("fired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rule", sa.String(100), nullable=False, comment="The rule's name in the alerts file"),
        sa.Column("kind", sa.String(64), nullable=False, comment="observer.alerting.rules.RULE_KINDS"),
        sa.Column("severity", sa.String(16), nullable=False, comment="info, warning or critical"),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("proxy", sa.String(200), nullable=False, comment="The proxy process that fired it"),
        sa.Column("exchange_id", sa.String(36), nullable=True, comment="The record it is about, if one"),
        sa.Column("details", JSON, nullable=False, comment="Counts and ids (no record content)"),
        sa.Column("deliveries", JSON, nullable=False, comment="Webhook name -> delivered / failed: why"),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        comment="Alerts fired by the proxies' rules, and their deliveries to webhooks.",
    )
    op.create_index("ix_alerts_fired_at_id", "alerts", ["fired_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_alerts_fired_at_id", table_name="alerts")
    op.drop_table("alerts")
