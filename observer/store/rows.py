"""Rows of the audit tables from ``Exchange`` records and back, derived from the record's keys
(``observer.shape``) and the table columns (``observer.store.models``).

The rule, per key of a record class (``Exchange``, and the classes of its lists):

- a key with a column of its own name: the value (``str()`` for ``AS_STR`` keys); a nested
  record there (``request``) is stored as its ``to_dict()`` JSON; a derived key (``text``,
  ``request_model``) is written for queries and never read back (nor stored without a column);
- a list of records (``blocks``, ``tool_calls``, ``violations``): one row each in the child
  table of ``ExchangeRow``'s relationship of that name, with ``exchange_id``,
  ``exchange_started_at`` (the record's, the partition key) and ``position`` (the list order);
- a nested record without a column of its name (``usage``, ``error``): flattened into the
  columns that ``FLATTENED`` names.

``FLATTENED`` is the one place where a record path and a column name differ. The three mappings
(``row_of`` per table, ``exchange_from_row``, ``summary_from_row``) are compiled once, at
import, from that rule (``SOURCES`` shows them), so they cost what hand-written ones would.
Deriving them checks that every column is written and every key stored: a record field without
a column raises ``TypeError`` at import (add the column and its migration).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import InstrumentedAttribute
from sqlalchemy.sql import FromClause

from observer.records import Exchange
from observer.shape import Key, Kind, Shaped, compile_function, dict_display, keys, rfc3339
from observer.store.models import ExchangeRow

Item = dict[str, Any]

#: Record paths stored under another column name: ``"field.attribute"`` -> column. A nested
#: record flattened here (``usage``, ``error``) has no column of its own; an optional one has a
#: presence column under its bare path (``"error"``: whether the record has one). A path into a
#: record stored whole (``request``) is a copy for queries, never read back.
FLATTENED: dict[str, str] = {
    "request.end_user": "end_user",
    "usage.input_tokens": "input_tokens",
    "usage.output_tokens": "output_tokens",
    "usage.cache_read_input_tokens": "cache_read_input_tokens",
    "usage.cache_creation_input_tokens": "cache_creation_input_tokens",
    "usage.reasoning_output_tokens": "reasoning_output_tokens",
    "usage.total_tokens": "total_tokens",
    "usage.details": "usage_details",
    "usage.reported": "usage_reported",
    "error": "error_reported",
    "error.code": "error_code",
    "error.message": "error_message",
    "tool_calls.id": "call_id",
}

#: Keys of a ``GET /v1/exchanges`` item, in order: record keys (a flattened record rebuilt from
#: its columns), the copied column ``end_user`` and the store's ``conversation_id``.
SUMMARY_KEYS: tuple[str, ...] = (
    "id",
    "dialect",
    "scheme",
    "host",
    "port",
    "path",
    "method",
    "status_code",
    "started_at",
    "ended_at",
    "ttft_s",
    "request_id",
    "request_model",
    "end_user",
    "proxy_user",
    "key_fingerprint",
    "model",
    "usage",
    "stop_reason",
    "error",
    "outcome",
    "response_bytes",
    "events",
    "conversation_id",
)

_CHILD_COLUMNS = ("exchange_id", "exchange_started_at", "position")  # columns of every child table that are not fields
#: ``exchanges`` columns the store sets, not the record (``write_many``): the journal's
#: numbering, the chain hash, the order of storing (``observer.store.stored``), the
#: conversation (``observer.conversation``), the stream a resumption resumes
#: (``observer.store.resumption``) and the search words (``observer.store.search``).
JOURNAL_COLUMNS = (
    "writer_id",
    "seq",
    "record_hash",
    "stored_seq",
    "conversation_id",
    "continuation_hash",
    "resumes_id",
    "search_vector",
)


def _column_names(table: FromClause) -> set[str]:
    """Columns a row must give (server defaults such as ``created_at`` excluded)."""
    return {c.name for c in table.columns if c.server_default is None}


def _flattened(name: str) -> dict[str | None, str]:
    """``FLATTENED`` entries of the nested record ``name``: attribute (``None``: presence) -> column."""
    out: dict[str | None, str] = {}
    for path, column in FLATTENED.items():
        head, _, attribute = path.partition(".")
        if head == name:
            out[attribute or None] = column
    return out


class _Mapping:
    """The derivation for one record class and its table: which key goes to which column(s)."""

    def __init__(self, cls: type[Shaped], table: FromClause, prefix: str, fixed: Sequence[str], env: dict[str, Any]):
        self.cls, self.table, self.prefix, self.env = cls, table, prefix, env
        self.columns = _column_names(table)
        env[f"_{cls.__name__}"] = cls
        written = list(fixed)
        for key in keys(cls):
            if key.kind is Kind.RECORDS and prefix:
                raise TypeError(f"{cls.__name__}.{key.name}: a list inside a list item has no table")
            written.extend(column for column, _ in self.write(key, "x"))
        twice = sorted({c for c in written if written.count(c) > 1})
        unwritten = sorted(self.columns - set(written))
        if twice or unwritten:
            raise TypeError(f"{table.name}: columns {unwritten} written by no key of {cls.__name__}, {twice} twice")

    def own_column(self, key: Key) -> str | None:
        """The column holding the key itself (``None``: flattened, a child table, not stored)."""
        # A nested record's bare path in FLATTENED names its presence column, not its own.
        column = key.name if key.kind is Kind.RECORD else FLATTENED.get(f"{self.prefix}{key.name}", key.name)
        return column if column in self.columns and key.kind is not Kind.RECORDS else None

    def write(self, key: Key, v: str) -> list[tuple[str, str]]:
        """(column, expression over the record ``v``) for the key; ``TypeError`` if unstored."""
        value = f"{v}.{key.name}"
        column = self.own_column(key)
        out: list[tuple[str, str]] = []
        if column is not None:
            if key.kind is Kind.RECORD:
                expression = f"{value}.to_dict()"
                out.append((column, f"None if {value} is None else {expression}" if key.optional else expression))
            else:
                out.append((column, f"_str({value})" if key.as_str else value))
        flat = _flattened(key.name) if key.kind is Kind.RECORD and not self.prefix else {}
        for attribute, flat_column in flat.items():
            if attribute is None:
                out.append((flat_column, f"{value} is not None"))
            elif key.optional:
                out.append((flat_column, f"None if {value} is None else {value}.{attribute}"))
            else:
                out.append((flat_column, f"{value}.{attribute}"))
        if not out and key.kind not in (Kind.RECORDS, Kind.DERIVED):
            raise TypeError(
                f"{self.cls.__name__}.{key.name}: no column {key.name!r} in {self.table.name} (add it and a migration)"
            )
        return out

    def read(self, key: Key, row: str, get: Callable[[str, str], str]) -> str | None:
        """The expression rebuilding the key from the row ``row`` (``get(row, column)`` reads a
        column), or ``None`` for a key that is not read back (derived, a copy, a child table)."""
        if key.kind is Kind.DERIVED or key.kind is Kind.RECORDS:
            return None
        column = self.own_column(key)
        if column is not None and key.kind is Kind.RECORD and key.record is not None:
            self.env[f"_{key.record.__name__}"] = key.record
            expression = f"_{key.record.__name__}.from_dict({get(row, column)})"
            return f"None if {get(row, column)} is None else {expression}" if key.optional else expression
        if column is not None:
            return get(row, column)
        record = key.record
        assert record is not None  # a flattened record (write() raised for anything else)
        self.env[f"_{record.__name__}"] = record
        flat = _flattened(key.name)
        fields = ", ".join(f"{k.name}={get(row, flat[k.name])}" for k in keys(record))
        expression = f"_{record.__name__}({fields})"
        if key.optional:
            if None not in flat:
                raise TypeError(f"{self.cls.__name__}.{key.name}: optional and flattened, but no presence column")
            return f"({expression} if {get(row, flat[None])} else None)"
        return expression


def _attribute(row: str, column: str) -> str:
    return f"{row}.{column}"


def _item(row: str, column: str) -> str:
    return f"{row}[{column!r}]"


def _children(env: dict[str, Any]) -> dict[str, _Mapping]:
    """List key of ``Exchange`` -> the mapping of its child table (the relationship of that name)."""
    out: dict[str, _Mapping] = {}
    relationships = ExchangeRow.__mapper__.relationships
    for key in keys(Exchange):
        if key.kind is Kind.RECORDS and key.record is not None:
            if key.name not in relationships:
                raise TypeError(f"Exchange.{key.name}: no relationship {key.name!r} on ExchangeRow")
            table = relationships[key.name].mapper.local_table
            out[key.name] = _Mapping(key.record, table, f"{key.name}.", _CHILD_COLUMNS, env)
    return out


_ENV: dict[str, Any] = {"_str": str, "_rfc3339": rfc3339}
_EXCHANGES = _Mapping(Exchange, ExchangeRow.__table__, "", JOURNAL_COLUMNS, _ENV)
_CHILDREN = _children(_ENV)

#: The generated source of every mapping, by function name (for reading and debugging).
SOURCES: dict[str, str] = {}


def _compile(name: str, params: str, result: str) -> Callable[..., Any]:
    SOURCES[name], fn = compile_function(name, params, result, _ENV)
    return fn


_exchange_row = _compile(
    "exchange_row", "r", dict_display([e for k in keys(Exchange) for e in _EXCHANGES.write(k, "r")])
)
_child_rows = {
    name: (
        m.table,
        _compile(
            f"{name}_rows",
            "items, exchange_id, started_at",
            "["
            + dict_display(
                [("exchange_id", "exchange_id"), ("exchange_started_at", "started_at"), ("position", "position")]
                + [e for k in keys(m.cls) for e in m.write(k, "x")]
            )
            + " for position, x in enumerate(items)]",
        ),
    )
    for name, m in _CHILDREN.items()
}


def _child_list(name: str, m: _Mapping) -> str:
    fields = ", ".join(f"{k.name}={e}" for k in keys(m.cls) if (e := m.read(k, "c", _attribute)) is not None)
    return f"[_{m.cls.__name__}({fields}) for c in row.{name}]"


def _exchange_arguments() -> str:
    out = []
    for key in keys(Exchange):
        if key.name in _CHILDREN:
            out.append(f"        {key.name}={_child_list(key.name, _CHILDREN[key.name])},\n")
        elif (expression := _EXCHANGES.read(key, "row", _attribute)) is not None:
            out.append(f"        {key.name}={expression},\n")
    return "_Exchange(\n" + "".join(out) + "    )"


_exchange_from_row = _compile("exchange_from_row", "row", _exchange_arguments())


def _summary() -> tuple[str, tuple[str, ...]]:
    """The summary's dict display over a result mapping ``m``, and the columns it reads."""
    by_name = {k.name: k for k in keys(Exchange)}
    entries: list[tuple[str, str]] = []
    read: list[str] = []

    def get(row: str, column: str) -> str:
        read.append(column)
        return _item(row, column)

    for name in SUMMARY_KEYS:
        key = by_name.get(name)
        if key is None or key.kind is Kind.DERIVED:
            entries.append((name, get("m", name)))
        elif key.kind is Kind.TIME:
            entries.append((name, f"_rfc3339({get('m', name)})"))
        elif key.kind is Kind.RECORD and key.optional:
            entries.append((name, f"None if (v := {_EXCHANGES.read(key, 'm', get)}) is None else v.to_dict()"))
        elif key.kind is Kind.RECORD:
            entries.append((name, f"{_EXCHANGES.read(key, 'm', get)}.to_dict()"))
        elif key.kind is Kind.RECORDS:
            raise TypeError(f"SUMMARY_KEYS: {name} is a list of records (child rows), not a column")
        else:
            entries.append((name, get("m", _EXCHANGES.own_column(key) or name)))
    if "id" not in read or "started_at" not in read:  # the page cursor's columns
        raise TypeError("SUMMARY_KEYS must include id and started_at")
    return dict_display(entries), tuple(dict.fromkeys(read))


_summary_display, _summary_columns = _summary()
_summary_from_row = _compile("summary_from_row", "m", _summary_display)

#: The ``ExchangeRow`` columns ``summary_from_row`` reads (``AuditStore.list`` selects them).
SUMMARY_COLUMNS: tuple[InstrumentedAttribute[Any], ...] = tuple(getattr(ExchangeRow, c) for c in _summary_columns)


def rows_from_records(records: Sequence[Exchange]) -> tuple[list[Item], dict[FromClause, list[Item]]]:
    """Row dicts (column names) for ``exchanges`` and each child table; the first record
    of a repeated id wins."""
    exchanges: list[Item] = []
    children: dict[FromClause, list[Item]] = {m.table: [] for m in _CHILDREN.values()}
    seen: set[str] = set()
    for r in records:
        rid = r.id
        if rid in seen:
            continue
        seen.add(rid)
        exchanges.append(_exchange_row(r))
        for name, (table, make) in _child_rows.items():
            items = getattr(r, name)
            if items:
                children[table].extend(make(items, rid, r.started_at))
    return exchanges, children


def exchange_from_row(row: Any) -> Exchange:
    """The ``Exchange`` of an ``ExchangeRow`` whose child rows are loaded."""
    record: Exchange = _exchange_from_row(row)
    return record


def summary_from_row(m: Mapping[str, Any]) -> Item:
    """One ``GET /v1/exchanges`` item from a result mapping of ``SUMMARY_COLUMNS``."""
    item: Item = _summary_from_row(m)
    return item
