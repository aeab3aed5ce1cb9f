"""``RecordReader``: whole records read fast, page by page, for exports (``observer.store.export``).

``AuditStore.get`` reads through the ORM (an ``ExchangeRow`` and its children per record, then
``exchange_from_row`` and ``to_dict``): a few thousand records/s. An export must stream ~20,000
records/s, so this reads with the driver's own SQL on the connection's DBAPI cursor (no SQLAlchemy
type processing, no ORM objects, no result rows: the cursor's tuples; a driver error is raised as
SQLAlchemy's) in keyset pages of ``PAGE_ROWS`` records, the child rows of a page with one query
per child table, and builds each record's ``Exchange.to_dict()`` shape directly from the row: the
same values, keys and key order as ``AuditStore.get`` (the derived ``text`` and
``request_model`` and ``reasoning`` computed from the record, as ``get`` does, never read from their copied
columns; ``request`` with the keys and defaults of ``RequestFacts.from_dict``).
``tests/unit/test_export.py`` checks it against ``get``, as JSON bytes, for every fixture record.

What the drivers hand back, per backend: SQLite gives times as the naive UTC text SQLAlchemy
stored (``2026-06-01 08:00:00.123456``), the request JSON as bytes (``CAST AS BLOB``: orjson reads
them without a decode; ``jsontext.loads`` reads exactly what ``json.loads`` would), booleans as
0/1; PostgreSQL (psycopg) gives aware datetimes, ``jsonb`` parsed by ``jsontext.loads`` (set on
the cursor: psycopg's own is ``json.loads``, the same values, slower), booleans.

Order: a writer's records by ``seq`` (``ux_exchanges_writer_id_seq``), its gaps by ``seq``; rows
without a writer (stored before the journal) by ``(started_at, id)``
(``ix_exchanges_started_at_id``). Each page is one statement; nothing is held between pages but
the last key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from observer.jsontext import loads
from observer.records import Provenance, RequestFacts
from observer.shape import keys, rfc3339

#: Records per page (one statement per table and page).
PAGE_ROWS = 1000

Item = dict[str, Any]

#: ``exchanges`` columns read, in the order ``_record`` unpacks them.
_COLUMNS = (
    "id",
    "dialect",
    "scheme",
    "host",
    "port",
    "path",
    "method",
    "http_version",
    "status_code",
    "started_at",
    "ended_at",
    "ttft_s",
    "request_id",
    "request",
    "model",
    "input_tokens",
    "output_tokens",
    "usage_reported",
    "stop_reason",
    "stop_reason_raw",
    "error_reported",
    "error_code",
    "error_message",
    "outcome",
    "response_body",
    "transport_error",
    "response_bytes",
    "events",
    "provenance",
    "client_address",
    "proxy_user",
    "key_fingerprint",
    "response_id",
    "system_fingerprint",
    "service_tier",
    "choices",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_output_tokens",
    "total_tokens",
    "usage_details",
    "request_last_event_id",
    "last_event_id",
    "writer_id",
    "seq",
    "record_hash",
)
_REQUEST_COLUMN = '"request"'
_SELECT = "SELECT " + ", ".join(f'"{c}"' for c in _COLUMNS) + " FROM exchanges"
_CHILD_SQL = {
    "blocks": 'SELECT exchange_id, "index", type, text, stop_reason FROM exchange_blocks',
    "tool_calls": 'SELECT exchange_id, "index", call_id, name, arguments, declared FROM exchange_tool_calls',
    "violations": "SELECT exchange_id, kind, seq, detail FROM exchange_violations",
}
_GAP_COLUMNS = ("seq", "seq_end", "first_at", "last_at", "dropped", "reason", "detail", "record_hash")
_GAP_SELECT = "SELECT " + ", ".join(_GAP_COLUMNS) + " FROM gaps"
#: ``RequestFacts.from_dict`` of a lenient class: (key, default maker) in field order.
_REQUEST_KEYS = tuple((k.name, k.missing) for k in keys(RequestFacts))
_REQUEST_NAMES = tuple(name for name, _ in _REQUEST_KEYS)
_PROVENANCE_NAMES = tuple(k.name for k in keys(Provenance))


@dataclass(frozen=True, slots=True)
class RecordFilter:
    """Which records an export takes. Times are aware UTC datetimes on ``started_at``:
    ``since`` inclusive, ``until`` exclusive (consecutive exports tile without overlap). Each
    tuple is a set of accepted values (empty: any): ``models`` matches ``model`` (the
    response's) or ``request_model`` (the request's), ``users`` ``request.end_user``,
    ``writers`` the journal's ``writer_id`` (rows without one are then left out). Values of
    one field are alternatives (OR); fields combine with AND."""

    since: datetime | None = None
    until: datetime | None = None
    models: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    dialects: tuple[str, ...] = ()
    outcomes: tuple[str, ...] = ()
    writers: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The filter as the manifest states it (times RFC 3339 UTC, value lists)."""
        return {
            "since": rfc3339(self.since),
            "until": rfc3339(self.until),
            "model": list(self.models),
            "host": list(self.hosts),
            "user": list(self.users),
            "dialect": list(self.dialects),
            "outcome": list(self.outcomes),
            "writer": list(self.writers),
        }


class RecordReader:
    """Pages of records and gaps from one open connection (SQLite or PostgreSQL).

    Every page is a list of dicts: a record is its ``Exchange.to_dict()`` preceded by
    ``"kind": "exchange"``, ``writer_id``, ``seq`` and ``record_hash`` (``None`` for rows stored
    before the journal); a gap is ``{"kind": "gap", "writer_id", "seq", "seq_end", "first_at",
    "last_at", "dropped", "reason", "detail", "record_hash"}`` (times RFC 3339 UTC or ``None``).
    Database errors propagate (``sqlalchemy.exc.SQLAlchemyError``).
    """

    def __init__(self, conn: Connection, page_rows: int = PAGE_ROWS) -> None:
        self._conn = conn
        self._page = page_rows
        self._sqlite = conn.dialect.name == "sqlite"
        self._dbapi_error = conn.dialect.loaded_dbapi.Error

    # ----- the statements -----

    def _run(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The rows (plain tuples) of ``sql`` on the connection's DBAPI cursor; a driver error
        is raised as SQLAlchemy's (``DBAPIError.instance``), as ``exec_driver_sql`` would."""
        if self._sqlite:
            sql = sql.replace(_REQUEST_COLUMN, 'CAST("request" AS BLOB)')  # bytes: orjson reads them undecoded
        else:
            sql = sql.replace("?", "%s")  # psycopg's placeholder (the SQL here has no other "?")
        cursor = self._conn.connection.cursor()
        if not self._sqlite:
            from psycopg.types.json import set_json_loads

            set_json_loads(loads, cursor)  # jsonb as json.loads reads it, at orjson's speed (this cursor only)
        try:
            cursor.execute(sql, tuple(params))
            return cursor.fetchall()
        except self._dbapi_error as exc:
            raise DBAPIError.instance(sql, list(params), exc, self._dbapi_error) from exc
        finally:
            cursor.close()

    def _bind_time(self, when: datetime) -> Any:
        """A time as the column holds it: SQLite's naive UTC text (SQLAlchemy's storage
        format, which compares in time order), else the aware datetime."""
        if self._sqlite:
            return when.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
        return when

    def _where(self, f: RecordFilter, *, times: bool = True) -> tuple[str, list[Any]]:
        """`` AND ...`` conditions of the filter's record fields, and their parameters."""
        sql: list[str] = []
        params: list[Any] = []
        if times and f.since is not None:
            sql.append("started_at >= ?")
            params.append(self._bind_time(f.since))
        if times and f.until is not None:
            sql.append("started_at < ?")
            params.append(self._bind_time(f.until))
        for column, values in (("host", f.hosts), ("end_user", f.users), ("dialect", f.dialects)):
            if values:
                sql.append(f"{column} IN ({_marks(values)})")
                params.extend(values)
        if f.outcomes:
            sql.append(f"outcome IN ({_marks(f.outcomes)})")
            params.extend(f.outcomes)
        if f.models:
            sql.append(f"(model IN ({_marks(f.models)}) OR request_model IN ({_marks(f.models)}))")
            params.extend([*f.models, *f.models])
        return "".join(f" AND {s}" for s in sql), params

    # ----- counts and spans -----

    def count(self, f: RecordFilter, writer_id: str | None, last_seq: int = 0) -> int:
        """Records of ``writer_id`` up to ``last_seq`` (or, with ``None``, rows without a
        writer) that ``f`` takes."""
        where, params = self._where(f)
        if writer_id is None:
            rows = self._run(f"SELECT count(*) FROM exchanges WHERE writer_id IS NULL{where}", params)
        else:
            sql = f"SELECT count(*) FROM exchanges WHERE writer_id = ? AND seq <= ?{where}"
            rows = self._run(sql, [writer_id, last_seq, *params])
        return int(rows[0][0])

    def seq_span(self, f: RecordFilter, writer_id: str, last_seq: int) -> tuple[int, int] | None:
        """(first, last) seq of the writer's records started in ``f``'s time range, up to
        ``last_seq`` (the other fields of ``f`` ignored: what a gap lost is unknown), or ``None``
        when there are none; ``(1, last_seq)`` without a time range."""
        if f.since is None and f.until is None:
            return (1, last_seq) if last_seq >= 1 else None
        where, params = self._where(RecordFilter(since=f.since, until=f.until))
        sql = f"SELECT min(seq), max(seq) FROM exchanges WHERE writer_id = ? AND seq <= ?{where}"
        lo, hi = self._run(sql, [writer_id, last_seq, *params])[0]
        return None if lo is None else (int(lo), int(hi))

    # ----- pages -----

    def chained(self, f: RecordFilter, writer_id: str, first_seq: int, last_seq: int) -> Iterator[list[Item]]:
        """The writer's records with ``first_seq <= seq <= last_seq`` that ``f`` takes, in seq
        order, a page at a time (keyset on ``seq``)."""
        where, params = self._where(f)
        sql = f"{_SELECT} WHERE writer_id = ? AND seq > ? AND seq <= ?{where} ORDER BY seq LIMIT {self._page}"
        after = first_seq - 1
        while True:
            rows = self._run(sql, [writer_id, after, last_seq, *params])
            if rows:
                yield self._records(rows)
            if len(rows) < self._page:
                return
            after = rows[-1][_SEQ]

    def unchained(self, f: RecordFilter) -> Iterator[list[Item]]:
        """Rows without a writer that ``f`` takes, by ``(started_at, id)``, a page at a time."""
        where, params = self._where(f)
        first = f"{_SELECT} WHERE writer_id IS NULL{where} ORDER BY started_at, id LIMIT {self._page}"
        later = (
            f"{_SELECT} WHERE writer_id IS NULL AND (started_at > ? OR (started_at = ? AND id > ?)){where}"
            f" ORDER BY started_at, id LIMIT {self._page}"
        )
        rows = self._run(first, params)
        while True:
            if rows:
                yield self._records(rows)
            if len(rows) < self._page:
                return
            at, last_id = rows[-1][_STARTED_AT], rows[-1][0]
            rows = self._run(later, [at, at, last_id, *params])

    def seq_at(self, f: RecordFilter, writer_id: str, last_seq: int, offset: int) -> int:
        """The seq of the writer's record number ``offset`` (from 0) among those up to
        ``last_seq`` that ``f`` takes (``last_seq`` when there are fewer): where to cut the
        writer's records into parts of an export run in several processes."""
        where, params = self._where(f)
        sql = f"SELECT seq FROM exchanges WHERE writer_id = ? AND seq <= ?{where} ORDER BY seq LIMIT 1 OFFSET ?"
        rows = self._run(sql, [writer_id, last_seq, *params, offset])
        return int(rows[0][0]) if rows else last_seq

    def gaps(
        self,
        writer_id: str,
        last_seq: int,
        span: tuple[int, int] | None,
        since: datetime | None,
        until: datetime | None,
        first_seq: int = 1,
    ) -> Iterator[list[Item]]:
        """The writer's gaps starting at ``first_seq`` to ``last_seq`` that meet the seq ``span``
        or whose loss times (both known) overlap ``[since, until)`` (when a time range is
        given), in seq order, a page at a time."""
        meets: list[str] = []
        params: list[Any] = []
        if span is not None:
            meets.append("(seq <= ? AND seq_end >= ?)")
            params += [span[1], span[0]]
        if since is not None or until is not None:
            overlap = ["first_at IS NOT NULL", "last_at IS NOT NULL"]
            if since is not None:
                overlap.append("last_at >= ?")
                params.append(self._bind_time(since))
            if until is not None:
                overlap.append("first_at < ?")
                params.append(self._bind_time(until))
            meets.append("(" + " AND ".join(overlap) + ")")
        if not meets:
            return
        sql = (
            f"{_GAP_SELECT} WHERE writer_id = ? AND seq > ? AND seq <= ? AND ({' OR '.join(meets)})"
            f" ORDER BY seq LIMIT {self._page}"
        )
        after = first_seq - 1
        while True:
            rows = self._run(sql, [writer_id, after, last_seq, *params])
            if rows:
                yield [self._gap(writer_id, r) for r in rows]
            if len(rows) < self._page:
                return
            after = rows[-1][0]

    # ----- rows to dicts -----

    def _time(self, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            if len(value) == 26 and value[10] == " " and value[19] == ".":
                return f"{value[:10]}T{value[11:]}Z"  # SQLAlchemy's SQLite text, naive UTC
            value = datetime.fromisoformat(value)
            if value.tzinfo is None:
                value = value.replace(tzinfo=timezone.utc)
        return rfc3339(value)

    def _children(self, ids: list[str]) -> dict[str, dict[str, list[Item]]]:
        """Per record id, its ``blocks``, ``tool_calls`` and ``violations`` dicts in list order."""
        out: dict[str, dict[str, list[Item]]] = {i: {"blocks": [], "tool_calls": [], "violations": []} for i in ids}
        marks = _marks(ids)
        for name, select in _CHILD_SQL.items():
            for row in self._run(f"{select} WHERE exchange_id IN ({marks}) ORDER BY exchange_id, position", ids):
                if name == "blocks":
                    item: Item = {"index": row[1], "type": row[2], "text": row[3], "stop_reason": row[4]}
                elif name == "tool_calls":
                    item = {
                        "index": row[1],
                        "id": row[2],
                        "name": row[3],
                        "arguments": row[4],
                        "declared": None if row[5] is None else bool(row[5]),
                    }
                else:
                    item = {"kind": row[1], "seq": row[2], "detail": row[3]}
                out[row[0]][name].append(item)
        return out

    def _records(self, rows: list[Any]) -> list[Item]:
        children = self._children([r[0] for r in rows])
        return [self._record(r, children[r[0]]) for r in rows]

    def _record(self, row: Any, children: dict[str, list[Item]]) -> Item:
        (
            rid,
            dialect,
            scheme,
            host,
            port,
            path,
            method,
            http_version,
            status_code,
            started_at,
            ended_at,
            ttft_s,
            request_id,
            request,
            model,
            input_tokens,
            output_tokens,
            usage_reported,
            stop_reason,
            stop_reason_raw,
            error_reported,
            error_code,
            error_message,
            outcome,
            response_body,
            transport_error,
            response_bytes,
            events,
            provenance,
            client_address,
            proxy_user,
            key_fingerprint,
            response_id,
            system_fingerprint,
            service_tier,
            choices,
            cache_read_input_tokens,
            cache_creation_input_tokens,
            reasoning_output_tokens,
            total_tokens,
            usage_details,
            request_last_event_id,
            last_event_id,
            writer_id,
            seq,
            record_hash,
        ) = row
        req = loads(request) if isinstance(request, bytes | str) else request
        if tuple(req) != _REQUEST_NAMES:  # an older record, or jsonb's key order: RequestFacts.from_dict's
            req = {name: req[name] if name in req else missing() for name, missing in _REQUEST_KEYS}  # type: ignore[misc]
        blocks = children["blocks"]
        if len(blocks) > 1 and any(blocks[i]["index"] > blocks[i + 1]["index"] for i in range(len(blocks) - 1)):
            blocks.sort(key=_by_index)  # to_dict's sorted_by("index"), stable
        return {
            "kind": "exchange",
            "writer_id": writer_id,
            "seq": seq,
            "record_hash": record_hash,
            "id": rid,
            "dialect": dialect,
            "scheme": scheme,
            "host": host,
            "port": port,
            "path": path,
            "method": method,
            "http_version": http_version,
            "client_address": client_address,
            "proxy_user": proxy_user,
            "key_fingerprint": key_fingerprint,
            "status_code": status_code,
            "started_at": self._time(started_at),
            "ended_at": self._time(ended_at),
            "ttft_s": ttft_s,
            "request_id": request_id,
            "request": req,
            "request_model": req["model"],
            "model": model,
            "text": _text(blocks),
            "response_id": response_id,
            "system_fingerprint": system_fingerprint,
            "service_tier": service_tier,
            "blocks": blocks,
            "reasoning": _text(blocks, "reasoning"),
            "choices": _json(choices),
            "tool_calls": children["tool_calls"],
            "usage": {
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "cache_read_input_tokens": cache_read_input_tokens,
                "cache_creation_input_tokens": cache_creation_input_tokens,
                "reasoning_output_tokens": reasoning_output_tokens,
                "total_tokens": total_tokens,
                "details": _json(usage_details),
                "reported": bool(usage_reported),
            },
            "stop_reason": stop_reason,
            "stop_reason_raw": stop_reason_raw,
            "error": {"code": error_code, "message": error_message} if error_reported else None,
            "outcome": outcome,
            "violations": children["violations"],
            "response_body": response_body,
            "transport_error": transport_error,
            "response_bytes": response_bytes,
            "events": events,
            "provenance": _provenance(provenance),
            "request_last_event_id": request_last_event_id,
            "last_event_id": last_event_id,
        }

    def _gap(self, writer_id: str, row: Any) -> Item:
        seq, seq_end, first_at, last_at, dropped, reason, detail, record_hash = row
        return {
            "kind": "gap",
            "writer_id": writer_id,
            "seq": seq,
            "seq_end": seq_end,
            "first_at": self._time(first_at),
            "last_at": self._time(last_at),
            "dropped": dropped,
            "reason": reason,
            "detail": detail,
            "record_hash": record_hash,
        }


#: Keys of a record line that are not ``Exchange.to_dict()``'s (the journal's numbering, the chain).
JOURNAL_KEYS = ("kind", "writer_id", "seq", "record_hash")
_SEQ = _COLUMNS.index("seq")
_STARTED_AT = _COLUMNS.index("started_at")


def _text(blocks: list[Item], kind: str = "text") -> str:
    """``Exchange.text`` (``Exchange.reasoning`` for ``kind`` ``"reasoning"``): the blocks of
    that type, their text joined in index order (``blocks`` is sorted)."""
    if len(blocks) == 1:
        return blocks[0]["text"] if blocks[0]["type"] == kind else ""
    return "".join([b["text"] for b in blocks if b["type"] == kind])


def _json(value: Any) -> Any:
    """A nullable JSON column's value (SQLite: JSON text; PostgreSQL: jsonb, parsed)."""
    return loads(value) if isinstance(value, bytes | str) else value


def _provenance(value: Any) -> Item | None:
    """``Exchange.provenance`` as ``to_dict`` writes it (``None``: observed live), from the
    column (SQLite: JSON text; PostgreSQL: jsonb, parsed, its keys in jsonb's order)."""
    if value is None:
        return None
    d = loads(value) if isinstance(value, bytes | str) else value
    if d is None or tuple(d) == _PROVENANCE_NAMES:
        return d
    return {name: d[name] for name in _PROVENANCE_NAMES}


def _by_index(block: Item) -> Any:
    return block["index"]


def _marks(values: Sequence[Any]) -> str:
    return ", ".join("?" * len(values))


__all__ = ["JOURNAL_KEYS", "PAGE_ROWS", "RecordFilter", "RecordReader"]
