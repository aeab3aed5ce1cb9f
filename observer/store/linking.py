"""Links each exchange stored to the conversation it continues (``exchanges.conversation_id``),
from the hashes of ``observer.conversation``, inside the storing transaction.

An exchange continues an earlier one when one of its ``link_candidates`` (the hashes of its
request's message prefixes, longest first) is that exchange's ``continuation_hash`` (its
messages and its answer): it takes that exchange's ``conversation_id``; else it begins a
conversation of its own (its id). Among several earlier exchanges with the matching hash (the
same conversation asked twice), the one started last before it is taken. Exchanges of one batch
are linked in ``started_at`` order, to each other too.

Linking happens in storing order: a turn stored before the turn it continues (two proxies, one
of them behind with its journal) begins a conversation of its own; the link is not made later.
The conversation id is derived, so it is not part of the chain (``observer.store.chain``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Connection, select

from observer.conversation import link_hashes
from observer.records import Exchange
from observer.store.models import ExchangeRow

#: Hashes per ``IN (...)`` when looking for earlier exchanges.
_CHUNK = 1000


def link(conn: Connection, rows: Sequence[dict[str, Any]], records: Mapping[str, Exchange]) -> None:
    """Sets ``continuation_hash`` and ``conversation_id`` on the row dicts about to be inserted
    (``records``: each row's record by id)."""
    facts: dict[str, tuple[str | None, list[str]]] = {}
    wanted: set[str] = set()
    for row in rows:
        record = records[row["id"]]
        facts[row["id"]] = link_hashes(record)
        wanted.update(facts[row["id"]][1])
    known: dict[str, list[tuple[datetime, str]]] = {}
    ex = ExchangeRow.__table__
    hashes = sorted(wanted)
    for start in range(0, len(hashes), _CHUNK):
        stmt = select(ex.c.continuation_hash, ex.c.started_at, ex.c.conversation_id, ex.c.id).where(
            ex.c.continuation_hash.in_(hashes[start : start + _CHUNK])
        )
        for h, started_at, conversation_id, rid in conn.execute(stmt):
            known.setdefault(h, []).append((_aware(started_at), conversation_id or rid))
    for row in sorted(rows, key=lambda r: (_aware(r["started_at"]), r["id"])):
        own, candidates = facts[row["id"]]
        started_at = _aware(row["started_at"])
        row["conversation_id"] = _find(known, candidates, started_at) or row["id"]
        row["continuation_hash"] = own
        if own is not None:
            known.setdefault(own, []).append((started_at, row["conversation_id"]))


def _find(known: Mapping[str, list[tuple[datetime, str]]], candidates: list[str], before: datetime) -> str | None:
    for h in candidates:
        earlier = [m for m in known.get(h, ()) if m[0] <= before]
        if earlier:
            return max(earlier)[1]
    return None


def _aware(at: datetime) -> datetime:
    """``at`` comparable with the stored times (a naive time, which the insert then refuses,
    is taken as UTC here)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)
