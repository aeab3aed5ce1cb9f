"""Links a resumed stream to the exchange it resumes (``exchanges.resumes_id``), inside the
storing transaction.

WHATWG HTML §9.2 (server-sent events): a client that lost a stream reconnects with the
``Last-Event-ID`` header set to the ``id`` of the last event it received; the server goes on
from there. An exchange whose request carried ``Last-Event-ID: X`` (``request_last_event_id``)
resumes the exchange to the same host whose response's last event id (``last_event_id``) was
``X``, started before it; among several, the one started last (as conversation links,
``observer.store.linking``). Exchanges of one batch are linked in ``started_at`` order, to each
other too. An id that matches no stored exchange (the first part went unobserved, or is stored
later) leaves ``resumes_id`` null; the link is not made later. Derived, so not part of the chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, select

from observer.records import Exchange
from observer.store.models import ExchangeRow

_CHUNK = 1000  # ids per IN (...)


def link_resumptions(conn: Connection, rows: Sequence[dict[str, Any]], records: Mapping[str, Exchange]) -> None:
    """Sets ``resumes_id`` on the row dicts about to be inserted (``records``: each row's record by id)."""
    wanted = sorted({r.request_last_event_id for r in records.values() if r.request_last_event_id is not None})
    known: dict[tuple[str, str], list[tuple[datetime, str]]] = {}
    ex = ExchangeRow.__table__
    for start in range(0, len(wanted), _CHUNK):
        stmt = select(ex.c.last_event_id, ex.c.host, ex.c.started_at, ex.c.id).where(
            ex.c.last_event_id.in_(wanted[start : start + _CHUNK])
        )
        for last_id, host, started_at, rid in conn.execute(stmt):
            known.setdefault((host, last_id), []).append((_aware(started_at), rid))
    for row in sorted(rows, key=lambda r: (_aware(r["started_at"]), r["id"])):
        record = records[row["id"]]
        started_at = _aware(row["started_at"])
        resumed = record.request_last_event_id
        row["resumes_id"] = None
        if resumed is not None:
            earlier = [m for m in known.get((record.host, resumed), ()) if m[0] <= started_at and m[1] != record.id]
            row["resumes_id"] = max(earlier)[1] if earlier else None
        if record.last_event_id is not None:
            known.setdefault((record.host, record.last_event_id), []).append((started_at, record.id))


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)
