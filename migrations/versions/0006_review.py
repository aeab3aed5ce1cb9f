"""API tokens, the access log, incidents; the exchanges' stored order, conversation and search.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

``exchanges`` gets ``stored_seq`` (``observer.store.stored``: on SQLite numbered 1.. by
``created_at`` for the rows already there, with the counter in ``store_meta``; on PostgreSQL 0
for those rows and the storing transaction's id by default for new ones), ``conversation_id``
and ``continuation_hash`` (``observer.conversation``), one (column, started_at, id) index per
filtered column in place of the single-column ones, and full-text search
(``observer.store.search``: an FTS5 table on SQLite filled from the rows there; on
PostgreSQL a ``tsvector`` column, filled for the rows there by the server's ``simple``
configuration, under a GIN index). Written by hand to match ``observer/store/models.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from observer.store import search, stored

#: The filter indexes this revision made (``observer.store.models.FILTER_INDEXED`` as it was then;
#: a literal, so that columns added by later revisions are not indexed before they exist).
FILTER_INDEXED = ("host", "end_user", "model", "request_model", "dialect", "outcome", "stop_reason", "conversation_id")

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
OLD_INDEXES = ("host", "end_user", "model", "outcome")
#: ix_exchanges_started_at_id from here on: page order, then what stats sums.
TIME_INDEX = ("started_at", "id", "input_tokens", "output_tokens", "usage_reported")


def _time(name: str, nullable: bool = False, comment: str | None = None) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, comment=comment)


def _id(name: str, nullable: bool = False, comment: str | None = None) -> sa.Column:
    return sa.Column(name, sa.String(36), nullable=nullable, comment=comment)


def upgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    _exchanges(pg)
    op.create_index("ix_exchange_tool_calls_name", "exchange_tool_calls", ["name"])
    op.create_table(
        "api_tokens",
        _id("id", comment="Token id (UUID)"),
        sa.Column("name", sa.Text(), nullable=False, comment="The principal the access log names"),
        sa.Column("role", sa.String(16), nullable=False, comment="viewer, auditor, responder or admin"),
        sa.Column("token_sha256", sa.String(64), nullable=False, comment="SHA-256 of the token (hex)"),
        _time("created_at"),
        sa.Column("created_by", sa.Text(), nullable=False),
        _time("revoked_at", True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("name", name="uq_api_tokens_name"),
        sa.UniqueConstraint("token_sha256", name="uq_api_tokens_token_sha256"),
        comment="API tokens: name, role, SHA-256 of the token, who made and revoked them.",
    )
    op.create_table(
        "access_log",
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False, comment="1, 2, ... in its chain"),
        _time("at", comment="When the call was answered (UTC)"),
        sa.Column(
            "principal",
            sa.Text(),
            nullable=True,
            comment="Token name (bootstrap: the configured token); null: none",
        ),
        sa.Column("role", sa.String(16), nullable=True, comment="The principal's role; null when unauthenticated"),
        sa.Column("client", sa.Text(), nullable=True, comment="client.address of the call"),
        sa.Column("method", sa.String(16), nullable=False, comment="http.request.method"),
        sa.Column(
            "endpoint",
            sa.Text(),
            nullable=False,
            comment="http.route (the route template), or the path when none matched",
        ),
        sa.Column("path", sa.Text(), nullable=False, comment="url.path as requested (capped)"),
        sa.Column("params", JSON, nullable=False, comment="Query, path and body parameters (capped)"),
        sa.Column("status", sa.Integer(), nullable=False, comment="http.response.status_code"),
        sa.Column("rows", sa.BigInteger(), nullable=True, comment="Rows returned; null when the call returns none"),
        sa.Column("ids", JSON, nullable=True, comment="Ids of the records returned or changed"),
        sa.Column("record_hash", sa.String(64), nullable=False, comment="Chain hash (hex), as for a record"),
        sa.PrimaryKeyConstraint("seq", name="pk_access_log"),
        comment="Chained log of every API call: who, what, when, the answer.",
    )
    op.create_index("ix_access_log_at", "access_log", ["at"])
    op.create_index("ix_access_log_principal_at", "access_log", ["principal", "at"])
    op.create_table(
        "incidents",
        _id("id", comment="Incident id (UUID)"),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("category", sa.String(64), nullable=False, comment="observer.store.incidents.CATEGORIES"),
        _time("aware_at", comment="When the deployer became aware (Art. 73(2))"),
        sa.Column("status", sa.String(32), nullable=False, comment="open, reported or closed"),
        _time("created_at"),
        sa.Column("created_by", sa.Text(), nullable=False),
        _time("updated_at"),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
        comment="Incidents: category, awareness time, status; the report deadline derives from them.",
    )
    op.create_table(
        "incident_notes",
        _id("incident_id"),
        sa.Column("position", sa.Integer(), autoincrement=False, nullable=False, comment="1, 2, ..."),
        _time("at"),
        sa.Column("author", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"], name="fk_incident_notes_incident_id_incidents"),
        sa.PrimaryKeyConstraint("incident_id", "position", name="pk_incident_notes"),
        comment="Append-only notes of incidents.",
    )
    op.create_table(
        "incident_exchanges",
        _id("incident_id"),
        _id("exchange_id"),
        _time("linked_at"),
        sa.Column("linked_by", sa.Text(), nullable=False),
        _id("hold_id", comment="The legal hold made when it was linked"),
        sa.ForeignKeyConstraint(["incident_id"], ["incidents.id"], name="fk_incident_exchanges_incident_id_incidents"),
        sa.PrimaryKeyConstraint("incident_id", "exchange_id", name="pk_incident_exchanges"),
        comment="Exchanges linked to incidents.",
    )


def _exchanges(pg: bool) -> None:
    stored_comment = "Order of storing (observer.store.stored): a counter on SQLite, the transaction id on PostgreSQL"
    columns = [
        sa.Column("stored_seq", sa.BigInteger(), nullable=True, comment=stored_comment),
        sa.Column(
            "conversation_id",
            sa.String(36),
            nullable=True,
            comment="gen_ai.conversation.id: the first exchange of its conversation (derived, not chained)",
        ),
        sa.Column(
            "continuation_hash",
            sa.String(64),
            nullable=True,
            comment="Hash of the request's messages and this answer (observer.conversation)",
        ),
    ]
    for name in OLD_INDEXES:
        op.drop_index(f"ix_exchanges_{name}", table_name="exchanges")
    if pg:
        # Rows already stored get 0 (a constant default added with the column is kept in the
        # catalogue: no rewrite of the table), then every new row its transaction's id.
        columns[0] = sa.Column("stored_seq", sa.BigInteger(), server_default="0", comment=stored_comment)
        for column in columns:
            op.add_column("exchanges", column)
        op.execute(f"ALTER TABLE exchanges ALTER COLUMN stored_seq SET DEFAULT {stored.PG_DEFAULT}")
    else:
        with op.batch_alter_table("exchanges") as batch:
            for column in columns:
                batch.add_column(column)
        op.execute(
            "UPDATE exchanges SET stored_seq = r.n FROM "
            "(SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM exchanges) AS r "
            "WHERE r.id = exchanges.id"
        )
        op.execute(
            f"INSERT INTO store_meta (key, value) SELECT '{stored.COUNTER_KEY}', CAST(count(*) AS TEXT) FROM exchanges"
        )
    for name in FILTER_INDEXED:
        op.create_index(f"ix_exchanges_{name}_started_at_id", "exchanges", [name, "started_at", "id"])
    # The time index also covers what stats sums (observer.store.query.stats: no table read).
    op.drop_index("ix_exchanges_started_at_id", table_name="exchanges")
    op.create_index("ix_exchanges_started_at_id", "exchanges", list(TIME_INDEX))
    op.create_index("ix_exchanges_request_id", "exchanges", ["request_id"])
    op.create_index("ix_exchanges_continuation_hash", "exchanges", ["continuation_hash"])
    op.create_index("ix_exchanges_stored_seq_id", "exchanges", ["stored_seq", "id"])
    if pg:
        op.add_column(
            "exchanges",
            sa.Column(
                "search_vector",
                postgresql.TSVECTOR(),
                nullable=True,
                comment="PostgreSQL: the words of prompt and completion (observer.store.search); null on SQLite",
            ),
        )
        op.execute(f"UPDATE exchanges SET search_vector = {search.BACKFILL_VECTOR_PG}")
        op.execute(search.CREATE_SEARCH_INDEX_PG)
    else:
        with op.batch_alter_table("exchanges") as batch:
            batch.add_column(
                sa.Column(
                    "search_vector",
                    sa.Text(),
                    nullable=True,
                    comment="PostgreSQL: the words of prompt and completion (observer.store.search); null on SQLite",
                )
            )
        op.execute(search.CREATE_FTS_SQLITE)
        op.execute(
            f"INSERT INTO {search.FTS_TABLE} (rowid, prompt, completion) "
            f"SELECT stored_seq, {search.PROMPT_SQLITE}, text FROM exchanges"
        )


def downgrade() -> None:
    pg = op.get_bind().dialect.name == "postgresql"
    for table in ("incident_exchanges", "incident_notes", "incidents", "access_log", "api_tokens"):
        op.drop_table(table)
    op.drop_index("ix_exchange_tool_calls_name", table_name="exchange_tool_calls")
    if pg:
        op.drop_index(search.SEARCH_INDEX_PG, table_name="exchanges")
    else:
        op.execute(f"DROP TABLE {search.FTS_TABLE}")
        op.execute(f"DELETE FROM store_meta WHERE key = '{stored.COUNTER_KEY}'")
    for name in ("stored_seq_id", "continuation_hash", "request_id", *(f"{c}_started_at_id" for c in FILTER_INDEXED)):
        op.drop_index(f"ix_exchanges_{name}", table_name="exchanges")
    if pg:
        for name in ("stored_seq", "conversation_id", "continuation_hash", "search_vector"):
            op.drop_column("exchanges", name)
    else:
        with op.batch_alter_table("exchanges") as batch:
            for name in ("stored_seq", "conversation_id", "continuation_hash", "search_vector"):
                batch.drop_column(name)
    op.drop_index("ix_exchanges_started_at_id", table_name="exchanges")
    op.create_index("ix_exchanges_started_at_id", "exchanges", ["started_at", "id"])
    for name in OLD_INDEXES:
        op.create_index(f"ix_exchanges_{name}", "exchanges", [name])
