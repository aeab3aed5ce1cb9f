"""The records of a multi-turn stream (an HTTP response cut into turns by ``observer.tap``:
Cursor's agent ``Run``): their ids and skeletons. Used live (``observer.capture.flows``) and by
journal recovery (``observer.journal.recovery``), so a turn recorded before a crash and rebuilt
after it has the same id and is stored once (the store skips ids it holds).

Ids: turn ``index`` of the flow whose record id is ``key`` is ``stream_turn_record_id(key,
index)``; a stream that was never cut keeps ``key``. Starts: turn 0 starts with the request,
turn ``n`` when turn ``n - 1`` ended (its ``ended_at``; the parse counts its ``ttft_s`` from
there), or live, when the client's follow-up arrived (``observer.capture.flows``).
"""

from __future__ import annotations

import copy
import uuid
from datetime import datetime

from observer.records import Exchange, RequestFacts


def stream_turn_record_id(key: str, index: int) -> str:
    """The record id of turn ``index`` (from 0) of the stream whose record id is ``key`` (a
    UUID string): a UUID 5 in ``key``'s namespace. Raises ``ValueError`` if ``key`` is not a UUID."""
    return str(uuid.uuid5(uuid.UUID(key), f"stream-turn:{index}"))


def turn_skeleton(
    exchange: Exchange, index: int, started_at: datetime | None, request: RequestFacts | None = None
) -> Exchange:
    """A copy of the stream's record skeleton ``exchange`` for turn ``index``: its id
    (``stream_turn_record_id``), its start (``started_at``; ``None``: the stream's), and its
    request facts (``request``; ``None``: the stream's, as read when the response started).
    ``exchange`` is not changed; the copy shares nothing that assembling the record mutates."""
    turn = copy.copy(exchange)
    turn.id = stream_turn_record_id(exchange.id, index)
    if started_at is not None:
        turn.started_at = started_at
    if request is not None:
        turn.request = request
    return turn


__all__ = ["stream_turn_record_id", "turn_skeleton"]
