"""An SSE event of type ``error`` is an error, whatever the dialect and whatever its data.

Servers send mid-stream errors under the event type ``error`` (Anthropic, OpenAI Responses and
the draft standard by their specs; OpenAI-compatible servers by habit) and, before llama.cpp
fixed it in Sept. 2025 (ggml-org/llama.cpp #16104, #16109), under an ``error:`` *field*, which
``observer.wire.sse`` surfaces as an event of type ``error`` (``observer.wire.recovery``, with a
``nonstandard_field`` violation), its value JSON or plain text (``error: model overloaded``).

Each dialect maps the error events it knows. This module is the rule for the rest, applied by
``observer.tap`` to every SSE message of type ``error`` (issue 16 item 4: an error sent under a
field the WHATWG parser ignores must still make the outcome ``error`` with the error recorded):
when the adapter's events for it hold no ``ErrorEvent``, one is added, read from the data by
:func:`read_error` (and an empty one, neither code nor message, is read so). An ``error`` event is
not the answer: text, tool calls, stops and choices the adapter read in it (a chat chunk sent
under ``error:``, which no WHATWG client shows) are not applied, and one ``invalid_event`` says
how many were left out (trial finding: they had joined the record's text). The adapter's own
violations stay (a JSON dialect reports text data as ``invalid_json``: the server broke that rule
too). Pure; raises nothing.
"""

from __future__ import annotations

from typing import Any

import orjson

from observer.dialects.toolkit import is_int
from observer.events import (
    ChoiceOpen,
    ContentDelta,
    ContentStop,
    ErrorEvent,
    StopEvent,
    ToolCallDelta,
    ToolCallEvent,
)
from observer.records import Violation, ViolationKind

__all__ = ["ERROR_TYPE", "NOT_JSON", "read_error", "with_error"]

#: The SSE event type this rule applies to (WHATWG event types are case-sensitive).
ERROR_TYPE = "error"
#: ``read_error``'s ``obj`` for data that is not JSON.
NOT_JSON: Any = object()
#: What an ``error`` event may not add to the record: the answer's content and its end.
_CONTENT = (ContentDelta, ContentStop, ToolCallEvent, ToolCallDelta, StopEvent, ChoiceOpen)
#: Keys naming an error's code, in the order they are looked for (OpenAI ``code`` then ``type``;
#: Google's ``status`` beside its numeric ``code``).
_CODE_KEYS = ("code", "type", "status")


def with_error(items: list[Any], obj: Any, data: str | bytes) -> list[Any]:
    """``items`` (an adapter's canonical events and violations for one SSE event of type
    ``error``) as they are when one of them is an ``ErrorEvent`` that says something; an
    ``ErrorEvent`` with neither code nor message read from data that is not an object with a
    ``code`` or ``message`` member (so not in the dialect's own error shape: a draft error event
    with both ``null`` stays as it is) replaced by ``read_error(obj, data)``, its ``seq`` kept,
    when that says more; with no ``ErrorEvent``, ``read_error(obj, data)`` appended. ``obj``: the
    data parsed as JSON, or ``NOT_JSON``. The answer's content among ``items`` is left out, with
    one ``invalid_event`` (module docstring)."""
    kept = [item for item in items if not isinstance(item, _CONTENT)]
    if len(kept) < len(items):
        n = len(items) - len(kept)
        detail = f"an error event is not the answer: {n} content event{'s' if n > 1 else ''} in it not recorded"
        items = [*kept, Violation(ViolationKind.INVALID_EVENT, None, detail)]
    for i, item in enumerate(items):
        if item.__class__ is ErrorEvent:
            if item.code is not None or item.message is not None:
                return items
            if isinstance(obj, dict) and ("code" in obj or "message" in obj):
                return items
            found = read_error(obj, data)
            if found.code is None and found.message is None:
                return items
            return [*items[:i], ErrorEvent(item.seq, found.code, found.message), *items[i + 1 :]]
    return [*items, read_error(obj, data)]


def read_error(obj: Any, data: str | bytes) -> ErrorEvent:
    """The error an ``error`` event's data says, ``seq`` ``None``:

    - a JSON object: its ``error`` member when that is an object (``{"error": {...}}``, OpenAI's
      and Google's envelope) or a string (the message), else the object itself; the code is the
      first non-empty string of ``code``, ``type``, ``status`` (OpenAI's ``code`` or ``type``,
      Google's ``status`` over its HTTP-like number; a ``type`` of ``"error"`` is the event's
      type, Anthropic's and the draft's, not a code), else the first integer of them as decimal
      text (OpenRouter's 502); the message its ``message`` string, else the data's text (nothing
      lost);
    - a JSON string: the message; other JSON (a number, an array): the data's text as message;
    - ``NOT_JSON`` (plain text, ``error: model overloaded``): the text is the message, parsed as
      JSON first when it is (the tap may hand text whose lone surrogates it replaced).

    Empty text gives ``message`` ``None``. Lengths are the reassembler's to clip."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if obj is NOT_JSON:
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            return ErrorEvent(None, None, text.strip() or None)
    if isinstance(obj, str):
        return ErrorEvent(None, None, obj or None)
    if not isinstance(obj, dict):
        return ErrorEvent(None, None, text.strip() or None)
    inner = obj.get("error")
    if isinstance(inner, str) and inner:
        return ErrorEvent(None, _code(obj), inner)
    if isinstance(inner, dict):
        obj = inner
    message = obj.get("message")
    return ErrorEvent(None, _code(obj), message if isinstance(message, str) and message else text.strip() or None)


def _code(obj: dict[str, Any]) -> str | None:
    values = [obj.get(key) for key in _CODE_KEYS]
    for key, value in zip(_CODE_KEYS, values, strict=True):
        if isinstance(value, str) and value and not (key == "type" and value == ERROR_TYPE):
            return value
    for value in values:
        if is_int(value):
            return str(value)
    return None
