"""Framers other than SSE, and the one factory that picks a framer for a response.

A framer turns response bytes (content-decoding already removed) into messages, incrementally:
``feed(bytes) -> list[message | Violation]``, ``close() -> list[message | Violation]``. Every
message has ``event`` (SSE ``event`` field; ``""`` where the framing has none) and ``data``
(the message text, UTF-8 decoded), so dialect adapters read all framings alike.

- ``sse``: ``observer.wire.sse.SSEDecoder`` (WHATWG event stream).
- ``ndjson``: one message per line (``observer.wire.ndjson``): Ollama, AI SDK v4 data stream.
- ``json_array``: the elements of one streamed top-level JSON array (``observer.wire.jsonarray``):
  Gemini ``streamGenerateContent`` without ``alt=sse``.
- ``json``: the whole body as one message, at the end (``WholeBodyFramer``): non-streaming answers.

Also what the line and array framers share: ``positive_size`` (their bound's check) and
``nbytes`` (sizes in violation details).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from observer.records import Violation, ViolationKind


def positive_size(value: object, name: str) -> int:
    """``value`` if it is a positive int (not a bool); else ``ValueError`` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def nbytes(n: int) -> str:
    """A size for a violation detail: ``"1 byte"``, ``"N bytes"``."""
    return "1 byte" if n == 1 else f"{n} bytes"


class Framing(enum.StrEnum):
    """How a response body is cut into messages."""

    SSE = "sse"
    NDJSON = "ndjson"
    JSON_ARRAY = "json_array"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class JSONFrame:
    """One message of a non-SSE framing: ``data`` is its text (not parsed here), ``size_bytes``
    its bytes on the wire (separators included); ``event`` is always ``""``."""

    data: str
    size_bytes: int
    event: str = ""


class WholeBodyFramer:
    """The whole body as one ``JSONFrame`` at ``close`` (a non-streaming JSON answer), held up
    to ``max_bytes``; a larger body gives one ``oversize_event`` violation and no message."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._over = False

    def feed(self, data: bytes) -> list[JSONFrame | Violation]:
        if self._over:
            return []
        if len(self._buf) + len(data) > self._max:
            self._over = True
            self._buf = bytearray()
            return [Violation(ViolationKind.OVERSIZE_EVENT, None, f"JSON body exceeded {self._max} bytes")]
        self._buf += data
        return []

    def close(self) -> list[JSONFrame | Violation]:
        if self._over or not self._buf:
            return []
        raw = bytes(self._buf)
        self._buf = bytearray()
        out: list[JSONFrame | Violation] = [JSONFrame(raw.decode("utf-8", "replace"), len(raw))]
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            out.append(Violation(ViolationKind.INVALID_UTF8, None, "invalid UTF-8 replaced by U+FFFD"))
        return out


def make_framer(framing: Framing, *, max_event_bytes: int, max_json_body_bytes: int):
    """A fresh framer for ``framing``; ``max_event_bytes`` caps one streamed message and
    ``max_json_body_bytes`` a whole non-streaming body (bytes)."""
    if framing is Framing.SSE:
        from observer.wire.sse import SSEDecoder

        return SSEDecoder(max_event_bytes=max_event_bytes)
    if framing is Framing.NDJSON:
        from observer.wire.ndjson import NDJSONDecoder

        return NDJSONDecoder(max_line_bytes=max_event_bytes)
    if framing is Framing.JSON_ARRAY:
        from observer.wire.jsonarray import JSONArrayDecoder

        return JSONArrayDecoder(max_element_bytes=max_event_bytes)
    return WholeBodyFramer(max_json_body_bytes)
