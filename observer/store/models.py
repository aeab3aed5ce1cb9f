"""SQLAlchemy 2 table models of the audit store (one row per ``Exchange`` plus child tables).

These are storage models, not the API's response schemas (``observer.api.schemas``) nor the
record type (``observer.records.Exchange``). Column comments give the OpenTelemetry GenAI /
HTTP semantic-convention attribute a column corresponds to, where there is one.

Times are stored in UTC (``UTCDateTime``): PostgreSQL keeps ``timestamptz``; SQLite keeps naive
text, which ``UTCDateTime`` turns back into aware UTC datetimes on read.

Wire-derived strings (model names, stop reasons, error text, hosts, paths) are ``Text``: a
length cap would turn an unusual upstream value into a rejected audit record. That is the
default of a ``str`` column (``Base.type_annotation_map``); the column shapes used more than once
are named once (``RecordId``, ``Label``, ``BigCount``), and the key columns every child table
shares are in ``ChildRow``.

Any change here needs a new Alembic revision in ``migrations/versions``; the drift test
(``tests/unit/test_migrations.py``) fails otherwise.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TSVECTOR
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: JSON everywhere; JSONB on PostgreSQL (indexable, e.g. ``request->'metadata'``). JSONB does
#: not keep object key order, so a read-back dict compares equal but may list keys differently.
JSONType = JSON().with_variant(JSONB(), "postgresql")
#: ``JSONType`` storing Python ``None`` as SQL NULL, not as the JSON ``null`` (``IS NULL`` finds it).
NullableJSON = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """An aware-UTC ``DateTime``: binds require aware values (converted to UTC); results are
    aware UTC even on SQLite, which stores naive text.

    Raises ``ValueError`` on a naive datetime: a time without an offset is ambiguous evidence.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("naive datetime given to the audit store; times must be timezone-aware")
        value = value.astimezone(timezone.utc)
        # SQLite would store the offset-free text of the wall time; hand it a naive UTC value.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class Base(DeclarativeBase):
    """Declarative base with the constraint naming convention used by the migrations and the
    column type of each Python type (``Mapped[str]`` is ``Text``, ``Mapped[int]`` ``Integer``)."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        str: Text,
        int: Integer,
        bool: Boolean,
        float: Double,
        datetime: UTCDateTime,
        dict[str, Any]: JSONType,
    }


#: A record id (UUID text): ``exchanges.id`` and the ``exchange_id`` of its child tables.
RecordId = Annotated[str, mapped_column(String(36))]
#: An observer-defined name (dialect, violation kind): short, from the observer's own vocabulary.
Label = Annotated[str, mapped_column(String(64))]
#: Counts, sizes and wire integers that may reach 2^63-1 (tokens, bytes, events, indexes, seq).
BigCount = Annotated[int, mapped_column(BigInteger)]


#: Columns filtered by equality whose index is (column, started_at, id): the API's list order.
FILTER_INDEXED = (
    "host",
    "end_user",
    "model",
    "request_model",
    "dialect",
    "outcome",
    "stop_reason",
    "conversation_id",
    "proxy_user",
    "key_fingerprint",
)
#: The token counts ``stats`` sums and counts per group (``observer.store.query.stats``), named as
#: the record's usage after OpenTelemetry ``gen_ai.usage.*``; each column is NULL when the vendor
#: did not report it (never 0).
STATS_TOKENS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_output_tokens",
)
#: What ``stats`` reads besides its group key, held in the indexes it reads (migration 0011 added
#: the cache and reasoning counts; a stats call then never reads the table: docs/performance.md).
STATS_SUMMED = (*STATS_TOKENS, "usage_reported")
#: The UTC day of ``started_at`` on SQLite (its text form starts ``YYYY-MM-DD``), spelled exactly
#: as ``stats`` groups by it: an expression index serves only the same expression.
SQLITE_DAY = "substr(started_at, 1, 10)"
#: Indexes made on SQLite only (``Index.ddl_if``; left out of the schema comparison).
SQLITE_ONLY_INDEXES = frozenset({"ix_exchanges_day"})
#: The columns ``stats`` groups by (besides the day): their filter indexes also hold ``STATS_SUMMED``.
STATS_GROUPED = ("model", "end_user", "dialect", "host")


def filter_index_columns(column: str) -> tuple[str, ...]:
    """The columns of ``column``'s filter index (``FILTER_INDEXED``), in order."""
    return (column, "started_at", "id", *(STATS_SUMMED if column in STATS_GROUPED else ()))


#: The partition key of the exchange tables on PostgreSQL (``observer.store.partitions``).
PARTITION_BY = "RANGE (started_at)"


class ExchangeRow(Base):
    """One observed exchange (``observer.records.Exchange``), its scalar facts denormalised.

    The primary key is (``id``, ``started_at``): on PostgreSQL the table is range-partitioned by
    month on ``started_at`` (``observer.store.partitions``), and a partitioned table's unique
    keys must hold the partition key. A record id is unique all the same: the writer checks the
    ids it stores (``AuditStore.write_many``) and makes them as UUID 4; the key's index, led by
    ``id``, serves the lookup by id alone."""

    __tablename__ = "exchanges"
    __table_args__ = (
        # Keyset pagination orders by (started_at DESC, id DESC); an ascending index on both
        # columns serves that order by a backward scan on PostgreSQL and SQLite alike. The
        # columns after them are what stats sums (observer.store.query.stats): a stats call
        # reads this index, not the table (docs/performance.md).
        Index("ix_exchanges_started_at_id", "started_at", "id", *STATS_SUMMED),
        # One record per (writer, seq): the journal's numbering, so a replay never duplicates
        # (with started_at: the partition key; a record's started_at never changes).
        Index("ux_exchanges_writer_id_seq", "writer_id", "seq", "started_at", unique=True),
        # The API's filters (observer.store.query): each equality filter's first page is a range
        # of one index, already in page order; stats by a grouped column reads its index alone.
        *(Index(f"ix_exchanges_{c}_started_at_id", *filter_index_columns(c)) for c in FILTER_INDEXED),
        # Combined filters follow one of those indexes and test the others per row, which is
        # slow only when the two rarely meet; error records have no response model, so
        # model+outcome=error would read every error record (docs/performance.md).
        Index("ix_exchanges_outcome_model_started_at_id", "outcome", "model", "started_at", "id"),
        # SQLite: stats by day reads the days in order (no sort of every row's day); PostgreSQL
        # groups by a hash of date_trunc's day instead (observer.store.query.stats).
        Index("ix_exchanges_day", text(SQLITE_DAY), *STATS_SUMMED).ddl_if(dialect="sqlite"),
        Index("ix_exchanges_request_id", "request_id"),
        Index("ix_exchanges_continuation_hash", "continuation_hash"),
        Index("ix_exchanges_last_event_id", "last_event_id"),
        # recorded_after: the order records were stored in (observer.store.stored).
        Index("ix_exchanges_stored_seq_id", "stored_seq", "id"),
        {
            "comment": "One row per observed LLM exchange (request + streamed response).",
            "postgresql_partition_by": PARTITION_BY,
        },
    )

    id: Mapped[RecordId] = mapped_column(primary_key=True, comment="Record id (UUID) assigned by the observer")
    dialect: Mapped[Label] = mapped_column(comment="Wire dialect that decoded the stream")
    scheme: Mapped[str] = mapped_column(String(16), comment="url.scheme")
    host: Mapped[str] = mapped_column(comment="server.address")
    port: Mapped[int | None] = mapped_column(comment="server.port")
    path: Mapped[str] = mapped_column(comment="url.path")
    method: Mapped[str] = mapped_column(comment="http.request.method")
    http_version: Mapped[str] = mapped_column(comment="network.protocol.version")
    client_address: Mapped[str | None] = mapped_column(
        comment="client.address as the proxy saw it, or its keyed pseudonym (setting client_address)"
    )
    proxy_user: Mapped[str | None] = mapped_column(comment="The user the proxy authenticated (proxyauth)")
    key_fingerprint: Mapped[str | None] = mapped_column(
        String(64), comment="hmac-sha256 fingerprint of the request's API credential (observer.identity)"
    )
    status_code: Mapped[int | None] = mapped_column(comment="http.response.status_code")
    started_at: Mapped[datetime] = mapped_column(
        primary_key=True, comment="Request start (UTC); the partition key on PostgreSQL"
    )
    ended_at: Mapped[datetime | None] = mapped_column(comment="Last byte or abort (UTC)")
    ttft_s: Mapped[float | None] = mapped_column(
        comment="gen_ai.server.time_to_first_token (seconds from request start)"
    )
    request_id: Mapped[str | None] = mapped_column(comment="Request id carried by the stream")
    request_model: Mapped[str | None] = mapped_column(comment="gen_ai.request.model")
    end_user: Mapped[str | None] = mapped_column(comment="enduser.id (as the request carried it)")
    model: Mapped[str | None] = mapped_column(comment="gen_ai.response.model")
    response_id: Mapped[str | None] = mapped_column(comment="gen_ai.response.id (the vendor's response/message id)")
    system_fingerprint: Mapped[str | None] = mapped_column(comment="openai.response.system_fingerprint")
    service_tier: Mapped[str | None] = mapped_column(comment="openai.response.service_tier (the tier that served it)")
    choices: Mapped[list[dict[str, Any]] | None] = mapped_column(
        NullableJSON, comment="Per-choice results when the response had several (n > 1); null: one answer"
    )
    input_tokens: Mapped[BigCount | None] = mapped_column(comment="gen_ai.usage.input_tokens")
    output_tokens: Mapped[BigCount | None] = mapped_column(comment="gen_ai.usage.output_tokens")
    cache_read_input_tokens: Mapped[BigCount | None] = mapped_column(
        comment="gen_ai.usage.cache_read.input_tokens (null: not reported)"
    )
    cache_creation_input_tokens: Mapped[BigCount | None] = mapped_column(
        comment="gen_ai.usage.cache_creation.input_tokens (null: not reported)"
    )
    reasoning_output_tokens: Mapped[BigCount | None] = mapped_column(
        comment="Output tokens spent on reasoning (null: not reported)"
    )
    total_tokens: Mapped[BigCount | None] = mapped_column(comment="Total tokens as the vendor sent it (null: not sent)")
    usage_details: Mapped[dict[str, Any] | None] = mapped_column(
        NullableJSON, comment="Other reported counts {group: {name: n}} (observer.records.Usage.details)"
    )
    usage_reported: Mapped[bool] = mapped_column(comment="A usage event was seen (counts may be null)")
    text: Mapped[str] = mapped_column(comment="All text blocks joined in index order")
    stop_reason: Mapped[str | None] = mapped_column(comment="gen_ai.response.finish_reasons (normalised)")
    stop_reason_raw: Mapped[str | None] = mapped_column(comment="Stop reason as the vendor sent it")
    error_reported: Mapped[bool] = mapped_column(comment="The stream carried an error event (code/message may be null)")
    error_code: Mapped[str | None] = mapped_column(comment="error.type")
    error_message: Mapped[str | None] = mapped_column(comment="Error message carried by the stream")
    outcome: Mapped[str] = mapped_column(String(32), comment="completed, error, client_aborted, ...")
    response_body: Mapped[str | None] = mapped_column(comment="Capped body of a non-2xx answer")
    transport_error: Mapped[str | None] = mapped_column(comment="Proxy error when the connection failed")
    response_bytes: Mapped[BigCount] = mapped_column(comment="Response body bytes seen on the wire")
    events: Mapped[BigCount] = mapped_column(comment="Canonical events decoded from the stream")
    request: Mapped[dict[str, Any]] = mapped_column(comment="Request facts (observer.records.RequestFacts)")
    provenance: Mapped[dict[str, Any] | None] = mapped_column(
        NullableJSON, comment="Where an ingested record came from (observer.records.Provenance); null: observed live"
    )
    created_at: Mapped[datetime] = mapped_column(
        server_default=func.now(), comment="Insert time on the database clock (UTC)"
    )
    writer_id: Mapped[str | None] = mapped_column(
        String(36), comment="Journal (observer process) that wrote the record; null before journals"
    )
    seq: Mapped[BigCount | None] = mapped_column(comment="The record's number in its writer's journal (1, 2, ...)")
    record_hash: Mapped[str | None] = mapped_column(
        String(64), comment="Chain hash (hex) over this record and its writer's previous entry (observer.store.chain)"
    )
    stored_seq: Mapped[BigCount | None] = mapped_column(
        comment="Order of storing (observer.store.stored): a counter on SQLite, the transaction id on PostgreSQL"
    )
    conversation_id: Mapped[RecordId | None] = mapped_column(
        comment="gen_ai.conversation.id: the first exchange of its conversation (derived, not chained)"
    )
    request_last_event_id: Mapped[str | None] = mapped_column(
        comment="The request's Last-Event-ID header: a resumed event stream (WHATWG HTML 9.2)"
    )
    last_event_id: Mapped[str | None] = mapped_column(comment="The id of the response's last SSE event")
    resumes_id: Mapped[RecordId | None] = mapped_column(
        comment="The exchange this one resumes (its last_event_id = this Last-Event-ID; derived, not chained)"
    )
    continuation_hash: Mapped[str | None] = mapped_column(
        String(64), comment="Hash of the request's messages and this answer (observer.conversation)"
    )
    search_vector: Mapped[str | None] = mapped_column(
        Text().with_variant(TSVECTOR(), "postgresql"),
        comment="PostgreSQL: the words of prompt and completion (observer.store.search); null on SQLite",
    )

    blocks: Mapped[list[BlockRow]] = relationship(
        order_by="BlockRow.position", cascade="all, delete-orphan", passive_deletes=True, lazy="raise"
    )
    tool_calls: Mapped[list[ToolCallRow]] = relationship(
        order_by="ToolCallRow.position", cascade="all, delete-orphan", passive_deletes=True, lazy="raise"
    )
    violations: Mapped[list[ViolationRow]] = relationship(
        order_by="ViolationRow.position", cascade="all, delete-orphan", passive_deletes=True, lazy="raise"
    )


class ChildRow:
    """The key of every child table of ``exchanges``: the record (its id and start, the
    partition key, so a month's child rows are partitioned with their records) and the item's
    place in its list (an ``Exchange`` list field, e.g. ``blocks``; ``observer.store.rows``)."""

    exchange_id: Mapped[RecordId] = mapped_column(primary_key=True, sort_order=-1)
    exchange_started_at: Mapped[datetime] = mapped_column(
        primary_key=True, sort_order=-1, comment="The record's started_at (the partition key)"
    )
    position: Mapped[int] = mapped_column(primary_key=True, sort_order=-1, comment="Order within the record")


def _child_args(comment: str, *indexes: Index) -> tuple[Any, ...]:
    """A child table's ``__table_args__``: the foreign key to its record (deleted with it), the
    same partitioning as ``exchanges``, and ``indexes``."""
    return (
        ForeignKeyConstraint(
            ["exchange_id", "exchange_started_at"], ["exchanges.id", "exchanges.started_at"], ondelete="CASCADE"
        ),
        *indexes,
        {"comment": comment, "postgresql_partition_by": "RANGE (exchange_started_at)"},
    )


def _walk_index(table: str, column: str) -> Index:
    """The index a child filter (``tool``, ``violation``) walks: (``column``, the record's start,
    its id), so the first page of the records with such a child is a backward range of it, in
    the list's order (``observer.store.query.page``)."""
    return Index(f"ix_{table}_{column}_started_at_id", column, "exchange_started_at", "exchange_id")


class BlockRow(ChildRow, Base):
    """One content block of a response (``observer.records.Block``)."""

    __tablename__ = "exchange_blocks"
    __table_args__ = _child_args("Content blocks of a response, in record order.")

    index: Mapped[BigCount] = mapped_column(comment="Block index as on the wire")
    type: Mapped[str]
    text: Mapped[str]
    stop_reason: Mapped[str | None]


class ToolCallRow(ChildRow, Base):
    """One tool invocation requested by the model (``observer.records.ToolCall``)."""

    __tablename__ = "exchange_tool_calls"
    __table_args__ = _child_args(
        "Tool calls requested by the model, in record order.", _walk_index("exchange_tool_calls", "name")
    )

    index: Mapped[BigCount | None] = mapped_column(comment="Tool call index as on the wire")
    call_id: Mapped[str | None] = mapped_column(comment="gen_ai.tool.call.id")
    name: Mapped[str | None] = mapped_column(comment="gen_ai.tool.name")
    arguments: Mapped[str] = mapped_column(comment="gen_ai.tool.call.arguments, exactly as streamed")
    declared: Mapped[bool | None] = mapped_column(
        comment="Name was among the request's declared tools; null: the request cannot declare them (AI SDK UI)"
    )


class ViolationRow(ChildRow, Base):
    """One protocol or lifecycle violation (``observer.records.Violation``)."""

    __tablename__ = "exchange_violations"
    __table_args__ = _child_args(
        "Protocol and lifecycle violations, in record order.", _walk_index("exchange_violations", "kind")
    )

    kind: Mapped[Label] = mapped_column(comment="observer.records.ViolationKind value")
    seq: Mapped[BigCount | None] = mapped_column(comment="Stream seq concerned (may exceed 2^53)")
    detail: Mapped[str]


class GapRow(Base):
    """Records a writer could not keep (``observer.journal``): dropped before the journal
    (``queue_full``, ``spool_full``, ``disk_error``), refused by the database (``rejected``), or
    missing from the journal when the database read it (``journal_lost``). A gap takes the seqs
    ``seq``..``seq_end`` of its writer's numbering, so seqs of records and gaps have no holes."""

    __tablename__ = "gaps"
    __table_args__ = {"comment": "Recording gaps: what was lost, when, how many, why."}

    writer_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    seq: Mapped[BigCount] = mapped_column(primary_key=True, comment="First seq of the gap")
    seq_end: Mapped[BigCount] = mapped_column(comment="Last seq of the gap (= seq when it takes one)")
    first_at: Mapped[datetime | None] = mapped_column(comment="First loss (UTC); null when unknown")
    last_at: Mapped[datetime | None] = mapped_column(comment="Last loss (UTC); null when unknown")
    dropped: Mapped[BigCount | None] = mapped_column(comment="Records lost; null when unknown")
    reason: Mapped[Label]
    detail: Mapped[str | None] = mapped_column(comment="Record id or error, where there is one")
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), comment="Insert time (database clock)")
    record_hash: Mapped[str] = mapped_column(String(64), comment="Chain hash (hex), as for a record")


class CheckpointRow(Base):
    """A signed statement of a writer's chain head (``observer.store.checkpoint``): ``seq``
    entries, the last one's hash, when, and the previous checkpoint's hash; signed (Ed25519) by
    the key in the observer's data folder, never kept in the database."""

    __tablename__ = "checkpoints"
    __table_args__ = {"comment": "Signed checkpoints of each writer's hash chain."}

    writer_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    number: Mapped[BigCount] = mapped_column(primary_key=True, comment="1, 2, ... per writer")
    seq: Mapped[BigCount] = mapped_column(comment="Entries of the chain covered (its last seq)")
    head_hash: Mapped[str] = mapped_column(String(64), comment="record_hash of entry seq (hex)")
    created_at: Mapped[datetime] = mapped_column(comment="When it was signed (UTC)")
    prev_hash: Mapped[str] = mapped_column(String(64), comment="SHA-256 of the previous checkpoint's note (hex)")
    key_id: Mapped[str] = mapped_column(String(16), comment="First 8 bytes of SHA-256 of the public key (hex)")
    events_seq: Mapped[BigCount | None] = mapped_column(
        comment="The store chain's head seen when signed (a writer's checkpoint; null: none)"
    )
    events_hash: Mapped[str | None] = mapped_column(String(64), comment="record_hash of store event events_seq (hex)")
    note: Mapped[str] = mapped_column(comment="The signed text")
    signature: Mapped[str] = mapped_column(comment="Ed25519 signature of the note (base64)")


class StoreMetaRow(Base):
    """Facts about the store itself; ``store_id`` names it, so a journal never replays into
    another database."""

    __tablename__ = "store_meta"
    __table_args__ = {"comment": "The store's own facts (store_id)."}

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str]


class StoreEventRow(Base):
    """The store's own chained history (``observer.store.events``): legal holds made and
    released, purges. Its chain is the writer ``store_id`` (``store_meta``), hashed and signed
    like a writer's records, so a hold or a purge cannot be added, changed or removed unseen."""

    __tablename__ = "store_events"
    __table_args__ = {"comment": "Chained store events: holds created and released, purges."}

    seq: Mapped[BigCount] = mapped_column(
        primary_key=True, autoincrement=False, comment="1, 2, ... in the store's chain"
    )
    kind: Mapped[Label] = mapped_column(comment="hold_created, hold_released or purge")
    at: Mapped[datetime] = mapped_column(comment="When the command ran (UTC)")
    actor: Mapped[str] = mapped_column(comment="Who ran it (--by, else the operating system user)")
    detail: Mapped[dict[str, Any]] = mapped_column(comment="The event's facts (observer.store.events)")
    record_hash: Mapped[str] = mapped_column(String(64), comment="Chain hash (hex), as for a record")
    created_at: Mapped[datetime] = mapped_column(server_default=func.now(), comment="Insert time (database clock)")


class HoldRow(Base):
    """A legal hold (``observer.store.holds``): records in its scope are never purged while it
    is active. The row is the current state; ``store_events`` holds its history, chained."""

    __tablename__ = "holds"
    __table_args__ = {"comment": "Legal holds: scope, reason, who made and released them."}

    id: Mapped[RecordId] = mapped_column(primary_key=True, comment="Hold id (UUID)")
    reason: Mapped[str]
    created_at: Mapped[datetime]
    created_by: Mapped[str]
    created_seq: Mapped[BigCount] = mapped_column(comment="The store event that made it")
    since: Mapped[datetime | None] = mapped_column(comment="Scope: records started at or after (UTC)")
    until: Mapped[datetime | None] = mapped_column(comment="Scope: records started at or before (UTC)")
    end_user: Mapped[str | None] = mapped_column(comment="Scope: enduser.id")
    host: Mapped[str | None] = mapped_column(comment="Scope: server.address")
    exchange_ids: Mapped[list[str] | None] = mapped_column(JSONType, comment="Scope: these record ids")
    released_at: Mapped[datetime | None]
    released_by: Mapped[str | None]
    release_reason: Mapped[str | None]
    released_seq: Mapped[BigCount | None] = mapped_column(comment="The store event that released it")


class HoldRecordRow(Base):
    """A record id a hold names (``Scope.exchange_ids``), one row each: what a purge's query
    joins, so a hold of many ids costs one bound parameter, not one per id."""

    __tablename__ = "hold_records"
    __table_args__ = {"comment": "Record ids named by legal holds."}

    hold_id: Mapped[RecordId] = mapped_column(primary_key=True)
    exchange_id: Mapped[RecordId] = mapped_column(primary_key=True)


class PurgedRunRow(Base):
    """A run of consecutive chain entries of one writer that a purge removed
    (``observer.store.purge``): seqs ``first_seq``..``last_seq``, all records, and the hash of the
    last, from which the chain goes on. Committed by digest in the purge's store event."""

    __tablename__ = "purged_runs"
    __table_args__ = {"comment": "Chain entries removed by purges, as runs of seqs per writer."}

    writer_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    first_seq: Mapped[BigCount] = mapped_column(primary_key=True, autoincrement=False)
    last_seq: Mapped[BigCount]
    last_hash: Mapped[str] = mapped_column(String(64), comment="record_hash of entry last_seq (hex)")
    event_seq: Mapped[BigCount] = mapped_column(comment="The purge's store event")


class ApiTokenRow(Base):
    """A token of the query API (``observer.api.tokens``): its role and a SHA-256 of the token,
    never the token itself. Rows are never deleted: a revoked token keeps its name, so the
    access log's principals stay resolvable."""

    __tablename__ = "api_tokens"
    __table_args__ = {"comment": "API tokens: name, role, SHA-256 of the token, who made and revoked them."}

    id: Mapped[RecordId] = mapped_column(primary_key=True, comment="Token id (UUID)")
    name: Mapped[str] = mapped_column(unique=True, comment="The principal the access log names")
    role: Mapped[str] = mapped_column(String(16), comment="viewer, auditor, responder or admin")
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True, comment="SHA-256 of the token (hex)")
    created_at: Mapped[datetime]
    created_by: Mapped[str]
    revoked_at: Mapped[datetime | None]
    revoked_by: Mapped[str | None]


class KeyOwnerRow(Base):
    """Who holds an API credential (``observer.store.keyowners``): its keyed fingerprint
    (``observer.identity``; never the credential), owner and team. Set by ``observer key-owner
    add``; each change is an event of the store's chain (``key_owner_set``)."""

    __tablename__ = "key_owners"
    __table_args__ = {"comment": "API credential fingerprints and their owners; never the credentials."}

    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True, comment="hmac-sha256:<32 hex>")
    owner: Mapped[str] = mapped_column(comment="Person or service holding the credential")
    team: Mapped[str | None] = mapped_column(comment="Team or cost centre")
    note: Mapped[str | None]
    created_at: Mapped[datetime]
    created_by: Mapped[str]
    updated_at: Mapped[datetime | None] = mapped_column(comment="Last change of owner/team (--replace)")
    updated_by: Mapped[str | None]


class AccessLogRow(Base):
    """One call of the query API, allowed or denied (``observer.api.access``), hash-chained as
    the writer ``access_log_writer(store_id)`` (``observer.store.chain.canonical_access``) and
    checkpointed like a writer's records."""

    __tablename__ = "access_log"
    __table_args__ = (
        Index("ix_access_log_at", "at"),
        Index("ix_access_log_principal_at", "principal", "at"),
        {"comment": "Chained log of every API call: who, what, when, the answer."},
    )

    seq: Mapped[BigCount] = mapped_column(primary_key=True, autoincrement=False, comment="1, 2, ... in its chain")
    at: Mapped[datetime] = mapped_column(comment="When the call was answered (UTC)")
    principal: Mapped[str | None] = mapped_column(comment="Token name (bootstrap: the configured token); null: none")
    role: Mapped[str | None] = mapped_column(String(16), comment="The principal's role; null when unauthenticated")
    client: Mapped[str | None] = mapped_column(comment="client.address of the call")
    method: Mapped[str] = mapped_column(String(16), comment="http.request.method")
    endpoint: Mapped[str] = mapped_column(comment="http.route (the route template), or the path when none matched")
    path: Mapped[str] = mapped_column(comment="url.path as requested (capped)")
    params: Mapped[dict[str, Any]] = mapped_column(comment="Query, path and body parameters (capped)")
    status: Mapped[int] = mapped_column(comment="http.response.status_code")
    rows: Mapped[BigCount | None] = mapped_column(comment="Rows returned; null when the call returns none")
    ids: Mapped[list[str] | None] = mapped_column(JSONType, comment="Ids of the records returned or changed")
    record_hash: Mapped[str] = mapped_column(String(64), comment="Chain hash (hex), as for a record")


class IncidentRow(Base):
    """A (serious) incident under review (EU AI Act Art. 73; ``observer.store.incidents``): its
    current state. Notes are append-only rows of ``incident_notes``; each linked exchange is
    under the legal hold made when it was linked (``incident_exchanges.hold_id``)."""

    __tablename__ = "incidents"
    __table_args__ = {"comment": "Incidents: category, awareness time, status; the report deadline derives from them."}

    id: Mapped[RecordId] = mapped_column(primary_key=True, comment="Incident id (UUID)")
    title: Mapped[str]
    category: Mapped[str] = mapped_column(String(64), comment="observer.store.incidents.CATEGORIES")
    aware_at: Mapped[datetime] = mapped_column(comment="When the deployer became aware (Art. 73(2))")
    status: Mapped[str] = mapped_column(String(32), comment="open, reported or closed")
    created_at: Mapped[datetime]
    created_by: Mapped[str]
    updated_at: Mapped[datetime]
    updated_by: Mapped[str]


class IncidentNoteRow(Base):
    """One note of an incident, append-only (never updated or deleted)."""

    __tablename__ = "incident_notes"
    __table_args__ = (
        ForeignKeyConstraint(["incident_id"], ["incidents.id"]),
        {"comment": "Append-only notes of incidents."},
    )

    incident_id: Mapped[RecordId] = mapped_column(primary_key=True)
    position: Mapped[int] = mapped_column(primary_key=True, autoincrement=False, comment="1, 2, ...")
    at: Mapped[datetime]
    author: Mapped[str]
    text: Mapped[str]


class IncidentExchangeRow(Base):
    """An exchange linked to an incident (by id: the record may be purged once released)."""

    __tablename__ = "incident_exchanges"
    __table_args__ = (
        ForeignKeyConstraint(["incident_id"], ["incidents.id"]),
        {"comment": "Exchanges linked to incidents."},
    )

    incident_id: Mapped[RecordId] = mapped_column(primary_key=True)
    exchange_id: Mapped[RecordId] = mapped_column(primary_key=True)
    linked_at: Mapped[datetime]
    linked_by: Mapped[str]
    hold_id: Mapped[RecordId] = mapped_column(comment="The legal hold made when it was linked")


class AlertRow(Base):
    """One alert fired by a proxy's rules (``observer.alerting``): what it said and where it
    went. Append-only but for ``deliveries``, updated as webhooks answer. Holds counts and ids,
    never record content."""

    __tablename__ = "alerts"
    __table_args__ = (
        Index("ix_alerts_fired_at_id", "fired_at", "id"),
        {"comment": "Alerts fired by the proxies' rules, and their deliveries to webhooks."},
    )

    id: Mapped[RecordId] = mapped_column(primary_key=True, comment="Alert id (UUID)")
    fired_at: Mapped[datetime]
    rule: Mapped[str] = mapped_column(String(100), comment="The rule's name in the alerts file")
    kind: Mapped[Label] = mapped_column(comment="observer.alerting.rules.RULE_KINDS")
    severity: Mapped[str] = mapped_column(String(16), comment="info, warning or critical")
    summary: Mapped[str]
    proxy: Mapped[str] = mapped_column(String(200), comment="The proxy process that fired it")
    exchange_id: Mapped[str | None] = mapped_column(String(36), comment="The record it is about, if one")
    details: Mapped[dict[str, Any]] = mapped_column(JSONType, comment="Counts and ids (no record content)")
    deliveries: Mapped[dict[str, Any]] = mapped_column(JSONType, comment="Webhook name -> delivered / failed: why")
