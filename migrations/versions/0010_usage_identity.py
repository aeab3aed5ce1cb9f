"""The fuller record: who sent it, usage details and the response's identity on ``exchanges``;
``key_owners``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

New columns, all nullable, null for every record stored before (issue 16, "a fuller record"):
who sent the request (``client_address``, ``proxy_user``, ``key_fingerprint``: a keyed
fingerprint of its API credential, ``observer.identity``; the last two with a filter index
(column, started_at, id) like the others),
the token classes that decide cost (``cache_read_input_tokens``, ``cache_creation_input_tokens``,
``reasoning_output_tokens``, ``total_tokens`` as sent, other counts in ``usage_details``), which
response the vendor said it was (``response_id``, ``system_fingerprint``, ``service_tier``) and
the per-choice results of an ``n > 1`` response (``choices``), resumed event streams
(``request_last_event_id``, ``last_event_id`` with an index, and the derived ``resumes_id``); ``exchange_tool_calls.declared``
becomes nullable (a tool call of a request that cannot declare tools, an AI SDK UI request). Null is "not reported", never 0.
The chain commits to each only when it holds something (``observer.store.chain.ADDED_KEYS``),
so the records already stored verify as before. Plain ``ADD COLUMN`` / ``DROP COLUMN`` on both
databases (no table rewrite: no default to fill in); on PostgreSQL the partitions take the
columns from the partitioned table. Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")

COLUMNS = (
    (
        "client_address",
        sa.Text(),
        "client.address as the proxy saw it, or its keyed pseudonym (setting client_address)",
    ),
    ("proxy_user", sa.Text(), "The user the proxy authenticated (proxyauth)"),
    (
        "key_fingerprint",
        sa.String(64),
        "hmac-sha256 fingerprint of the request's API credential (observer.identity)",
    ),
    ("response_id", sa.Text(), "gen_ai.response.id (the vendor's response/message id)"),
    ("system_fingerprint", sa.Text(), "openai.response.system_fingerprint"),
    ("service_tier", sa.Text(), "openai.response.service_tier (the tier that served it)"),
    ("choices", JSON, "Per-choice results when the response had several (n > 1); null: one answer"),
    ("cache_read_input_tokens", sa.BigInteger(), "gen_ai.usage.cache_read.input_tokens (null: not reported)"),
    (
        "cache_creation_input_tokens",
        sa.BigInteger(),
        "gen_ai.usage.cache_creation.input_tokens (null: not reported)",
    ),
    ("reasoning_output_tokens", sa.BigInteger(), "Output tokens spent on reasoning (null: not reported)"),
    ("total_tokens", sa.BigInteger(), "Total tokens as the vendor sent it (null: not sent)"),
    ("usage_details", JSON, "Other reported counts {group: {name: n}} (observer.records.Usage.details)"),
    (
        "request_last_event_id",
        sa.Text(),
        "The request's Last-Event-ID header: a resumed event stream (WHATWG HTML 9.2)",
    ),
    ("last_event_id", sa.Text(), "The id of the response's last SSE event"),
    (
        "resumes_id",
        sa.String(36),
        "The exchange this one resumes (its last_event_id = this Last-Event-ID; derived, not chained)",
    ),
)


INDEXED = ("proxy_user", "key_fingerprint")
DECLARED = "Name was among the request's declared tools; null: the request cannot declare them (AI SDK UI)"
#: SQLite's batch copy of ``exchange_tool_calls`` reflects that table alone, not ``exchanges``, the
#: table its foreign key refers to (SQLAlchemy's ``Table.resolve_fks``): reflecting it warned
#: "Skipped unsupported reflection of expression-based index ix_exchanges_day" (0007's index,
#: which SQLite cannot reflect) at every new store's start. Alembic's batch mode makes the
#: referred table's key columns itself to render the copy's foreign key; the copy is the same.
NO_REFERENT = {"resolve_fks": False}


def upgrade() -> None:
    for name, type_, comment in COLUMNS:
        op.add_column("exchanges", sa.Column(name, type_, nullable=True, comment=comment))
    for name in INDEXED:
        op.create_index(f"ix_exchanges_{name}_started_at_id", "exchanges", [name, "started_at", "id"])
    op.create_index("ix_exchanges_last_event_id", "exchanges", ["last_event_id"])
    # A tool call of a request that cannot declare tools (an AI SDK UI request) is declared: null.
    with op.batch_alter_table("exchange_tool_calls", reflect_kwargs=NO_REFERENT) as batch:
        batch.alter_column("declared", existing_type=sa.Boolean(), nullable=True, comment=DECLARED)
    op.create_table(
        "key_owners",
        sa.Column("fingerprint", sa.String(64), nullable=False, comment="hmac-sha256:<32 hex>"),
        sa.Column("owner", sa.Text(), nullable=False, comment="Person or service holding the credential"),
        sa.Column("team", sa.Text(), nullable=True, comment="Team or cost centre"),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=True, comment="Last change of owner/team (--replace)"
        ),
        sa.Column("updated_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("fingerprint", name="pk_key_owners"),
        comment="API credential fingerprints and their owners; never the credentials.",
    )


def downgrade() -> None:
    op.drop_table("key_owners")
    op.execute("UPDATE exchange_tool_calls SET declared = false WHERE declared IS NULL")
    with op.batch_alter_table("exchange_tool_calls", reflect_kwargs=NO_REFERENT) as batch:
        batch.alter_column(
            "declared",
            existing_type=sa.Boolean(),
            nullable=False,
            comment="Name was among the request's declared tools",
        )
    op.drop_index("ix_exchanges_last_event_id", table_name="exchanges")
    for name in INDEXED:
        op.drop_index(f"ix_exchanges_{name}_started_at_id", table_name="exchanges")
    for name, _, _ in reversed(COLUMNS):
        op.drop_column("exchanges", name)
