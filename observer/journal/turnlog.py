"""The journaled form of a WebSocket turn's canonical events (``observer.capture.sockets``): a
turn's messages are read by its socket's session in the proxy, and what the session made of
each (canonical events and violations, ``observer.events``) is journaled as one ``DATA`` chunk,
so journal recovery rebuilds an open turn's record without the socket's session state.

A chunk is the JSON array of its items, each ``[tag, *fields]``: ``tag`` the event's class
name (``ContentDelta``, ``StopEvent``, ...) or ``Violation``, the fields in their declared
order (``dataclasses.fields``). Pure; ``decode`` raises ``ValueError`` on a chunk ``encode``
did not make (an unknown tag, wrong field counts, not JSON).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import orjson

from observer import events
from observer.records import Violation

#: The classes a chunk may hold, by tag (the canonical events and ``Violation``).
_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        events.StreamStart,
        events.ContentDelta,
        events.ContentStop,
        events.ToolCallEvent,
        events.ToolCallDelta,
        events.StopEvent,
        events.ModelEvent,
        events.UsageEvent,
        events.ErrorEvent,
        events.StreamEnd,
        Violation,
    )
}
_FIELDS: dict[str, tuple[str, ...]] = {tag: tuple(f.name for f in fields(cls)) for tag, cls in _CLASSES.items()}


def encode(items: list[Any]) -> bytes:
    """One chunk: ``items`` (canonical events and ``Violation`` values) as a JSON array."""
    out = []
    for item in items:
        tag = type(item).__name__
        out.append([tag, *(getattr(item, name) for name in _FIELDS[tag])])
    return orjson.dumps(out)


def decode(chunk: bytes) -> list[Any]:
    """The items of one chunk ``encode`` made (``ValueError`` otherwise)."""
    try:
        raw = orjson.loads(chunk)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"turn log chunk: {exc}") from None
    if not isinstance(raw, list):
        raise ValueError("turn log chunk: not a list")
    out = []
    for entry in raw:
        if not isinstance(entry, list) or not entry or entry[0] not in _CLASSES:
            raise ValueError(f"turn log chunk: unknown item {str(entry)[:60]!r}")
        tag, values = entry[0], entry[1:]
        if len(values) != len(_FIELDS[tag]):
            raise ValueError(f"turn log chunk: {tag} with {len(values)} fields")
        out.append(_CLASSES[tag](*values))
    return out


__all__ = ["decode", "encode"]
