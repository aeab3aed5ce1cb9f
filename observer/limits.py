"""Per-stream resource caps (units in the names). Pure data, shared by the tap and the addon."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps that keep one observed flow's memory bounded; each overflow is a recorded violation.

    - ``max_event_bytes``: one SSE event (``oversize_event``).
    - ``max_stream_text_chars``: generated text + tool arguments kept per stream (``oversize_stream``).
    - ``max_request_bytes``: request body parsed for the record (``oversize_request``).
    - ``max_body_bytes``: body kept verbatim for non-2xx / non-SSE answers (``response_body``).
    """

    max_event_bytes: int = 1 << 20
    max_stream_text_chars: int = 8 << 20
    max_request_bytes: int = 16 << 20
    max_body_bytes: int = 64 << 10
