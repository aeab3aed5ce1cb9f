"""Initial audit store: exchanges and their blocks, tool calls and violations.

Revision ID: 0001
Revises:
Create Date: 2025-11-30

Written by hand to match ``observer/store/models.py``; ``tests/unit/test_migrations.py``
compares the two on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _child_keys() -> list[sa.Column[object]]:
    return [
        sa.Column("exchange_id", sa.String(36), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False, comment="Order within the record"),
    ]


def _child_constraints(table: str) -> list[sa.Constraint]:
    return [
        sa.ForeignKeyConstraint(
            ["exchange_id"], ["exchanges.id"], name=f"fk_{table}_exchange_id_exchanges", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("exchange_id", "position", name=f"pk_{table}"),
    ]


def upgrade() -> None:
    op.create_table(
        "exchanges",
        sa.Column("id", sa.String(36), nullable=False, comment="Record id (UUID) assigned by the observer"),
        sa.Column("dialect", sa.String(64), nullable=False, comment="Wire dialect that decoded the stream"),
        sa.Column("scheme", sa.String(length=16), nullable=False, comment="url.scheme"),
        sa.Column("host", sa.Text(), nullable=False, comment="server.address"),
        sa.Column("port", sa.Integer(), nullable=True, comment="server.port"),
        sa.Column("path", sa.Text(), nullable=False, comment="url.path"),
        sa.Column("method", sa.Text(), nullable=False, comment="http.request.method"),
        sa.Column("http_version", sa.Text(), nullable=False, comment="network.protocol.version"),
        sa.Column("status_code", sa.Integer(), nullable=True, comment="http.response.status_code"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, comment="Request start (UTC)"),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True, comment="Last byte or abort (UTC)"),
        sa.Column(
            "ttft_s",
            sa.Double(),
            nullable=True,
            comment="gen_ai.server.time_to_first_token (seconds from request start)",
        ),
        sa.Column("request_id", sa.Text(), nullable=True, comment="Request id carried by the stream"),
        sa.Column("request_model", sa.Text(), nullable=True, comment="gen_ai.request.model"),
        sa.Column("end_user", sa.Text(), nullable=True, comment="enduser.id (as the request carried it)"),
        sa.Column("model", sa.Text(), nullable=True, comment="gen_ai.response.model"),
        sa.Column("input_tokens", sa.BigInteger(), nullable=True, comment="gen_ai.usage.input_tokens"),
        sa.Column("output_tokens", sa.BigInteger(), nullable=True, comment="gen_ai.usage.output_tokens"),
        sa.Column(
            "usage_reported", sa.Boolean(), nullable=False, comment="A usage event was seen (counts may be null)"
        ),
        sa.Column("text", sa.Text(), nullable=False, comment="All text blocks joined in index order"),
        sa.Column("stop_reason", sa.Text(), nullable=True, comment="gen_ai.response.finish_reasons (normalised)"),
        sa.Column("stop_reason_raw", sa.Text(), nullable=True, comment="Stop reason as the vendor sent it"),
        sa.Column(
            "error_reported",
            sa.Boolean(),
            nullable=False,
            comment="The stream carried an error event (code/message may be null)",
        ),
        sa.Column("error_code", sa.Text(), nullable=True, comment="error.type"),
        sa.Column("error_message", sa.Text(), nullable=True, comment="Error message carried by the stream"),
        sa.Column("outcome", sa.String(32), nullable=False, comment="completed, error, client_aborted, ..."),
        sa.Column("response_body", sa.Text(), nullable=True, comment="Capped body of a non-2xx answer"),
        sa.Column("transport_error", sa.Text(), nullable=True, comment="Proxy error when the connection failed"),
        sa.Column("response_bytes", sa.BigInteger(), nullable=False, comment="Response body bytes seen on the wire"),
        sa.Column("events", sa.BigInteger(), nullable=False, comment="Canonical events decoded from the stream"),
        sa.Column("request", _JSON, nullable=False, comment="Request facts (observer.records.RequestFacts)"),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
            comment="Insert time on the database clock (UTC)",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_exchanges"),
        comment="One row per observed LLM exchange (request + streamed response).",
    )
    op.create_index("ix_exchanges_started_at_id", "exchanges", ["started_at", "id"])
    op.create_index("ix_exchanges_host", "exchanges", ["host"])
    op.create_index("ix_exchanges_end_user", "exchanges", ["end_user"])
    op.create_index("ix_exchanges_model", "exchanges", ["model"])
    op.create_index("ix_exchanges_outcome", "exchanges", ["outcome"])

    op.create_table(
        "exchange_blocks",
        *_child_keys(),
        sa.Column("index", sa.BigInteger(), nullable=False, comment="Block index as on the wire"),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("stop_reason", sa.Text(), nullable=True),
        *_child_constraints("exchange_blocks"),
        comment="Content blocks of a response, in record order.",
    )
    op.create_table(
        "exchange_tool_calls",
        *_child_keys(),
        sa.Column("index", sa.BigInteger(), nullable=True, comment="Tool call index as on the wire"),
        sa.Column("call_id", sa.Text(), nullable=True, comment="gen_ai.tool.call.id"),
        sa.Column("name", sa.Text(), nullable=True, comment="gen_ai.tool.name"),
        sa.Column("arguments", sa.Text(), nullable=False, comment="gen_ai.tool.call.arguments, exactly as streamed"),
        sa.Column("declared", sa.Boolean(), nullable=False, comment="Name was among the request's declared tools"),
        *_child_constraints("exchange_tool_calls"),
        comment="Tool calls requested by the model, in record order.",
    )
    op.create_table(
        "exchange_violations",
        *_child_keys(),
        sa.Column("kind", sa.String(64), nullable=False, comment="observer.records.ViolationKind value"),
        sa.Column("seq", sa.BigInteger(), nullable=True, comment="Stream seq concerned (may exceed 2^53)"),
        sa.Column("detail", sa.Text(), nullable=False),
        *_child_constraints("exchange_violations"),
        comment="Protocol and lifecycle violations, in record order.",
    )
    op.create_index("ix_exchange_violations_kind", "exchange_violations", ["kind"])


def downgrade() -> None:
    op.drop_index("ix_exchange_violations_kind", table_name="exchange_violations")
    op.drop_table("exchange_violations")
    op.drop_table("exchange_tool_calls")
    op.drop_table("exchange_blocks")
    op.drop_index("ix_exchanges_outcome", table_name="exchanges")
    op.drop_index("ix_exchanges_model", table_name="exchanges")
    op.drop_index("ix_exchanges_host", table_name="exchanges")
    op.drop_index("ix_exchanges_end_user", table_name="exchanges")
    op.drop_index("ix_exchanges_started_at_id", table_name="exchanges")
    op.drop_table("exchanges")
