"""What several dialects share: integer bounds and token counts, JSON object loading for
requests and events, request envelope pieces (messages, tools), base64 sizes.

Pure functions on parsed JSON; none raises on bad input: problems are appended to the caller's
list as ``Violation``s. Sources: RFC 8259 (JSON: numbers and booleans are distinct types),
RFC 4648 §4 (base64), draft §8.4 (64-bit integers), draft §4.2/§4.3 (messages, tools).
"""

from __future__ import annotations

from typing import Any

import orjson

from observer.events import CanonicalEvent
from observer.records import RequestFacts, Violation, ViolationKind

V = ViolationKind

#: Largest integer a record keeps (draft §8.4 "SHOULD use 64-bit integers"; the store's BIGINT
#: columns): a larger one is invalid, never stored.
INT64_MAX = 2**63 - 1

#: Distinct choice indexes an adapter remembers having announced (``ChoiceOpen``): a hostile
#: stream naming a new index in every chunk must not grow its memory without bound; beyond it a
#: new choice is not announced (the record keeps at most ``max_blocks`` choices anyway).
MAX_CHOICES_SEEN = 1024

#: What an adapter returns: canonical events and violations in wire order.
Out = list[CanonicalEvent | Violation]

#: JSON's name of a Python type, for violation details (``"tools is not an array"``).
JSON_NAMES = {str: "a string", bool: "a boolean", list: "an array", dict: "an object"}


def is_int(v: Any) -> bool:
    """A JSON integer (not a boolean) that fits a signed 64-bit column."""
    return isinstance(v, int) and not isinstance(v, bool) and -INT64_MAX - 1 <= v <= INT64_MAX


def count(v: Any) -> int | None:
    """A non-negative JSON integer that fits 64 bits (a token count), else ``None``."""
    return v if is_int(v) and v >= 0 else None


def load_object(data: str | bytes, out: list[Any], what: str, not_object: str | None = None) -> dict[str, Any] | None:
    """The JSON object in an event's ``data``; on failure ``None`` and a violation appended to
    ``out``: ``invalid_json`` (``"{what}: {error}"``) or ``invalid_event`` (``not_object``,
    by default ``"{what}: data is not a JSON object"``). Lone UTF-16 surrogates are not
    recovered here: the text ``observer.tap`` hands a dialect has had them replaced already, once
    for every dialect (``observer.wire.frames.text_message``, ``lone_surrogate``)."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        out.append(Violation(V.INVALID_JSON, None, f"{what}: {exc}"))
        return None
    if not isinstance(obj, dict):
        out.append(Violation(V.INVALID_EVENT, None, not_object or f"{what}: data is not a JSON object"))
        return None
    return obj


def load_request(body: bytes) -> tuple[dict[str, Any] | None, list[Violation]]:
    """(the JSON object of a request body, ``[]``), or (``None``, one ``invalid_request``) when
    the body is not JSON or not an object."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return None, [Violation(V.INVALID_REQUEST, None, f"request body is not JSON: {exc}")]
    if not isinstance(doc, dict):
        return None, [Violation(V.INVALID_REQUEST, None, "request body is not a JSON object")]
    return doc, []


def not_llm_request(body: bytes, reason: str) -> tuple[RequestFacts, list[Violation]]:
    """What a vendor dialect returns for a body on its path that does not have its request's
    shape (an HR survey posted to ``…/responses``, a team chat to ``/api/chat``): only the
    body's size, and one ``not_llm_request`` violation saying what is missing. The record of
    such an exchange keeps its metadata only (``observer.capture``): nothing of either body."""
    return RequestFacts(body_bytes=len(body)), [
        Violation(V.NOT_LLM_REQUEST, None, f"{reason}; recorded as metadata only")
    ]


def vendor_object(body: bytes) -> tuple[dict[str, Any] | None, str]:
    """(the JSON object of a vendor request body, ``""``), or (``None``, why it is not one)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, "the request body is not JSON"
    if not isinstance(doc, dict):
        return None, "the request body is not a JSON object"
    return doc, ""


def check_messages(messages: list[Any], violations: list[Violation]) -> None:
    """Appends one ``invalid_request`` counting the ``messages`` that are not objects with a
    string ``role`` (they are recorded as sent)."""
    bad = sum(1 for m in messages if not isinstance(m, dict) or not isinstance(m.get("role"), str))
    if bad:
        violations.append(Violation(V.INVALID_REQUEST, None, f"{bad} message(s) without an object and role"))


def read_tools(doc: dict[str, Any], key: str, violations: list[Violation]) -> list[dict[str, Any]]:
    """The tool objects under ``key`` as sent (non-objects dropped); a non-array value gives
    ``invalid_request``."""
    tools = doc.get(key)
    if isinstance(tools, list):
        return [t for t in tools if isinstance(t, dict)]
    if tools is not None:
        violations.append(Violation(V.INVALID_REQUEST, None, f"{key} is not an array"))
    return []


def tool_names(tools: list[dict[str, Any]]) -> list[str]:
    """The string ``name`` of each tool that has one (draft §4.2 tools; Anthropic's client and
    server tools)."""
    return [t["name"] for t in tools if isinstance(t.get("name"), str)]


def base64_decoded_size(data: str) -> int:
    """Decoded size in bytes of a base64 string (RFC 4648 §4), computed without decoding:
    3 bytes per 4 characters (floor, so unpadded input works too), minus one per ``=`` pad;
    whitespace ignored."""
    chars = len(data) - sum(data.count(c) for c in " \t\r\n")
    stripped = data.rstrip(" \t\r\n")
    pad = min(2, len(stripped) - len(stripped.rstrip("=")))
    return max(0, chars * 3 // 4 - pad)
