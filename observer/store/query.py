"""Filtered reads of the exchanges: the API's list, its stored-order feed and statistics.

``Filters`` holds what ``GET /v1/exchanges`` and ``GET /v1/stats`` accept; ``where`` turns it
into SQL conditions, the same on SQLite and PostgreSQL (search: ``observer.store.search``).
Equality filters compare exactly (case-sensitive, as stored); ``since`` is inclusive and
``until`` exclusive on ``started_at``; ``tool`` and ``violation`` match a record with at least one
such tool call name / violation kind. Pages:

- ``page``: newest first by ``(started_at, id)``, keyset-paginated by an opaque cursor, so
  records stored meanwhile never shift a page (a record stored later with an older
  ``started_at`` lands behind the reader: use ``feed`` to see every record); with a child
  filter it walks the child rows into their records (``_walk``) unless an equality filter
  matches fewer records;
- ``feed``: oldest stored first by ``(stored_seq, id)`` after a position
  (``observer.store.stored``): every record exactly once, late ones included.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Row,
    Select,
    Table,
    and_,
    case,
    exists,
    func,
    literal,
    literal_column,
    select,
    tuple_,
)
from sqlalchemy.sql.elements import ColumnElement

from observer.shape import rfc3339
from observer.store import search
from observer.store.keyowners import fingerprints_of
from observer.store.models import SQLITE_DAY, STATS_TOKENS, ExchangeRow, ToolCallRow, ViolationRow
from observer.store.rows import SUMMARY_COLUMNS, summary_from_row
from observer.store.store import CURSOR_MAX_CHARS, LIST_LIMIT_MAX, InvalidCursor, decode_cursor, encode_cursor
from observer.store.stored import horizon

Item = dict[str, Any]
#: Equality filters: filter name -> ``exchanges`` column.
COLUMN_FILTERS = {
    "model": "model",
    "request_model": "request_model",
    "dialect": "dialect",
    "host": "host",
    "user": "end_user",
    "outcome": "outcome",
    "stop_reason": "stop_reason",
    "request_id": "request_id",
    "conversation_id": "conversation_id",
    "proxy_user": "proxy_user",
    "key_fingerprint": "key_fingerprint",
}
#: ``stats`` groupings: name -> what it groups by.
GROUP_BY = ("model", "day", "user", "dialect", "host")


@dataclass(frozen=True, slots=True)
class Filters:
    """The conditions of a read (``None``: not filtered)."""

    since: datetime | None = None
    until: datetime | None = None
    model: str | None = None
    request_model: str | None = None
    dialect: str | None = None
    host: str | None = None
    user: str | None = None
    outcome: str | None = None
    stop_reason: str | None = None
    request_id: str | None = None
    conversation_id: str | None = None
    proxy_user: str | None = None
    key_fingerprint: str | None = None
    key_owner: str | None = None  # an owner or team of key_owners: the records of its fingerprints
    tool: str | None = None
    violation: str | None = None
    q: str | None = None

    def given(self) -> dict[str, Any]:
        """The filters set, by name (times as RFC 3339)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = rfc3339(value) if isinstance(value, datetime) else value
        return out


#: In the feed and stats, a child filter (``tool``, ``violation``) or a PostgreSQL search
#: matching at most this many rows is applied as the set of their records (``IN``); above it,
#: row by row along the query's index (``EXISTS``): the first reads few index entries when
#: matches are rare, the second stops after a page when they are common (bench/queries.py
#: measured both sides of it). A page with a child filter counts to it to choose its side
#: (``_walked``).
SELECTIVE_MAX = 5000
#: The same for a SQLite search (its matching rowids as a subquery): taking the set costs ~4 µs per match (sorting rowids), probing
#: the FTS5 index row by row ~0.3 ms per row read until a page fills (50 / the share of records
#: that match): even at 1,000,000 records the set wins below ~50,000 matches.
SEARCH_SELECTIVE_MAX = 50_000


def _children(filters: Filters) -> list[tuple[str, Table, ColumnElement[Any]]]:
    """The child filters set: (value, child table, the column it must equal)."""
    tc, vt = ToolCallRow.__table__, ViolationRow.__table__
    pairs = ((filters.tool, tc, tc.c.name), (filters.violation, vt, vt.c.kind))
    return [(value, child, match) for value, child, match in pairs if value is not None]


def _has(child: Table, match: ColumnElement[Any], value: str) -> ColumnElement[bool]:
    """The record has a ``child`` row whose ``match`` is ``value`` (a probe of the child's key)."""
    ex = ExchangeRow.__table__
    return exists().where(
        child.c.exchange_id == ex.c.id, child.c.exchange_started_at == ex.c.started_at, match == value
    )


def where(
    filters: Filters, conn: Connection, *, walked: Table | None = None, probe: bool = False
) -> list[ColumnElement[bool]]:
    """The SQL conditions of ``filters`` on ``exchanges`` for the engine of ``conn`` (which
    counts, capped, how selective the child and search filters are), but none for the child
    table ``walked`` (the query joins it: ``page``); ``probe``: the child filters as a probe per
    record, not counted (the page follows a selective equality filter). Raises ``ValueError``
    for a ``q`` without a word (``observer.store.search.words``)."""
    ex = ExchangeRow.__table__
    conds = _time_range(filters, ex.c.started_at)
    for name, column in COLUMN_FILTERS.items():
        value = getattr(filters, name)
        if value is not None:
            conds.append(ex.c[column] == value)
    if filters.key_owner is not None:
        conds.append(ex.c.key_fingerprint.in_(fingerprints_of(conn, filters.key_owner)))
    for value, child, match in _children(filters):
        if child is walked:
            continue
        if probe:
            conds.append(_has(child, match, value))
            continue
        ids = _ids(conn, select(child.c.exchange_id).where(match == value).distinct(), SELECTIVE_MAX)
        if ids is not None:
            conds.append(ex.c.id.in_(ids))
        else:
            conds.append(_has(child, match, value))
    if filters.q is not None:
        if conn.dialect.name == "sqlite":
            few = _few(conn, search.matches_sqlite(filters.q), SEARCH_SELECTIVE_MAX)
            conds.append(search.condition("sqlite", filters.q, ex.c.stored_seq, few=few))
        else:
            matching = search.condition("postgresql", filters.q, ex.c.stored_seq)
            ids = _ids(conn, select(ex.c.id).where(matching), SELECTIVE_MAX)
            conds.append(matching if ids is None else ex.c.id.in_(ids))
    return conds


def _ids(conn: Connection, rows: Select[Any], cap: int) -> list[str] | None:
    """The record ids ``rows`` selects when they are at most ``cap`` (then the page query looks
    them up by primary key, whatever the planner would estimate: PostgreSQL took a rare word or
    tool for a common one and scanned the whole table backwards by time); ``None`` when more."""
    found = list(conn.scalars(rows.limit(cap + 1)))
    return found if len(found) <= cap else None


def _few(conn: Connection, rows: Select[Any], cap: int | None = None) -> bool:
    """Whether ``rows`` has at most ``cap`` (default ``SELECTIVE_MAX``) rows, reading at most
    one more."""
    cap = SELECTIVE_MAX if cap is None else cap
    return _counts(conn, [rows], cap)[0] <= cap


def page(engine: Engine, filters: Filters, limit: int = 50, cursor: str | None = None) -> tuple[list[Item], str | None]:
    """A page of summaries newest first and the next page's cursor (``None`` on the last).
    Raises ``InvalidCursor`` for a cursor this store did not issue, ``ValueError`` for a limit
    outside 1..``LIST_LIMIT_MAX`` or a bad ``q``."""
    _check_limit(limit)
    ex = ExchangeRow.__table__
    after = decode_cursor(cursor) if cursor is not None else None
    children = _children(filters)
    with engine.connect() as conn:
        walked = _walked(conn, filters, children) if children else None
        if walked is not None:
            rows = _walk(conn, filters, walked, after, limit + 1)
        else:
            stmt = select(*SUMMARY_COLUMNS).where(*where(filters, conn, probe=bool(children)))
            if after is not None:
                stmt = stmt.where(tuple_(ex.c.started_at, ex.c.id) < tuple_(*after))
            stmt = stmt.order_by(ex.c.started_at.desc(), ex.c.id.desc()).limit(limit + 1)
            rows = conn.execute(stmt).all()
    items = [summary_from_row(r._mapping) for r in rows[:limit]]
    next_cursor = encode_cursor(rows[limit - 1].started_at, rows[limit - 1].id) if len(rows) > limit else None
    return items, next_cursor


def _walked(
    conn: Connection, filters: Filters, children: list[tuple[str, Table, ColumnElement[Any]]]
) -> tuple[str, Table, ColumnElement[Any]] | None:
    """Which child filter the page walks (``_walk``): the one with the fewest matching child
    rows; ``None`` when an equality filter matches fewer records than that (the page then
    follows the filter's index and probes the children per record: ``tool`` with a rare
    ``user`` walked every call of the tool). Each count reads at most ``SELECTIVE_MAX`` + 1
    index entries; all are one statement (on PostgreSQL planning a statement over the
    partitions costs more than these counts: docs/performance.md); none when there is only one
    child filter and no equality filter. Ties go to the walk."""
    given = ((column, getattr(filters, name)) for name, column in COLUMN_FILTERS.items())
    equal = [(column, value) for column, value in given if value is not None]
    if len(children) == 1 and not equal:
        return children[0]
    ex = ExchangeRow.__table__
    ranges = [select(literal(1)).select_from(c[1]).where(*_walk_range(filters, c)) for c in children]
    ranges += [
        select(literal(1)).select_from(ex).where(ex.c[column] == value, *_time_range(filters, ex.c.started_at))
        for column, value in equal
    ]
    counts = _counts(conn, ranges, SELECTIVE_MAX)
    fewest, walked = min(zip(counts, children, strict=False), key=lambda pair: pair[0])
    records = counts[len(children) :]
    return None if records and min(records) < fewest else walked


def _counts(conn: Connection, ranges: list[Select[Any]], cap: int) -> list[int]:
    """How many rows each of ``ranges`` has, but at most ``cap`` + 1 (reading no more): one
    statement."""
    counts = [select(func.count()).select_from(rows.limit(cap + 1).subquery()).scalar_subquery() for rows in ranges]
    return [int(n or 0) for n in conn.execute(select(*counts)).one()]


def _time_range(filters: Filters, column: ColumnElement[Any]) -> list[ColumnElement[bool]]:
    """``since`` (inclusive) / ``until`` (exclusive) on ``column``."""
    conds: list[ColumnElement[bool]] = []
    if filters.since is not None:
        conds.append(column >= filters.since)
    if filters.until is not None:
        conds.append(column < filters.until)
    return conds


def _walk_range(filters: Filters, child: tuple[str, Table, ColumnElement[Any]]) -> list[ColumnElement[bool]]:
    """The child rows ``child`` matches within the time filters (on the child's own partition
    key, so PostgreSQL prunes its partitions too)."""
    value, table, match = child
    return [match == value, *_time_range(filters, table.c.exchange_started_at)]


def _walk(
    conn: Connection,
    filters: Filters,
    child: tuple[str, Table, ColumnElement[Any]],
    after: tuple[datetime, str] | None,
    wanted: int,
) -> list[Row[Any]]:
    """The first ``wanted`` rows of the page of ``filters`` after ``after``, found by walking the
    child filter's index ``(value, exchange_started_at, exchange_id)`` backwards (the page's
    order) and joining each match to its record by key (models ``_walk_index``): a page reads
    about ``wanted`` child rows divided by the share of them the other filters keep, whatever
    the planner would estimate (it took rare tools for common ones and common for rare:
    docs/performance.md). On PostgreSQL the record is a ``LATERAL`` subquery with ``LIMIT 1``
    (one row per key), which the planner can neither flatten nor turn into a hash join: it
    estimated a join on both key columns at one row and hashed every exchange (2.6 s); SQLite
    already walks the child index into the key. A record with several matching children
    appears once per child: those come together (the same key) and are dropped here, the
    join read on after the last key when they leave fewer than ``wanted`` (one pass)."""
    table = child[1]
    ex = ExchangeRow.__table__
    at, record = table.c.exchange_started_at, table.c.exchange_id
    key = and_(ex.c.id == record, ex.c.started_at == at)
    others = where(filters, conn, walked=table)
    if conn.dialect.name == "postgresql":
        one = select(*SUMMARY_COLUMNS).where(key, *others).limit(1).lateral("exchange")
        stmt = select(*one.c).select_from(table).join(one, literal(True)).where(*_walk_range(filters, child))
    else:
        stmt = select(*SUMMARY_COLUMNS).select_from(table.join(ex, key)).where(*_walk_range(filters, child), *others)
    stmt = stmt.order_by(at.desc(), record.desc())
    kept: list[Row[Any]] = []
    position = after
    while True:  # bounded: each round starts strictly after the last, or is the last
        # A quarter more than is missing: a record with two matching children would otherwise
        # cost a further statement (planning one on PostgreSQL outweighs reading a dozen more
        # rows), more would cost as much more reading when the other filters keep few.
        missing = wanted - len(kept)
        need = missing + missing // 4 + 1
        batch = stmt if position is None else stmt.where(tuple_(at, record) < tuple_(*position))
        rows = conn.execute(batch.limit(need)).all()
        last = kept[-1].id if kept else None  # a record's children are adjacent
        for r in rows:
            if r.id != last:
                kept.append(r)
                last = r.id
        if len(kept) >= wanted or len(rows) < need:
            return kept[:wanted]
        # After the last row's key: the rest of that record's children are passed over with it.
        position = (rows[-1].started_at, rows[-1].id)


#: The position before every record (``recorded_after=0``).
START = "0"


def feed(engine: Engine, filters: Filters, after: str, limit: int = 50) -> tuple[list[Item], str]:
    """Summaries in the order they were stored, after the position ``after`` (``START``, or a
    position this returned), and the position after the last one (``after`` itself when none):
    poll with it to get each record exactly once. Raises ``InvalidCursor`` for a position this
    store did not issue, ``ValueError`` as ``page``."""
    _check_limit(limit)
    ex = ExchangeRow.__table__
    key, last_id = decode_position(after)
    with engine.connect() as conn:
        stmt = select(*SUMMARY_COLUMNS, ex.c.stored_seq).where(*where(filters, conn))
        stmt = stmt.where(tuple_(ex.c.stored_seq, ex.c.id) > tuple_(key, last_id))
        bound = horizon(conn)
        if bound is not None:
            stmt = stmt.where(ex.c.stored_seq < bound)
        rows = conn.execute(stmt.order_by(ex.c.stored_seq, ex.c.id).limit(limit)).all()
    items = [summary_from_row(r._mapping) for r in rows]
    position = encode_position(rows[-1].stored_seq, rows[-1].id) if rows else after
    return items, position


def encode_position(key: int, id: str) -> str:  # noqa: A002
    """Opaque feed position: unpadded urlsafe base64 of the JSON ``[stored_seq, id]``."""
    raw = json.dumps([key, id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_position(position: str) -> tuple[int, str]:
    """Inverse of ``encode_position``; ``START`` is before everything. Raises ``InvalidCursor``."""
    if position == START:
        return -1, ""
    try:
        if len(position) > CURSOR_MAX_CHARS:
            raise ValueError("too long")
        decoded = json.loads(base64.urlsafe_b64decode(position + "=" * (-len(position) % 4)))
        if not (
            isinstance(decoded, list)
            and len(decoded) == 2
            and type(decoded[0]) is int
            and -1 <= decoded[0] < 2**63
            and isinstance(decoded[1], str)
            and "\x00" not in decoded[1]  # PostgreSQL refuses NUL in text
        ):
            raise TypeError("a position is [int, str] without NUL")
        return decoded[0], decoded[1]
    except (ValueError, TypeError, binascii.Error) as exc:
        raise InvalidCursor(f"invalid position: {position[:40]!r}") from exc


def stats(engine: Engine, group_by: str, filters: Filters) -> list[Item]:
    """One dict per group (``GROUP_BY``) of the records matching ``filters``: the group's key
    under the name ``group_by`` (``day``: ``YYYY-MM-DD``, the UTC date of ``started_at``; a key
    may be ``None``, no model or no user: that group comes last, the others in key order),
    ``exchanges``; per token class of ``STATS_TOKENS`` (the record's ``usage`` names, after
    OpenTelemetry ``gen_ai.usage.*``: input, output, cache read, cache creation, reasoning
    output) the sum in tokens of the counts reported (SQL ``SUM`` skips NULL: a count the vendor
    did not send adds nothing, it is never taken as 0; 0 when no exchange sent one) and
    ``<class>_reported``, the exchanges that sent one (``COUNT(column)``: 0 there is "unknown",
    where a sum of 0 over reports is zero tokens); ``usage_not_reported``, the exchanges without
    a usage event. Read from an index holding ``STATS_SUMMED`` (``observer.store.models``), not
    the table (SQLite by day: one record per day, for its key). Raises ``ValueError`` for
    another ``group_by`` or a bad ``q``.

    Sums never fail on what the store holds: a count may be any 64-bit integer (draft §8.4), and
    two of 2^63 - 1 overflow SQLite's integer ``SUM`` ("integer overflow": trial finding, every
    stats call over such a group failed). SQLite sums with ``TOTAL`` (a float: exact below 2^53,
    9·10^15 tokens, which only absurd counts reach; above it the nearest float); PostgreSQL's
    ``SUM`` of a bigint is an exact numeric."""
    ex = ExchangeRow.__table__
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}")
    if group_by == "day":
        if engine.dialect.name == "sqlite":
            # Spelled as ix_exchanges_day's expression (models.SQLITE_DAY), literals and all: SQLite
            # uses an expression index only for the same expression, not with bound parameters.
            key: ColumnElement[Any] = literal_column(SQLITE_DAY)
            group: ColumnElement[Any] = key
        else:
            # Grouped by the day's timestamp (hashed), formatted per group: formatting every
            # row first made PostgreSQL sort all of them by text (5x slower: docs/performance.md).
            group = func.date_trunc("day", func.timezone("UTC", ex.c.started_at))
            key = func.to_char(group, "YYYY-MM-DD")
    else:
        key = group = ex.c[COLUMN_FILTERS[group_by]]
    key = key.label("key")
    counts = [func.count().label("exchanges")]
    total = func.total if engine.dialect.name == "sqlite" else func.sum
    for name in STATS_TOKENS:
        counts.append(func.coalesce(total(ex.c[name]), 0).label(name))
        counts.append(func.count(ex.c[name]).label(f"{name}_reported"))
    not_reported = func.sum(case((ex.c.usage_reported, literal(0)), else_=literal(1)))
    counts.append(func.coalesce(not_reported, 0).label("usage_not_reported"))
    names = [c.name for c in counts]
    with engine.connect() as conn:
        stmt = (
            select(key, *counts)
            .where(and_(literal(True), *where(filters, conn)))
            .group_by(group)
            .order_by(key.asc().nulls_last())  # the engines differ without it (SQLite: NULL first)
        )
        # By position: a group is a row (5,000 users), the row's mapping cost more than the query.
        # int(): PostgreSQL's SUM of a bigint is a numeric, SQLite's TOTAL a float.
        return [{group_by: r[0], **dict(zip(names, map(int, r[1:]), strict=True))} for r in conn.execute(stmt)]


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise ValueError(f"limit must be within 1..{LIST_LIMIT_MAX}, not {limit}")


__all__: Sequence[str] = (
    "COLUMN_FILTERS",
    "GROUP_BY",
    "START",
    "Filters",
    "conversation",
    "feed",
    "page",
    "stats",
    "where",
)


def conversation(engine: Engine, conversation_id: str, limit: int = LIST_LIMIT_MAX) -> list[Item]:
    """The summaries of a conversation's exchanges, oldest first (at most ``limit``)."""
    ex = ExchangeRow.__table__
    stmt = (
        select(*SUMMARY_COLUMNS)
        .where(ex.c.conversation_id == conversation_id)
        .order_by(ex.c.started_at, ex.c.id)
        .limit(limit)
    )
    with engine.connect() as conn:
        return [summary_from_row(r._mapping) for r in conn.execute(stmt)]
