"""``AuditStore``: writes ``Exchange`` records to SQL (SQLite or PostgreSQL) and reads them back.

Reads return exactly the JSON shape of ``Exchange.to_dict()`` (``GET /v1/exchanges/{id}``).
Writes are idempotent on the record id (ids already stored are skipped), so a batch replayed
after an ambiguous failure (commit done, acknowledgement lost) or after a crash in the middle of a
spool replay is absorbed instead of failing forever on a duplicate key.

The schema is created by the Alembic migrations (``observer.store.migrate.upgrade``); this module
never calls ``create_all``.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, create_engine, event, insert, select, text, tuple_
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.sql import FromClause

from observer.errors import ObserverError
from observer.records import (
    Block,
    ErrorInfo,
    Exchange,
    RequestFacts,
    ToolCall,
    Usage,
    Violation,
    rfc3339,
)
from observer.store.models import BlockRow, ExchangeRow, ToolCallRow, ViolationRow
from observer.store.portable import make_portable

log = logging.getLogger(__name__)

#: Largest page ``AuditStore.list`` serves.
LIST_LIMIT_MAX = 500
#: Longest cursor accepted (a real one is under 100 characters).
CURSOR_MAX_CHARS = 512
#: Ids per ``IN (...)`` when looking for records already stored (SQLite allows 32766 parameters).
_IN_CHUNK = 1000
#: Seconds psycopg waits for a TCP connection unless the URL says otherwise.
PG_CONNECT_TIMEOUT_S = 10

Item = dict[str, Any]
Page = tuple[list[Item], str | None]

_SUMMARY_COLUMNS = (
    ExchangeRow.id,
    ExchangeRow.dialect,
    ExchangeRow.scheme,
    ExchangeRow.host,
    ExchangeRow.port,
    ExchangeRow.path,
    ExchangeRow.method,
    ExchangeRow.status_code,
    ExchangeRow.started_at,
    ExchangeRow.ended_at,
    ExchangeRow.ttft_s,
    ExchangeRow.request_id,
    ExchangeRow.request_model,
    ExchangeRow.end_user,
    ExchangeRow.model,
    ExchangeRow.input_tokens,
    ExchangeRow.output_tokens,
    ExchangeRow.usage_reported,
    ExchangeRow.stop_reason,
    ExchangeRow.error_reported,
    ExchangeRow.error_code,
    ExchangeRow.error_message,
    ExchangeRow.outcome,
    ExchangeRow.response_bytes,
    ExchangeRow.events,
)


class InvalidCursor(ObserverError, ValueError):
    """A pagination cursor that this store did not issue (or that was altered)."""

    code = "invalid_cursor"


class AuditStore:
    """The SQL audit store: ``write_many`` from the writer thread, ``get``/``list`` for the API.

    Thread-safe (one engine and connection pool; a session per call). Build it from a URL
    (``sqlite:///observer.db``, ``postgresql+psycopg://...``) or from an existing engine.
    On SQLite every connection gets ``journal_mode=WAL``, ``foreign_keys=ON`` and
    ``synchronous=FULL`` (a committed batch survives power loss).
    """

    def __init__(self, url: str) -> None:
        self._engine = _create_engine(url)

    @classmethod
    def from_engine(cls, engine: Engine) -> AuditStore:
        """Wraps an existing engine (its SQLite connections made after this get the pragmas)."""
        store = cls.__new__(cls)
        if engine.dialect.name == "sqlite" and not event.contains(engine, "connect", _sqlite_on_connect):
            event.listen(engine, "connect", _sqlite_on_connect)
        store._engine = engine
        return store

    @property
    def engine(self) -> Engine:
        """The underlying engine (for migrations and tests)."""
        return self._engine

    def write_many(self, records: Sequence[Exchange]) -> None:
        """Inserts the records and their blocks, tool calls and violations in one transaction.

        Bulk ``INSERT``s: one multi-row statement per table. A record whose id is already stored
        is skipped whole, as is a repeat of an id within ``records``. Nothing is written when it
        raises: ``sqlalchemy.exc.SQLAlchemyError`` when the database refuses (``DataError`` for a
        value it cannot store), ``OverflowError``/``UnicodeEncodeError`` when the driver cannot
        encode one (SQLite integer beyond 64 bits, lone surrogate).
        """
        exchanges, children = _rows_from_records([make_portable(r) for r in records])
        if not exchanges:
            return
        ids = [r["id"] for r in exchanges]
        id_column = ExchangeRow.__table__.c.id
        with Session(self._engine) as session, session.begin():
            stored: set[str] = set()
            for start in range(0, len(ids), _IN_CHUNK):
                stored.update(session.scalars(select(id_column).where(id_column.in_(ids[start : start + _IN_CHUNK]))))
            if stored:
                exchanges = [r for r in exchanges if r["id"] not in stored]
                children = {t: [r for r in rows if r["exchange_id"] not in stored] for t, rows in children.items()}
            # Core inserts on the tables (the ORM's bulk insert would split the batch into one
            # statement per run of rows with the same NULL columns).
            for table, rows in ((ExchangeRow.__table__, exchanges), *children.items()):
                if rows:
                    session.execute(insert(table), rows)
        if stored:
            log.info("audit store: %d of %d records were already stored", len(stored), len(ids))

    def get(self, id: str) -> Item | None:  # noqa: A002 - the record's field name
        """The record with this id as ``Exchange.to_dict()`` returns it, or ``None``."""
        with Session(self._engine) as session:
            row = session.get(
                ExchangeRow,
                id,
                options=[
                    selectinload(ExchangeRow.blocks),
                    selectinload(ExchangeRow.tool_calls),
                    selectinload(ExchangeRow.violations),
                ],
            )
            return None if row is None else _exchange_from_row(row).to_dict()

    def ping(self) -> None:
        """Runs ``SELECT 1``; raises ``sqlalchemy.exc.SQLAlchemyError`` when unreachable."""
        with self._engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    def dispose(self) -> None:
        """Closes the pooled connections (the store can still be used; it reconnects)."""
        self._engine.dispose()

    def list(self, limit: int = 50, cursor: str | None = None) -> Page:
        """A page of record summaries, newest first by ``(started_at, id)``, and the cursor of the
        next page (``None`` on the last page).

        ``limit``: 1..``LIST_LIMIT_MAX`` (``ValueError`` outside). ``cursor``: ``None`` or a
        ``next_cursor`` from a previous page; anything else raises ``InvalidCursor``. Keyset
        pagination: rows inserted meanwhile never shift or repeat items across pages.
        """
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise ValueError(f"limit must be within 1..{LIST_LIMIT_MAX}, not {limit}")
        stmt = (
            select(*_SUMMARY_COLUMNS)
            .order_by(ExchangeRow.started_at.desc(), ExchangeRow.id.desc())
            .limit(limit + 1)
        )
        if cursor is not None:
            started_at, last_id = decode_cursor(cursor)
            stmt = stmt.where(tuple_(ExchangeRow.started_at, ExchangeRow.id) < tuple_(started_at, last_id))
        with Session(self._engine) as session:
            rows = session.execute(stmt).all()
        items = [_summary_from_row(r._mapping) for r in rows[:limit]]
        next_cursor = encode_cursor(rows[limit - 1].started_at, rows[limit - 1].id) if len(rows) > limit else None
        return items, next_cursor


def encode_cursor(started_at: datetime, id: str) -> str:  # noqa: A002
    """Opaque cursor: unpadded urlsafe base64 of the JSON ``[started_at RFC 3339, id]``."""
    raw = json.dumps([rfc3339(started_at), id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Inverse of ``encode_cursor``; raises ``InvalidCursor`` on anything it did not produce."""
    try:
        if len(cursor) > CURSOR_MAX_CHARS:
            raise ValueError("too long")
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = json.loads(raw)
        if not (isinstance(decoded, list) and len(decoded) == 2 and all(isinstance(x, str) for x in decoded)):
            raise TypeError("a cursor is a list of two strings")
        started_at, last_id = decoded
        when = datetime.fromisoformat(started_at)
        if when.tzinfo is None:
            raise ValueError("cursor time without offset")
        return when.astimezone(timezone.utc), last_id
    except (ValueError, TypeError, OverflowError, binascii.Error) as exc:
        raise InvalidCursor(f"invalid cursor: {cursor[:40]!r}") from exc


def exchange_from_dict(d: Mapping[str, Any]) -> Exchange:
    """Rebuilds an ``Exchange`` from its ``to_dict()`` form (derived keys ``text`` and
    ``request_model`` are ignored): ``exchange_from_dict(r.to_dict()).to_dict() == r.to_dict()``.

    Used to replay the writer's JSON-lines spool. Raises ``KeyError``, ``TypeError`` or
    ``ValueError`` on a malformed dict.
    """
    req = d["request"]
    usage = d["usage"]
    error = d["error"]
    return Exchange(
        id=d["id"],
        dialect=d["dialect"],
        scheme=d["scheme"],
        host=d["host"],
        port=d["port"],
        path=d["path"],
        method=d["method"],
        http_version=d["http_version"],
        status_code=d["status_code"],
        started_at=_parse_time(d["started_at"]),
        ended_at=None if d["ended_at"] is None else _parse_time(d["ended_at"]),
        ttft_s=d["ttft_s"],
        request_id=d["request_id"],
        request=RequestFacts.from_dict(req),
        model=d["model"],
        blocks=[
            Block(index=b["index"], type=b["type"], text=b["text"], stop_reason=b["stop_reason"]) for b in d["blocks"]
        ],
        tool_calls=[
            ToolCall(index=t["index"], id=t["id"], name=t["name"], arguments=t["arguments"], declared=t["declared"])
            for t in d["tool_calls"]
        ],
        usage=Usage(
            input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"], reported=usage["reported"]
        ),
        stop_reason=d["stop_reason"],
        stop_reason_raw=d["stop_reason_raw"],
        error=None if error is None else ErrorInfo(code=error["code"], message=error["message"]),
        outcome=d["outcome"],
        violations=[Violation(kind=v["kind"], seq=v["seq"], detail=v["detail"]) for v in d["violations"]],
        response_body=d["response_body"],
        transport_error=d["transport_error"],
        response_bytes=d["response_bytes"],
        events=d["events"],
    )


def _parse_time(value: str) -> datetime:
    when = datetime.fromisoformat(value)
    if when.tzinfo is None:
        raise ValueError(f"time without offset: {value!r}")
    return when.astimezone(timezone.utc)


def _rows_from_records(records: Sequence[Exchange]) -> tuple[list[Item], dict[FromClause, list[Item]]]:
    """Row dicts (column names) for ``exchanges`` and each child table; the first record
    of a repeated id wins."""
    exchanges: list[Item] = []
    blocks: list[Item] = []
    tool_calls: list[Item] = []
    violations: list[Item] = []
    seen: set[str] = set()
    for r in records:
        if r.id in seen:
            continue
        seen.add(r.id)
        exchanges.append(
            {
                "id": r.id,
                "dialect": r.dialect,
                "scheme": r.scheme,
                "host": r.host,
                "port": r.port,
                "path": r.path,
                "method": r.method,
                "http_version": r.http_version,
                "status_code": r.status_code,
                "started_at": r.started_at,
                "ended_at": r.ended_at,
                "ttft_s": r.ttft_s,
                "request_id": r.request_id,
                "request_model": r.request_model,
                "end_user": r.request.end_user,
                "model": r.model,
                "input_tokens": r.usage.input_tokens,
                "output_tokens": r.usage.output_tokens,
                "usage_reported": r.usage.reported,
                "text": r.text,
                "stop_reason": r.stop_reason,
                "stop_reason_raw": r.stop_reason_raw,
                "error_reported": r.error is not None,
                "error_code": r.error.code if r.error else None,
                "error_message": r.error.message if r.error else None,
                "outcome": str(r.outcome),
                "response_body": r.response_body,
                "transport_error": r.transport_error,
                "response_bytes": r.response_bytes,
                "events": r.events,
                "request": r.request.to_dict(),
            }
        )
        blocks.extend(
            {
                "exchange_id": r.id,
                "position": i,
                "index": b.index,
                "type": b.type,
                "text": b.text,
                "stop_reason": b.stop_reason,
            }
            for i, b in enumerate(r.blocks)
        )
        tool_calls.extend(
            {
                "exchange_id": r.id,
                "position": i,
                "index": t.index,
                "call_id": t.id,
                "name": t.name,
                "arguments": t.arguments,
                "declared": t.declared,
            }
            for i, t in enumerate(r.tool_calls)
        )
        violations.extend(
            {"exchange_id": r.id, "position": i, "kind": str(v.kind), "seq": v.seq, "detail": v.detail}
            for i, v in enumerate(r.violations)
        )
    return exchanges, {
        BlockRow.__table__: blocks,
        ToolCallRow.__table__: tool_calls,
        ViolationRow.__table__: violations,
    }


def _exchange_from_row(row: ExchangeRow) -> Exchange:
    req = row.request
    return Exchange(
        id=row.id,
        dialect=row.dialect,
        scheme=row.scheme,
        host=row.host,
        port=row.port,
        path=row.path,
        method=row.method,
        http_version=row.http_version,
        status_code=row.status_code,
        started_at=row.started_at,
        ended_at=row.ended_at,
        ttft_s=row.ttft_s,
        request_id=row.request_id,
        request=RequestFacts.from_dict(req),
        model=row.model,
        blocks=[Block(index=b.index, type=b.type, text=b.text, stop_reason=b.stop_reason) for b in row.blocks],
        tool_calls=[
            ToolCall(index=t.index, id=t.call_id, name=t.name, arguments=t.arguments, declared=t.declared)
            for t in row.tool_calls
        ],
        usage=Usage(input_tokens=row.input_tokens, output_tokens=row.output_tokens, reported=row.usage_reported),
        stop_reason=row.stop_reason,
        stop_reason_raw=row.stop_reason_raw,
        error=ErrorInfo(code=row.error_code, message=row.error_message) if row.error_reported else None,
        outcome=row.outcome,
        violations=[Violation(kind=v.kind, seq=v.seq, detail=v.detail) for v in row.violations],
        response_body=row.response_body,
        transport_error=row.transport_error,
        response_bytes=row.response_bytes,
        events=row.events,
    )


def _summary_from_row(m: Mapping[str, Any]) -> Item:
    return {
        "id": m["id"],
        "dialect": m["dialect"],
        "scheme": m["scheme"],
        "host": m["host"],
        "port": m["port"],
        "path": m["path"],
        "method": m["method"],
        "status_code": m["status_code"],
        "started_at": rfc3339(m["started_at"]),
        "ended_at": rfc3339(m["ended_at"]),
        "ttft_s": m["ttft_s"],
        "request_id": m["request_id"],
        "request_model": m["request_model"],
        "end_user": m["end_user"],
        "model": m["model"],
        "usage": {
            "input_tokens": m["input_tokens"],
            "output_tokens": m["output_tokens"],
            "reported": m["usage_reported"],
        },
        "stop_reason": m["stop_reason"],
        "error": {"code": m["error_code"], "message": m["error_message"]} if m["error_reported"] else None,
        "outcome": m["outcome"],
        "response_bytes": m["response_bytes"],
        "events": m["events"],
    }


def _create_engine(url: str) -> Engine:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    # hide_parameters: driver errors must not carry prompt or completion text into the logs.
    engine = create_engine(parsed, hide_parameters=True, pool_pre_ping=True, connect_args=connect_args)
    if backend == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
    return engine


def _sqlite_on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
    finally:
        cursor.close()

