"""Links a resumed stream to the exchange it resumes (``exchanges.resumes_id``), inside the
storing transaction.

WHATWG HTML §9.2 (server-sent events): a client that lost a stream reconnects with the
``Last-Event-ID`` header set to the ``id`` of the last event it received; the server goes on
from there. An exchange whose request carried ``Last-Event-ID: X`` (``request_last_event_id``)
resumes the exchange to the same host whose response's last event id (``last_event_id``) was
``X``, started before it and at most ``RESUME_WINDOW`` earlier, sent by the same sender (the
same ``key_fingerprint`` and ``proxy_user``, both possibly null: SSE ids are often small
counters, so an id alone would link strangers' streams on a shared vendor host; trial finding);
among several, the one started last (as conversation links, ``observer.store.linking``). Exchanges of one batch are linked in ``started_at`` order, to each
other too. An id that matches no stored exchange (the first part went unobserved, or is stored
later) leaves ``resumes_id`` null; the link is not made later. Derived, so not part of the chain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import Connection, select

from observer.records import Exchange
from observer.store.models import ExchangeRow

_CHUNK = 1000  # ids per IN (...)
#: How long after a stream's start a reconnection may resume it (a client's EventSource retries
#: within seconds; an hour leaves room for long streams and slow clients).
RESUME_WINDOW = timedelta(hours=1)


def link_resumptions(conn: Connection, rows: Sequence[dict[str, Any]], records: Mapping[str, Exchange]) -> None:
    """Sets ``resumes_id`` on the row dicts about to be inserted (``records``: each row's record by id)."""
    wanted = sorted({r.request_last_event_id for r in records.values() if r.request_last_event_id is not None})
    known: dict[tuple[str | None, ...], list[tuple[datetime, str]]] = {}
    ex = ExchangeRow.__table__
    for start in range(0, len(wanted), _CHUNK):
        stmt = select(
            ex.c.last_event_id, ex.c.host, ex.c.key_fingerprint, ex.c.proxy_user, ex.c.started_at, ex.c.id
        ).where(ex.c.last_event_id.in_(wanted[start : start + _CHUNK]))
        for last_id, host, fingerprint, user, started_at, rid in conn.execute(stmt):
            known.setdefault((host, fingerprint, user, last_id), []).append((_aware(started_at), rid))
    for row in sorted(rows, key=lambda r: (_aware(r["started_at"]), r["id"])):
        record = records[row["id"]]
        started_at = _aware(row["started_at"])
        sender = (record.host, record.key_fingerprint, record.proxy_user)
        row["resumes_id"] = None
        if record.request_last_event_id is not None:
            earlier = [
                m
                for m in known.get((*sender, record.request_last_event_id), ())
                if started_at - RESUME_WINDOW <= m[0] <= started_at and m[1] != record.id
            ]
            row["resumes_id"] = max(earlier)[1] if earlier else None
        if record.last_event_id is not None:
            known.setdefault((*sender, record.last_event_id), []).append((started_at, record.id))


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)
