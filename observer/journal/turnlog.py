"""The journaled form of a WebSocket turn's canonical events (``observer.capture.sockets``): a
turn's messages are read by its socket's session in the proxy, and what the session made of
each (canonical events and violations, ``observer.events``) is journaled as one ``DATA`` chunk,
so journal recovery rebuilds an open turn's record without the socket's session state.

A chunk is the JSON array of its items, each ``[tag, *fields]``: ``tag`` the event's class
name (``ContentDelta``, ``StopEvent``, ...) or ``Violation``, the fields in their declared
order (``dataclasses.fields``). A chunk of an older version, whose items lack fields added since
with a default (``UsageEvent``'s counts beyond the draft's, ``StopEvent.choice``), is read with
those defaults; ``UsageEvent.details`` comes back as a tuple of ``(group, name, value)`` tuples.
Pure; ``decode`` raises ``ValueError`` on a chunk ``encode`` did not make (an unknown tag, wrong
field counts, not JSON).
"""

from __future__ import annotations

from dataclasses import MISSING, fields
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
        events.ChoiceOpen,
        events.ModelEvent,
        events.UsageEvent,
        events.ResponseIdentity,
        events.ErrorEvent,
        events.StreamEnd,
        Violation,
    )
}
_FIELDS: dict[str, tuple[str, ...]] = {tag: tuple(f.name for f in fields(cls)) for tag, cls in _CLASSES.items()}
#: Fields without a default, per tag: a chunk of an older version (written before a field with a
#: default was added, e.g. ``UsageEvent.total_tokens``) has at least these.
_REQUIRED: dict[str, int] = {
    tag: sum(1 for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    for tag, cls in _CLASSES.items()
}


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
        if not _REQUIRED[tag] <= len(values) <= len(_FIELDS[tag]):
            raise ValueError(f"turn log chunk: {tag} with {len(values)} fields")
        if tag == "UsageEvent" and len(values) == len(_FIELDS[tag]):  # details: JSON arrays -> tuples
            details = values[-1]
            if not isinstance(details, list) or not all(isinstance(d, list) and len(d) == 3 for d in details):
                raise ValueError("turn log chunk: UsageEvent details are not (group, name, value) triples")
            values = [*values[:-1], tuple(tuple(d) for d in details)]
        out.append(_CLASSES[tag](*values))
    return out


__all__ = ["decode", "encode"]
