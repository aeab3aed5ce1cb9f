"""Legal holds: records in a hold's scope are never purged while it is active.

A hold's **scope** is a conjunction of up to five conditions on a record (``Scope``): started
at or after ``since``, at or before ``until`` (RFC 3339), its ``end_user``, its ``host``, its id
among ``exchange_ids``; at least one is required (a hold of everything is a retention change,
not a hold). Making and releasing a hold are chained store events (``observer.store.events``)
and the ``holds`` table is their projection, the ids a hold names also one row each in
``hold_records`` (what a purge's query joins); ``observer verify`` recomputes both
(``expected_holds``): a hold row or named id changed, added or removed is a break.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, and_, exists, false, func, insert, or_, select, update

from observer.errors import ObserverError
from observer.shape import parse_rfc3339, rfc3339
from observer.store.checkpoint import CheckpointKey
from observer.store.events import append_event, lock
from observer.store.models import ExchangeRow, HoldRecordRow, HoldRow

#: Most record ids one hold may name (each is a bound parameter of the purge's query).
MAX_HOLD_IDS = 10_000
#: Longest reason, actor or scope value accepted (characters).
MAX_TEXT = 2000
#: The ``holds`` columns a hold's events determine (every column).
HOLD_COLUMNS = (
    "id",
    "reason",
    "created_at",
    "created_by",
    "created_seq",
    "since",
    "until",
    "end_user",
    "host",
    "exchange_ids",
    "released_at",
    "released_by",
    "release_reason",
    "released_seq",
)


class HoldError(ObserverError, ValueError):
    """A hold that cannot be made or released as asked (bad scope, unknown or released id)."""

    code = "invalid_hold"


class HoldNotFound(HoldError, LookupError):
    """No hold with the id asked for."""


class HoldReleased(HoldError):
    """The hold was released already (a release cannot be undone or repeated)."""


@dataclass(frozen=True, slots=True)
class Scope:
    """What a hold protects (every given condition must hold; ``None``: any)."""

    since: datetime | None = None
    until: datetime | None = None
    end_user: str | None = None
    host: str | None = None
    exchange_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if all(v is None for v in (self.since, self.until, self.end_user, self.host, self.exchange_ids)):
            raise HoldError(
                "a hold needs a scope: since, until, user, host or record ids (CLI: --since, --until, --user, --host, --id)"
            )
        if self.since is not None and self.until is not None and self.since > self.until:
            raise HoldError("the hold's since is after its until")
        for name in ("end_user", "host"):
            value = getattr(self, name)
            if value is not None and (not 0 < len(value) <= MAX_TEXT or "\x00" in value):
                raise HoldError(f"the hold's {name} must be 1..{MAX_TEXT} characters, without NUL")
        if self.exchange_ids is not None:
            if not 0 < len(self.exchange_ids) <= MAX_HOLD_IDS:
                raise HoldError(f"a hold names 1..{MAX_HOLD_IDS} record ids")
            bad = next((i for i in self.exchange_ids if not 0 < len(i) <= 36 or "\x00" in i), None)
            if bad is not None:
                raise HoldError(f"not a record id: {bad[:40]!r}")

    def to_detail(self) -> dict[str, Any]:
        """The scope as JSON (times RFC 3339), as the store event keeps it."""
        return {
            "since": None if self.since is None else rfc3339(self.since),
            "until": None if self.until is None else rfc3339(self.until),
            "end_user": self.end_user,
            "host": self.host,
            "exchange_ids": None if self.exchange_ids is None else list(self.exchange_ids),
        }

    @classmethod
    def from_detail(cls, detail: Mapping[str, Any]) -> Scope:
        ids = detail.get("exchange_ids")
        return cls(
            since=None if detail.get("since") is None else parse_rfc3339(detail["since"]),
            until=None if detail.get("until") is None else parse_rfc3339(detail["until"]),
            end_user=detail.get("end_user"),
            host=detail.get("host"),
            exchange_ids=None if ids is None else tuple(ids),
        )


def _text(name: str, value: str) -> str:
    """``value`` when it is 1..``MAX_TEXT`` characters, not blank, each printable or a line feed
    or tab (``str.isprintable``: no NUL, no other control character such as ESC, which ``hold
    list`` would print raw to a terminal: trial finding, an OSC sequence set its title; no format
    character such as a bidi override, no lone surrogate); else ``HoldError`` naming the first
    offending character by its code point."""
    if not value.strip() or len(value) > MAX_TEXT:
        raise HoldError(f"the {name} must be 1..{MAX_TEXT} characters, not blank")
    bad = next((c for c in value if not c.isprintable() and c not in "\n\t"), None)
    if bad is not None:
        raise HoldError(f"the {name} must be printable characters, lines and tabs (U+{ord(bad):04X} is not)")
    return value


def create_hold(
    engine: Engine, key: CheckpointKey, store_id: str, scope: Scope, reason: str, actor: str, at: datetime
) -> dict[str, Any]:
    """Makes a hold (a ``hold_created`` event and its ``holds`` row, one transaction); returns
    the row. Raises ``HoldError`` for a blank reason or actor, ``ConcurrentChange`` (events)."""
    with engine.begin() as conn:
        lock(conn)
        return create_hold_in(conn, key, store_id, scope, reason, actor, at)


def create_hold_in(
    conn: Connection, key: CheckpointKey, store_id: str, scope: Scope, reason: str, actor: str, at: datetime
) -> dict[str, Any]:
    """``create_hold`` inside the caller's transaction, which must have taken ``lock`` (an
    incident links records and holds them in one transaction: ``observer.store.incidents``)."""
    _text("reason", reason)
    _text("actor", actor)
    hold_id = str(uuid.uuid4())
    detail = {"hold_id": hold_id, "reason": reason, "scope": scope.to_detail()}
    event = append_event(conn, key, store_id, "hold_created", actor, detail, at)
    row = _created_row(event)
    conn.execute(insert(HoldRow.__table__), [row])
    if scope.exchange_ids is not None:
        conn.execute(
            insert(HoldRecordRow.__table__),
            [{"hold_id": hold_id, "exchange_id": i} for i in dict.fromkeys(scope.exchange_ids)],
        )
    return row


def release_hold(
    engine: Engine, key: CheckpointKey, store_id: str, hold_id: str, reason: str, actor: str, at: datetime
) -> dict[str, Any]:
    """Releases an active hold (a ``hold_released`` event, the row updated); returns the row.
    Raises ``HoldNotFound``, ``HoldReleased`` (both ``HoldError``s), ``HoldError`` for a blank
    reason."""
    _text("reason", reason)
    _text("actor", actor)
    table = HoldRow.__table__
    with engine.begin() as conn:
        lock(conn)
        found = conn.execute(select(table).where(table.c.id == hold_id)).first()
        if found is None:
            raise HoldNotFound(f"no hold {hold_id}")
        if found.released_at is not None:
            raise HoldReleased(f"hold {hold_id} was released at {rfc3339(found.released_at)}")
        event = append_event(conn, key, store_id, "hold_released", actor, {"hold_id": hold_id, "reason": reason}, at)
        change = _released_change(event)
        conn.execute(update(table).where(table.c.id == hold_id).values(**change))
    return {**found._mapping, **change}


def list_holds(engine: Engine | Connection, *, include_released: bool = False) -> list[dict[str, Any]]:
    """The holds (active only, or all), oldest first, as dicts of their columns; on a
    connection, within its transaction."""
    table = HoldRow.__table__
    stmt = select(table).order_by(table.c.created_seq)
    if not include_released:
        stmt = stmt.where(table.c.released_at.is_(None))
    if isinstance(engine, Connection):
        return [dict(r._mapping) for r in engine.execute(stmt)]
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(stmt)]


def hold_record_ids(conn: Connection) -> dict[str, set[str]]:
    """The record ids each hold names (``hold_records``), by hold id."""
    table = HoldRecordRow.__table__
    out: dict[str, set[str]] = {}
    for hold_id, exchange_id in conn.execute(select(table.c.hold_id, table.c.exchange_id)):
        out.setdefault(hold_id, set()).add(exchange_id)
    return out


def held(holds: Iterable[Mapping[str, Any]]) -> ColumnElement[bool]:
    """A condition on ``exchanges`` true for a record in any of ``holds``' scopes (the rows of
    active holds), false otherwise: never NULL, so ``NOT held(...)`` is true for a record whose
    ``end_user`` or ``host`` is NULL (SQL's ``NULL = 'x'`` is NULL, and ``NOT NULL`` too)."""
    ex = ExchangeRow.__table__
    clauses = []
    for hold in holds:
        parts = []
        if hold["since"] is not None:
            parts.append(ex.c.started_at >= hold["since"])
        if hold["until"] is not None:
            parts.append(ex.c.started_at <= hold["until"])
        if hold["end_user"] is not None:
            parts.append(ex.c.end_user == hold["end_user"])
        if hold["host"] is not None:
            parts.append(ex.c.host == hold["host"])
        if hold["exchange_ids"] is not None:  # one bound parameter, however many ids
            named = HoldRecordRow.__table__
            parts.append(exists().where(named.c.hold_id == hold["id"], named.c.exchange_id == ex.c.id))
        clauses.append(and_(*parts))
    return func.coalesce(or_(*clauses), false()) if clauses else false()


def count_held(engine: Engine, hold: Mapping[str, Any]) -> int:
    """How many stored records the hold covers now."""
    ex = ExchangeRow.__table__
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(ex).where(held([hold]))) or 0


def _created_row(event: Mapping[str, Any]) -> dict[str, Any]:
    detail = event["detail"]
    scope = Scope.from_detail(detail["scope"])
    return {
        "id": detail["hold_id"],
        "reason": detail["reason"],
        "created_at": event["at"],
        "created_by": event["actor"],
        "created_seq": event["seq"],
        "since": scope.since,
        "until": scope.until,
        "end_user": scope.end_user,
        "host": scope.host,
        "exchange_ids": None if scope.exchange_ids is None else list(scope.exchange_ids),
        "released_at": None,
        "released_by": None,
        "release_reason": None,
        "released_seq": None,
    }


def _released_change(event: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "released_at": event["at"],
        "released_by": event["actor"],
        "release_reason": event["detail"]["reason"],
        "released_seq": event["seq"],
    }


def expected_holds(events: Sequence[Mapping[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The ``holds`` rows the store events determine, by id, and the problems found in the
    events themselves (a release of an unknown or released hold, a hold made twice)."""
    rows: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for event in events:
        detail = event["detail"]
        if event["kind"] == "hold_created":
            if detail["hold_id"] in rows:
                problems.append(f"event {event['seq']}: hold {detail['hold_id']} made twice")
            rows[detail["hold_id"]] = _created_row(event)
        elif event["kind"] == "hold_released":
            row = rows.get(detail["hold_id"])
            if row is None or row["released_seq"] is not None:
                problems.append(f"event {event['seq']}: releases hold {detail['hold_id']}, which is not active")
                continue
            row.update(_released_change(event))
    return rows, problems


__all__ = [
    "HOLD_COLUMNS",
    "MAX_HOLD_IDS",
    "HoldError",
    "Scope",
    "count_held",
    "create_hold",
    "expected_holds",
    "held",
    "hold_record_ids",
    "list_holds",
    "release_hold",
]
