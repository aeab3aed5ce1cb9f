"""Per-stream resource caps (units in the names). Pure data, shared by the tap and the addon."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps that keep one observed flow's memory bounded; each overflow is a recorded violation.

    Each field is the setting of the same name in ``observer.config.Settings`` (units, ranges,
    help; ``Settings.limits`` builds this), whose defaults a test checks equal to these.

    - ``max_event_bytes``: one SSE event (``oversize_event``).
    - ``max_stream_text_chars``: generated text + tool arguments kept per stream (``oversize_stream``).
    - ``max_request_bytes``: request body parsed for the record (``oversize_request``).
    - ``max_held_request_bytes``: not per flow but per proxy: the request bodies held at once,
      across all flows, until their response headers say whether they are LLM traffic
      (``observer.capture.held.HeldBudget``; ``oversize_request`` naming it).
    - ``max_body_bytes``: body kept verbatim for non-2xx / non-SSE answers (``response_body``).
    - ``max_violations``, ``max_tool_calls``, ``max_blocks``: items kept per record; beyond
      them items are counted in one ``oversize_record`` violation (a hostile stream of millions
      of bad events must not make a multi-GB record).
    - ``max_decode_ratio``: decoded bytes per Content-Encoded byte (plus 1 MiB) before decoding
      stops with ``content_decoding_error`` (decompression bombs on the proxy loop).
    - ``max_stream_events``: messages parsed per stream; beyond it observation stops with
      ``oversize_stream`` (bounds the proxy-loop CPU one hostile stream can take: a small
      compressed body can expand into millions of tiny events).
    - Strings the stream names (model, ids, tool names, stop reasons, error codes) are kept up to
      ``MAX_NAME_CHARS``, error messages up to ``MAX_MESSAGE_CHARS``, violation details up to
      ``MAX_DETAIL_CHARS`` (counts alone do not bound memory: 1000 tool calls with 1 MB names did).
    """

    max_event_bytes: int = 1 << 20
    max_stream_text_chars: int = 8 << 20
    max_request_bytes: int = 16 << 20
    max_held_request_bytes: int = 64 << 20
    max_body_bytes: int = 64 << 10
    max_json_body_bytes: int = 16 << 20
    max_stream_events: int = 500_000
    max_violations: int = 1000
    max_tool_calls: int = 1000
    max_blocks: int = 1000
    max_decode_ratio: int = 200


DEFAULT_LIMITS = Limits()
MAX_NAME_CHARS = 1024
MAX_MESSAGE_CHARS = 64 << 10
MAX_DETAIL_CHARS = 512


def clip(text: str | None, limit: int) -> str | None:
    """``text`` cut to ``limit`` characters, with a marker saying how many were dropped."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}…[{len(text) - limit} chars cut]"
