"""The conformance report: per endpoint, dialect or day, how the observed streams kept their
dialect's rules (``GET /v1/conformance``, ``observer conformance``; issue 16 item 6).

What a group counts (every count exact; each share is its count over its denominator, a float
computed from the two, ``None`` when the denominator is 0):

- ``exchanges``: the records of the group (every outcome: an ``http_error`` or a metadata-only
  near miss was seen too);
- ``completed``: outcome ``completed``, i.e. the stream ended with ``stream.end`` or the
  dialect's equivalent (``observer.records.Outcome``); over ``exchanges``;
- ``usage_reported``: a usage event was seen (``Usage.reported``); over ``exchanges``;
- ``conformant``: no violation of any kind was recorded; over ``exchanges``;
- ``seq_checked``: the exchanges of a dialect whose events carry a sequence number
  (``SEQ_DIALECTS``) with at least one event (a record without events, e.g. ``http_error``, had
  no sequence to check); ``seq_monotonic``: those without a ``seq_gap`` or ``seq_repeat``
  violation (draft §5.2); over ``seq_checked``. Both ``seq_monotonic`` and its share are
  ``None`` when ``seq_checked`` is 0: the group's dialects carry no seq (a vendor stream is not
  "100 % monotonic");
- ``violations``: per violation kind recorded in the group, ``count`` (violations of the kind)
  and ``exchanges`` (exchanges with at least one), kinds in name order. A vendor dialect's
  violations are those of its own rules, as its adapter records them.

Groupings (``GROUP_BY``): ``host``, one group per endpoint: ``scheme``, ``host``, ``port`` and
``dialect`` (the same host serving two dialects is two endpoints, each judged by its own
rules), with ``endpoint`` the URL origin (``https://api.example.com:443``; no port when the
record has none); ``dialect``; ``day``, the UTC date of ``started_at`` (``YYYY-MM-DD``), all
dialects together (``seq_checked`` counts only the seq-carrying ones). Groups are ordered by
their key (a ``None`` part last), in code-point order on both engines.

The SQL, one statement (one snapshot on both engines, so the per-kind counts never disagree
with the totals): ``exchanges`` left-joined with its ``exchange_violations`` aggregated per
record (any violation; any ``seq_gap``/``seq_repeat``), grouped by the key, ``UNION ALL``
``exchanges`` joined with the violations aggregated per record and kind, grouped by the key and
kind. Joins, not a probe per record: PostgreSQL ran two correlated ``EXISTS`` per record as
sub-plans over every partition (3.2 s at 500,000 records, 0.7 s as a hash join). The filters are
``observer.store.query.where``'s: ``since``/``until`` on ``started_at`` (the range of
``ix_exchanges_started_at_id``; the violations by their ``exchange_started_at``, so PostgreSQL
prunes both tables' partitions), ``host`` and ``dialect`` by equality (their
``ix_exchanges_*_started_at_id``). SQLite groups by day along ``ix_exchanges_day`` and sorts the
other keys; neither engine has an index holding every column read (outcome, usage, events), so
the records in range are read from the table: the report is a scan of what it reports on
(~1-2.5 s for 500,000 records without a range on a loaded 2-core machine, ~0.1-0.25 s for a
day of them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, String, and_, case, cast, func, literal, literal_column, null, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from observer.records import Outcome, ViolationKind
from observer.store.models import SQLITE_DAY, ExchangeRow, ViolationRow
from observer.store.query import Filters, where

#: The groupings, by name.
GROUP_BY = ("host", "dialect", "day")
#: The key fields of a group, per grouping (``host``: an endpoint and its dialect).
KEY_FIELDS: dict[str, tuple[str, ...]] = {
    "host": ("scheme", "host", "port", "dialect"),
    "dialect": ("dialect",),
    "day": ("day",),
}
#: Dialects whose events carry a sequence number the observer checks for gaps and repeats:
#: the draft's ``seq`` (draft §5.2; ``observer.dialects.standard``) and the OpenAI Responses
#: stream's ``sequence_number`` (``observer.dialects._openai_common.SequenceCheck``). Data, not
#: a branch: the report asks only "is the dialect in this set".
SEQ_DIALECTS = frozenset({"llm-stream-1.0", "openai.responses"})
#: The violations that make a sequence not monotonic (draft §5.2).
SEQ_VIOLATIONS = (ViolationKind.SEQ_GAP.value, ViolationKind.SEQ_REPEAT.value)

Group = dict[str, Any]


def report(
    engine: Engine, group_by: str, filters: Filters, seq_dialects: frozenset[str] = SEQ_DIALECTS
) -> dict[str, Any]:
    """``{"group_by", "filters" (as given), "seq_dialects" (sorted), "groups": [Group]}`` over
    the records ``filters`` selects (its ``since``, ``until``, ``host``, ``dialect``; other
    filters apply as in ``observer.store.query.where``). Raises ``ValueError`` for another
    ``group_by``."""
    return {
        "group_by": group_by,
        "filters": filters.given(),
        "seq_dialects": sorted(seq_dialects),
        "groups": groups(engine, group_by, filters, seq_dialects),
    }


def groups(engine: Engine, group_by: str, filters: Filters, seq_dialects: frozenset[str] = SEQ_DIALECTS) -> list[Group]:
    """The groups of the report (module docstring), ordered by key. Raises ``ValueError`` for
    a ``group_by`` not in ``GROUP_BY``."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}")
    ex, vt = ExchangeRow.__table__, ViolationRow.__table__
    names = KEY_FIELDS[group_by]
    shown, grouped = _keys(group_by, engine.dialect.name)
    # The records' time range on the violations' copy of started_at: PostgreSQL prunes their partitions.
    within = [
        *([vt.c.exchange_started_at >= filters.since] if filters.since is not None else []),
        *([vt.c.exchange_started_at < filters.until] if filters.until is not None else []),
    ]
    # Per record with violations: whether one breaks the sequence; per record and kind: how many.
    flagged_records = (
        select(
            vt.c.exchange_id,
            vt.c.exchange_started_at,
            func.max(case((vt.c.kind.in_(SEQ_VIOLATIONS), literal(1)), else_=literal(0))).label("seq_broken"),
        )
        .where(*within)
        .group_by(vt.c.exchange_id, vt.c.exchange_started_at)
        .subquery("flagged_records")
    )
    record_kinds = (
        select(vt.c.exchange_id, vt.c.exchange_started_at, vt.c.kind, func.count().label("n"))
        .where(*within)
        .group_by(vt.c.exchange_id, vt.c.exchange_started_at, vt.c.kind)
        .subquery("record_kinds")
    )

    def of(child: Any) -> ColumnElement[bool]:
        return and_(child.c.exchange_id == ex.c.id, child.c.exchange_started_at == ex.c.started_at)

    def flagged(condition: ColumnElement[bool]) -> ColumnElement[Any]:
        return func.sum(case((condition, literal(1)), else_=literal(0)))

    seq_checked = and_(ex.c.dialect.in_(sorted(seq_dialects)), ex.c.events > 0) if seq_dialects else literal(False)
    unbroken = func.coalesce(flagged_records.c.seq_broken, literal(0)) == literal(0)
    with engine.connect() as conn:
        conds = where(filters, conn)
        records = (
            select(
                *shown,
                cast(null(), String(64)).label("kind"),
                func.count().label("n"),
                flagged(ex.c.outcome == Outcome.COMPLETED.value).label("completed"),
                flagged(ex.c.usage_reported).label("usage_reported"),
                flagged(flagged_records.c.exchange_id.is_(None)).label("conformant"),
                flagged(seq_checked).label("seq_checked"),
                flagged(and_(seq_checked, unbroken)).label("seq_monotonic"),
                literal(0).label("kind_exchanges"),
            )
            .select_from(ex.outerjoin(flagged_records, of(flagged_records)))
            .where(literal(True), *conds)
            .group_by(*grouped)
        )
        zero = literal(0)
        # One row per (group, kind); the per-record columns of the first part are 0 here.
        kinds = (
            select(
                *shown,
                record_kinds.c.kind,
                func.sum(record_kinds.c.n).label("n"),  # here: violations of the kind
                zero.label("completed"),
                zero.label("usage_reported"),
                zero.label("conformant"),
                zero.label("seq_checked"),
                zero.label("seq_monotonic"),
                func.count().label("kind_exchanges"),
            )
            .select_from(ex.join(record_kinds, of(record_kinds)))
            .where(literal(True), *conds)
            .group_by(*grouped, record_kinds.c.kind)
        )
        rows = conn.execute(union_all(records, kinds)).all()
    found: dict[tuple[Any, ...], Group] = {}
    per_kind: dict[tuple[Any, ...], dict[str, dict[str, int]]] = {}
    for r in rows:
        key = tuple(getattr(r, n) for n in names)
        if r.kind is None:
            found[key] = _group(group_by, dict(zip(names, key, strict=True)), r)
        else:
            per_kind.setdefault(key, {})[r.kind] = {"count": int(r.n), "exchanges": int(r.kind_exchanges)}
    for key, group in found.items():
        group["violations"] = dict(sorted(per_kind.get(key, {}).items()))
    return [found[key] for key in sorted(found, key=_order)]


def _keys(group_by: str, engine_name: str) -> tuple[list[ColumnElement[Any]], list[ColumnElement[Any]]]:
    """The key columns a grouping selects (labelled as ``KEY_FIELDS``) and what it groups by."""
    ex = ExchangeRow.__table__
    if group_by != "day":
        columns = [ex.c[name].label(name) for name in KEY_FIELDS[group_by]]
        return columns, [ex.c[name] for name in KEY_FIELDS[group_by]]
    if engine_name == "sqlite":
        # Spelled as ix_exchanges_day's expression (models.SQLITE_DAY), as query.stats does.
        day: ColumnElement[Any] = literal_column(SQLITE_DAY)
        return [day.label("day")], [day]
    trunc = func.date_trunc("day", func.timezone("UTC", ex.c.started_at))  # as query.stats groups a day
    return [func.to_char(trunc, "YYYY-MM-DD").label("day")], [trunc]


def _group(group_by: str, key: dict[str, Any], r: Any) -> Group:
    """One group from its key and its row of per-record counts."""
    n = int(r.n)
    checked = int(r.seq_checked)
    monotonic = int(r.seq_monotonic) if checked else None
    group: Group = dict(key)
    if group_by == "host":
        group["endpoint"] = origin(key["scheme"], key["host"], key["port"])
    completed, usage, conformant = int(r.completed), int(r.usage_reported), int(r.conformant)
    group |= {
        "exchanges": n,
        "completed": completed,
        "completed_share": share(completed, n),
        "usage_reported": usage,
        "usage_reported_share": share(usage, n),
        "conformant": conformant,
        "conformant_share": share(conformant, n),
        "seq_checked": checked,
        "seq_monotonic": monotonic,
        "seq_monotonic_share": None if monotonic is None else share(monotonic, checked),
    }
    return group


def share(count: int, of: int) -> float | None:
    """``count / of`` (a fraction 0..1); ``None`` when ``of`` is 0."""
    return count / of if of else None


def origin(scheme: str, host: str, port: int | None) -> str:
    """The endpoint's URL origin: ``scheme://host[:port]``, an IPv6 address in brackets
    (RFC 3986 §3.2.2)."""
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"{scheme}://{shown}" if port is None else f"{scheme}://{shown}:{port}"


#: The table's key columns per grouping (``lines``).
_SHOWN_KEYS = {"host": ("endpoint", "dialect"), "dialect": ("dialect",), "day": ("day",)}


def lines(body: dict[str, Any]) -> list[str]:
    """A ``report`` as text table lines (``observer conformance``): the group's key, then each
    count with its share in percent (one decimal), ``seq monotonic`` as ``monotonic/checked``
    (``-`` for a group without seq-carrying dialects), the violations as ``kind count/exchanges``.
    Columns are separated by two spaces and padded to their widest cell."""
    keys = _SHOWN_KEYS[body["group_by"]]
    header = [*keys, "exchanges", "completed", "usage", "conformant", "seq monotonic", "violations (count/exchanges)"]
    rows = [header]
    for g in body["groups"]:
        seq = (
            "-"
            if g["seq_monotonic"] is None
            else f"{g['seq_monotonic']}/{g['seq_checked']} ({_percent(g['seq_monotonic_share'])})"
        )
        kinds = ", ".join(f"{kind} {v['count']}/{v['exchanges']}" for kind, v in g["violations"].items())
        rows.append(
            [
                *("-" if g[k] is None else str(g[k]) for k in keys),
                str(g["exchanges"]),
                f"{g['completed']} ({_percent(g['completed_share'])})",
                f"{g['usage_reported']} ({_percent(g['usage_reported_share'])})",
                f"{g['conformant']} ({_percent(g['conformant_share'])})",
                seq,
                kinds or "-",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _order(key: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
    """Sort key of a group key: each part in order, ``None`` after every value."""
    return tuple((part is None, "" if part is None else part) for part in key)


__all__: Sequence[str] = (
    "GROUP_BY",
    "KEY_FIELDS",
    "SEQ_DIALECTS",
    "SEQ_VIOLATIONS",
    "groups",
    "lines",
    "origin",
    "report",
)
