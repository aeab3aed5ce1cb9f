"""Incidents under review and their report deadlines (EU AI Act Art. 73).

An incident has a title, a category, the time the deployer became aware of it (``aware_at``),
a status, append-only notes and linked exchanges. The **report deadline** follows from the
category (``CATEGORIES``; compliance-requirements item 9):

- ``widespread_infringement`` and ``critical_infrastructure`` (Art. 3(49)(b)): 2 days after
  ``aware_at`` (Art. 73(3));
- ``death``: 10 days (Art. 73(4));
- ``serious_harm_to_health`` (Art. 3(49)(a)), ``fundamental_rights`` (Art. 3(49)(c)),
  ``property_or_environment`` (Art. 3(49)(d)): 15 days (Art. 73(2));
- ``other`` (not a serious incident in the sense of Art. 3(49)): no deadline.

Art. 73(2)-(4) say "not later than" N days "after ... becoming aware": the deadline is
``aware_at`` + N days, to the second. Status: ``open`` -> ``reported`` -> ``closed`` (or
``open`` -> ``closed``); a closed incident can no longer change (a new one is opened instead),
so what was reported stays as it was.

**Linking an exchange places it under a legal hold** (Art. 73(6): nothing that could affect the
evaluation of the cause may be altered): each link call makes one hold naming the exchanges it
links (``observer.store.holds``), in the same transaction, and the link row keeps its id.
Releasing those holds is a separate, deliberate act (``DELETE /v1/holds/{id}``). Linking a
record id the store does not have is refused (``IncidentError``), as is a link made twice.

The incident rows are mutable state (compliance-requirements §2); who changed what is in the
access log (``observer.store.access``: every API call with its body), and the holds are chained
store events.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, update

from observer.errors import ObserverError
from observer.shape import rfc3339
from observer.store.checkpoint import CheckpointKey
from observer.store.events import lock
from observer.store.holds import Scope, create_hold_in
from observer.store.models import ExchangeRow, IncidentExchangeRow, IncidentNoteRow, IncidentRow

#: Category -> days from ``aware_at`` to the report deadline (``None``: no deadline).
CATEGORIES: dict[str, int | None] = {
    "widespread_infringement": 2,
    "critical_infrastructure": 2,
    "death": 10,
    "serious_harm_to_health": 15,
    "fundamental_rights": 15,
    "property_or_environment": 15,
    "other": None,
}
STATUSES = ("open", "reported", "closed")
TRANSITIONS = {("open", "reported"), ("open", "closed"), ("reported", "closed")}
TITLE_MAX = 500
#: ``aware_at`` may be at most this far ahead of the clock (skew), and not before ``AWARE_MIN``.
AWARE_SKEW = timedelta(days=1)
AWARE_MIN = datetime(2000, 1, 1, tzinfo=timezone.utc)
NOTE_MAX = 20_000
LINK_MAX = 1000


class IncidentError(ObserverError, ValueError):
    """An incident change that cannot be made (bad value, unknown record, closed incident)."""

    code = "invalid_incident"


class IncidentNotFound(ObserverError, LookupError):
    code = "not_found"


class IncidentClosed(IncidentError):
    """A change to a closed incident (closing is final: open a new one)."""


def deadline(category: str, aware_at: datetime) -> datetime | None:
    """The report deadline of an incident (``CATEGORIES``); ``None`` for ``other``."""
    days = CATEGORIES[category]
    return None if days is None else aware_at + timedelta(days=days)


def _check(
    title: str | None = None,
    category: str | None = None,
    status: str | None = None,
    aware_at: datetime | None = None,
    at: datetime | None = None,
) -> None:
    if title is not None and (not title.strip() or len(title) > TITLE_MAX or "\x00" in title):
        raise IncidentError(f"title: 1..{TITLE_MAX} characters, not blank, without NUL")
    if aware_at is not None and at is not None and not AWARE_MIN <= aware_at <= at + AWARE_SKEW:
        raise IncidentError("aware_at: not in the future (one becomes aware of what happened), not before 2000")
    if category is not None and category not in CATEGORIES:
        raise IncidentError(f"category: one of {', '.join(CATEGORIES)}")
    if status is not None and status not in STATUSES:
        raise IncidentError(f"status: one of {', '.join(STATUSES)}")


def create_incident(
    engine: Engine,
    key: CheckpointKey,
    store_id: str,
    *,
    title: str,
    category: str,
    aware_at: datetime,
    actor: str,
    at: datetime,
    note: str | None = None,
    exchange_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """Opens an incident (with a first note and linked exchanges, when given); returns it as
    ``get_incident`` does. Raises ``IncidentError``."""
    _check(title, category, aware_at=aware_at, at=at)
    incident_id = str(uuid.uuid4())
    row = {
        "id": incident_id,
        "title": title,
        "category": category,
        "aware_at": aware_at,
        "status": "open",
        "created_at": at,
        "created_by": actor,
        "updated_at": at,
        "updated_by": actor,
    }
    with engine.begin() as conn:
        conn.execute(insert(IncidentRow.__table__), [row])
        if note is not None:
            _add_note(conn, incident_id, note, actor, at)
        if exchange_ids:
            lock(conn)
            _link(conn, key, store_id, incident_id, title, exchange_ids, actor, at)
        return _get(conn, incident_id)


def update_incident(
    engine: Engine,
    key: CheckpointKey,
    store_id: str,
    incident_id: str,
    *,
    actor: str,
    at: datetime,
    title: str | None = None,
    category: str | None = None,
    aware_at: datetime | None = None,
    status: str | None = None,
    note: str | None = None,
    link: Sequence[str] = (),
) -> dict[str, Any]:
    """Changes what is given (a note is appended; ``link``: exchange ids to link and hold);
    returns the incident. Raises ``IncidentNotFound``, ``IncidentClosed``, ``IncidentError`` (a
    bad value)."""
    _check(title, category, status, aware_at, at)
    table = IncidentRow.__table__
    with engine.begin() as conn:
        lock(conn)  # one change of an incident at a time (its note positions, its holds)
        found = conn.execute(select(table).where(table.c.id == incident_id)).first()
        if found is None:
            raise IncidentNotFound(f"no incident {incident_id[:40]!r}")
        if found.status == "closed":
            raise IncidentClosed("the incident is closed; open a new one")
        if status is not None and status != found.status and (found.status, status) not in TRANSITIONS:
            raise IncidentError(f"status cannot go from {found.status} to {status}")
        values = {
            k: v
            for k, v in (("title", title), ("category", category), ("aware_at", aware_at), ("status", status))
            if v is not None
        }
        conn.execute(update(table).where(table.c.id == incident_id).values(**values, updated_at=at, updated_by=actor))
        if note is not None:
            _add_note(conn, incident_id, note, actor, at)
        if link:
            _link(conn, key, store_id, incident_id, title or found.title, link, actor, at)
        return _get(conn, incident_id)


def _add_note(conn: Connection, incident_id: str, text: str, author: str, at: datetime) -> None:
    if not text.strip() or len(text) > NOTE_MAX or "\x00" in text:
        raise IncidentError(f"note: 1..{NOTE_MAX} characters, not blank, without NUL")
    notes = IncidentNoteRow.__table__
    last = conn.scalar(select(func.max(notes.c.position)).where(notes.c.incident_id == incident_id)) or 0
    conn.execute(
        insert(notes), [{"incident_id": incident_id, "position": last + 1, "at": at, "author": author, "text": text}]
    )


def _link(
    conn: Connection,
    key: CheckpointKey,
    store_id: str,
    incident_id: str,
    title: str,
    exchange_ids: Sequence[str],
    actor: str,
    at: datetime,
) -> None:
    ids = list(dict.fromkeys(exchange_ids))
    if len(ids) > LINK_MAX:
        raise IncidentError(f"link at most {LINK_MAX} exchanges at once")
    bad = next((i for i in ids if not 0 < len(i) <= 36 or "\x00" in i), None)
    if bad is not None:
        raise IncidentError(f"not a record id: {bad[:40]!r}")
    ex = ExchangeRow.__table__
    stored = set(conn.scalars(select(ex.c.id).where(ex.c.id.in_(ids))))
    missing = [i for i in ids if i not in stored]
    if missing:
        raise IncidentError(f"no record with id {missing[0]!r} in the store ({len(missing)} unknown)")
    links = IncidentExchangeRow.__table__
    linked = set(
        conn.scalars(
            select(links.c.exchange_id).where(links.c.incident_id == incident_id, links.c.exchange_id.in_(ids))
        )
    )
    if linked:
        raise IncidentError(f"exchange {sorted(linked)[0]} is linked to this incident already")
    hold = create_hold_in(
        conn, key, store_id, Scope(exchange_ids=tuple(ids)), f"incident {incident_id}: {title}"[:2000], actor, at
    )
    conn.execute(
        insert(links),
        [
            {"incident_id": incident_id, "exchange_id": i, "linked_at": at, "linked_by": actor, "hold_id": hold["id"]}
            for i in ids
        ],
    )


def get_incident(engine: Engine, incident_id: str) -> dict[str, Any]:
    """The incident with its ``deadline``, notes and linked exchanges (times as RFC 3339).
    Raises ``IncidentNotFound``."""
    with engine.connect() as conn:
        return _get(conn, incident_id)


def _get(conn: Connection, incident_id: str) -> dict[str, Any]:
    table = IncidentRow.__table__
    if len(incident_id) > 36 or "\x00" in incident_id:
        raise IncidentNotFound(f"no incident {incident_id[:40]!r}")
    found = conn.execute(select(table).where(table.c.id == incident_id)).first()
    if found is None:
        raise IncidentNotFound(f"no incident {incident_id[:40]!r}")
    notes = IncidentNoteRow.__table__
    links = IncidentExchangeRow.__table__
    out = _summary(found._mapping)
    out["notes"] = [
        {"position": n.position, "at": rfc3339(n.at), "author": n.author, "text": n.text}
        for n in conn.execute(select(notes).where(notes.c.incident_id == incident_id).order_by(notes.c.position))
    ]
    out["exchanges"] = [
        {
            "exchange_id": r.exchange_id,
            "linked_at": rfc3339(r.linked_at),
            "linked_by": r.linked_by,
            "hold_id": r.hold_id,
        }
        for r in conn.execute(
            select(links).where(links.c.incident_id == incident_id).order_by(links.c.linked_at, links.c.exchange_id)
        )
    ]
    return out


def _summary(m: Any) -> dict[str, Any]:
    due = deadline(m["category"], m["aware_at"])
    return {
        "id": m["id"],
        "title": m["title"],
        "category": m["category"],
        "status": m["status"],
        "aware_at": rfc3339(m["aware_at"]),
        "deadline": None if due is None else rfc3339(due),
        "created_at": rfc3339(m["created_at"]),
        "created_by": m["created_by"],
        "updated_at": rfc3339(m["updated_at"]),
        "updated_by": m["updated_by"],
    }


def list_incidents(
    engine: Engine, *, status: str | None = None, exchange_id: str | None = None
) -> list[dict[str, Any]]:
    """Incident summaries (with ``deadline``), newest ``aware_at`` first; filtered by status or
    by a linked exchange."""
    table = IncidentRow.__table__
    stmt = select(table).order_by(table.c.aware_at.desc(), table.c.id)
    if status is not None:
        stmt = stmt.where(table.c.status == status)
    if exchange_id is not None:
        links = IncidentExchangeRow.__table__
        stmt = stmt.where(table.c.id.in_(select(links.c.incident_id).where(links.c.exchange_id == exchange_id)))
    with engine.connect() as conn:
        return [_summary(r._mapping) for r in conn.execute(stmt)]
