"""Replay in the draft standard's format: one recorded ``Exchange``, whatever dialect it was
recorded from, as an ``application/llm-request+json`` request envelope (draft §4.2) and the
``text/event-stream`` of draft events it would have been answered with (draft §5).

Pure module: no I/O, no clock (``created`` is the record's own ``started_at``).
``standard_replay(exchange)`` gives ``(envelope, events)``; ``encode_sse(events)`` the SSE
bytes. Fed back through the standard dialect (``observer.dialects.standard``, ``llm-stream-1.0``)
the stream gives the same text, text blocks, tool calls, usage, stop reason, error and outcome
(``tests/unit/test_replay.py`` does it for every wire fixture).

**The request envelope** (draft §4.2-§4.7), from ``exchange.request`` as recorded:

- ``version`` ``"1.0"``, ``stream`` true (the replay is a stream, whatever the original asked;
  the record keeps ``request.stream``), ``model``: the requested model, ``null`` when none was
  recorded (draft-required: the envelope is then not conformant, and says so by the ``null``).
- ``messages``, ``tools``, ``parameters``, ``metadata``: exactly as recorded, in the recorded
  dialect's own shapes (an Anthropic ``content`` part list, Gemini ``parts``, OpenAI
  ``{"type": "function", "function": ...}`` tools): turning them into the draft's shapes needs
  each vendor's knowledge, which lives in the dialect registry, not here. Binary parts are what
  the record kept of them: ``{"type", "media_type", "data_bytes"}`` (the decoded size; the
  base64 ``data`` the draft requires was never stored). ``tools``, ``parameters`` and
  ``metadata`` are left out when empty. ``metadata.user_id`` and ``metadata.request_id`` (draft
  §4.6) are the record's ``request.end_user`` and ``request.request_id`` where those are known
  and the recorded metadata has no such key.
- ``extensions`` (draft §4.7, keys ``vendor:name``): the recorded extension names, each
  ``null`` (the record keeps names only, draft §8.3); ``llm-stream-observer:recorded_dialect``
  (the dialect the exchange was recorded in, so a reader knows whose shapes the messages and
  tools are in) and, when tools were declared, ``llm-stream-observer:tool_names`` (the names the
  recorded dialect read from them); ``llm-stream-observer:tools_declared_elsewhere``
  (``true``) when the record's tool calls are ``declared: null`` (the recorded request did not
  declare its tools, e.g. an AI SDK app's: the standard dialect then judges none either).

**The events** (draft §5.2-§5.4), ``v`` ``"1.0"``, ``seq`` 0, 1, 2, … in this order:

1. ``stream.start``: ``model`` (the response's, ``null`` when the vendor named none: draft-required,
   so the standard dialect flags ``invalid_event`` and records ``null`` again), ``created``
   (``started_at`` in whole Unix seconds: the observer's clock at the request, not the vendor's),
   ``request_id`` when the record has one, and the response identity the record has
   (``response_id``, ``system_fingerprint``, ``service_tier``) as ``extensions``
   ``llm-stream-observer:<name>``.
2. Content blocks in ``index`` order: ``content.delta`` events (``index`` as recorded, ``role``
   ``"assistant"``, ``delta.text`` in pieces of at most ``DELTA_MAX_CHARS`` characters, one
   ``""`` delta for an empty block, so that it exists again), then ``content.stop`` when the
   block has a recorded ``stop_reason``. The draft has text blocks only: by default only
   ``text`` blocks are replayed, and reasoning and refusal blocks are left out (a draft reader
   would take them for the answer); with ``all_blocks`` every block is replayed, the others
   carrying their type in ``extensions["llm-stream-observer:block_type"]`` (draft §4.7
   namespacing), which the standard dialect reads back. ``tool_use`` blocks (the block of a tool call, draft §4.8) are step 4.
3. ``tool.call`` per recorded tool call, in recorded order: ``index``, ``id``, ``name`` and
   ``arguments`` verbatim (``null`` where the record has none: draft-required, flagged
   ``invalid_event`` on the way back, recorded ``null`` again).
4. ``content.stop`` for each recorded ``tool_use`` block (draft §4.8: ``tool.call`` then
   ``content.stop`` with ``tool_use`` at one index).
5. The message's stop reason, when the last ``content.stop`` above does not already give it
   (vendors report one per message, the draft one per block): one more ``content.stop`` with
   ``stop_reason`` (``null`` if only a raw one was recorded) and the vendor's value in
   ``extensions["llm-stream-observer:stop_reason_raw"]`` when it differs (read back by the
   standard dialect as ``stop_reason_raw``). Its
   ``index`` (``message_stop_index``): for ``tool_use``, the last tool call's; else the last
   replayed text block's, else the last replayed block's, else the last tool call's, else 0.
   Where no block had that index the way back has one more, empty, block there — the draft's
   shape of a stop reason, and the only block the round trip adds; when nothing replayed
   opened that index (index 0 of a record with no replayed block and no tool call), an empty
   ``content.delta`` opens it first (draft §5.4: each block a ``content.stop`` ends was begun).
   Before it, per-choice results (``choices``: OpenAI ``n > 1``, Gemini ``candidateCount``), in
   the record's order: one ``content.stop`` per choice that stopped, at its text block
   (``choice_blocks``), with the choice's ``stop_reason``, its raw one as above and
   ``extensions["llm-stream-observer:choice"]`` (the choice's index), which the standard dialect
   reads back as that choice's stop. Each choice is announced on the first ``content.delta`` of
   its block (step 2: ``extensions["llm-stream-observer:choices"]``, the indexes of the choices
   whose text it is; an empty delta opens the block of a choice without text), so a choice that
   never stopped comes back too, without a stop reason. A draft reader without the extensions
   sees each answer's block, stopped with its reason. The message's ``content.stop`` follows when
   the last choice's stop does not already give it.
6. ``usage`` when usage was reported (draft: SHOULD, not MUST): ``usage_fields``.
7. ``error`` when the record has one: ``code`` and ``message`` (``null`` when not sent).
8. ``stream.end`` (with ``request_id`` when known) only when the stream ended (``ended``):
   a ``completed`` record, or an ``error`` one without a ``missing_stream_end`` violation. A
   truncated, aborted, interrupted or unreadable record replays without it, so its outcome
   comes back (``truncated``; the transport's end, such as a client abort, is no event and is
   for the reader of the replay to supply).

An ``http_error`` record (a non-2xx answer: the endpoint accepted no stream, draft §5.3
``stream.start``) replays as no event at all; its status is the record's ``status_code``.

Not replayed: timings, violations, ``response_body``, the HTTP facts. Raises nothing for any
``Exchange``; ``encode_sse`` raises ``orjson.JSONEncodeError`` only for a string holding a
lone surrogate, which the store never keeps.
"""

from __future__ import annotations

from typing import Any

import orjson

from observer.records import Block, Exchange, Outcome, Usage, ViolationKind

VERSION = "1.0"  # draft §4.2 ``version``, §5.2 ``v``
NAMESPACE = "llm-stream-observer"  # our ``vendor`` part of extension keys (draft §4.7)
BLOCK_TYPE = f"{NAMESPACE}:block_type"
STOP_REASON_RAW = f"{NAMESPACE}:stop_reason_raw"
CHOICE = f"{NAMESPACE}:choice"
CHOICES = f"{NAMESPACE}:choices"
TOOLS_DECLARED_ELSEWHERE = f"{NAMESPACE}:tools_declared_elsewhere"
RECORDED_DIALECT = f"{NAMESPACE}:recorded_dialect"
TOOL_NAMES = f"{NAMESPACE}:tool_names"
#: The record's response identity, on ``stream.start`` (``extensions``), when known.
IDENTITY_KEYS = ("response_id", "system_fingerprint", "service_tier")
#: The record's usage counts beyond the draft's two, on ``usage`` (``extensions``), when reported.
USAGE_KEYS = ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_output_tokens", "total_tokens")
USAGE_DETAILS = f"{NAMESPACE}:usage_details"
DELTA_MAX_CHARS = 8192  # characters per content.delta: far below the 1 MiB event cap even escaped
TEXT = "text"
TOOL_USE = "tool_use"

__all__ = [
    "BLOCK_TYPE",
    "CHOICE",
    "CHOICES",
    "DELTA_MAX_CHARS",
    "RECORDED_DIALECT",
    "STOP_REASON_RAW",
    "IDENTITY_KEYS",
    "TOOL_NAMES",
    "TOOLS_DECLARED_ELSEWHERE",
    "USAGE_DETAILS",
    "USAGE_KEYS",
    "choice_blocks",
    "encode_sse",
    "ended",
    "message_stop_index",
    "request_envelope",
    "standard_replay",
    "stream_events",
    "usage_fields",
]


def standard_replay(exchange: Exchange, *, all_blocks: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the request envelope, the list of event objects) of ``exchange`` (module docstring)."""
    return request_envelope(exchange), stream_events(exchange, all_blocks=all_blocks)


def request_envelope(exchange: Exchange) -> dict[str, Any]:
    """The ``application/llm-request+json`` object (draft §4.2) of ``exchange.request``."""
    request = exchange.request
    envelope: dict[str, Any] = {
        "version": VERSION,
        "stream": True,
        "model": request.model,
        "messages": request.messages,
    }
    if request.tools:
        envelope["tools"] = request.tools
    if request.parameters:
        envelope["parameters"] = request.parameters
    metadata = dict(request.metadata)
    if request.end_user is not None:
        metadata.setdefault("user_id", request.end_user)
    if request.request_id is not None:
        metadata.setdefault("request_id", request.request_id)
    if metadata:
        envelope["metadata"] = metadata
    extensions: dict[str, Any] = dict.fromkeys(request.extensions)
    extensions[RECORDED_DIALECT] = exchange.dialect
    if request.tool_names:
        extensions[TOOL_NAMES] = list(request.tool_names)
    if any(call.declared is None for call in exchange.tool_calls):
        extensions[TOOLS_DECLARED_ELSEWHERE] = True
    envelope["extensions"] = extensions
    return envelope


def stream_events(exchange: Exchange, *, all_blocks: bool = False) -> list[dict[str, Any]]:
    """The draft events replaying ``exchange``'s response, ``seq`` from 0 (module docstring)."""
    events = _Events()
    if exchange.outcome == Outcome.HTTP_ERROR:
        return events.out
    start: dict[str, Any] = {"model": exchange.model, "created": int(exchange.started_at.timestamp())}
    if exchange.request_id is not None:
        start["request_id"] = exchange.request_id
    identity = {f"{NAMESPACE}:{k}": getattr(exchange, k) for k in IDENTITY_KEYS if getattr(exchange, k) is not None}
    if identity:
        start["extensions"] = identity
    events.add("stream.start", start)

    blocks = _replayed_blocks(exchange, all_blocks)
    chosen = choice_blocks(exchange)
    announced: dict[int, list[int]] = {}  # block index -> the choices whose text it is
    for choice, index in chosen:
        announced.setdefault(index, []).append(choice["index"])
    last_stop: str | None = None
    stopped = False
    for block in blocks:
        for i, piece in enumerate(_pieces(block.text)):
            extensions: dict[str, Any] = {} if block.type == TEXT else {BLOCK_TYPE: block.type}
            if i == 0 and block.index in announced:
                extensions[CHOICES] = announced.pop(block.index)
            delta = {"index": block.index, "role": "assistant", "delta": {"text": piece}}
            events.add("content.delta", {**delta, "extensions": extensions} if extensions else delta)
        if block.stop_reason is not None:
            events.add("content.stop", {"index": block.index, "stop_reason": block.stop_reason})
            last_stop, stopped = block.stop_reason, True
    for call in exchange.tool_calls:
        fields = {"index": call.index, "id": call.id, "name": call.name, "arguments": call.arguments}
        events.add("tool.call", fields)
    for block in sorted(exchange.blocks, key=_index):
        if block.type == TOOL_USE:
            events.add("content.stop", {"index": block.index, "stop_reason": block.stop_reason})
            last_stop, stopped = block.stop_reason, True

    given = (last_stop, last_stop) if stopped else (None, None)
    for index, choices in announced.items():  # choices without text: their (empty) block opened
        delta = {"index": index, "role": "assistant", "delta": {"text": ""}}
        events.add("content.delta", {**delta, "extensions": {CHOICES: choices}})
    for choice, index in chosen:
        if choice["stop_reason"] is None and choice["stop_reason_raw"] is None:
            continue  # it never stopped: announced only
        choice_ext: dict[str, Any] = {CHOICE: choice["index"]}
        if choice["stop_reason_raw"] != choice["stop_reason"]:
            choice_ext[STOP_REASON_RAW] = choice["stop_reason_raw"]
        events.add("content.stop", {"index": index, "stop_reason": choice["stop_reason"], "extensions": choice_ext})
        given = (choice["stop_reason"], choice["stop_reason_raw"])

    reason, raw = exchange.stop_reason, exchange.stop_reason_raw
    if (reason, raw) != given:
        index = message_stop_index(exchange, blocks)
        if not blocks and index not in {c.index for c in exchange.tool_calls}:
            # Nothing opened this block: an empty delta does (draft §5.4 rule 5, every block
            # that a content.stop ends was started).
            events.add("content.delta", {"index": index, "role": "assistant", "delta": {"text": ""}})
        stop: dict[str, Any] = {"index": index, "stop_reason": reason}
        if raw != reason:
            stop["extensions"] = {STOP_REASON_RAW: raw}
        events.add("content.stop", stop)

    if exchange.usage.reported:
        events.add("usage", usage_fields(exchange.usage))
    if exchange.error is not None:
        events.add("error", {"code": exchange.error.code, "message": exchange.error.message})
    if ended(exchange):
        events.add("stream.end", {} if exchange.request_id is None else {"request_id": exchange.request_id})
    return events.out


def usage_fields(usage: Usage) -> dict[str, Any]:
    """The fields of the ``usage`` event (draft §5.3) for a reported ``usage``:
    ``input_tokens`` and ``output_tokens`` (tokens) as recorded, ``null`` for a count the vendor
    did not report — never a made-up 0. Both are draft-required, so a ``null`` makes the
    standard dialect flag ``invalid_event`` and record ``None`` again: the round trip keeps
    "not reported". The record's further counts (``cache_read_input_tokens``,
    ``cache_creation_input_tokens``, ``reasoning_output_tokens``, ``total_tokens``: the
    OpenTelemetry ``gen_ai.usage.*`` names) belong here as ``extensions`` keys
    ``llm-stream-observer:<name>`` (draft §4.7), since the draft's event has only the two, each
    when reported, and ``usage.details`` as ``llm-stream-observer:usage_details``."""
    fields: dict[str, Any] = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    extensions = {f"{NAMESPACE}:{k}": getattr(usage, k) for k in USAGE_KEYS if getattr(usage, k) is not None}
    if usage.details:
        extensions[USAGE_DETAILS] = usage.details
    if extensions:
        fields["extensions"] = extensions
    return fields


def choice_blocks(exchange: Exchange) -> list[tuple[dict[str, Any], int]]:
    """(choice, the index of the block its ``content.stop`` goes to) per recorded choice, in the
    record's order. The record keeps each choice's text, not its block's index (OpenAI's choice
    ``c`` writes block ``c``, Gemini's candidate ``c`` block ``2c``), so the block is found by its
    text: the ``text`` block of the choice's own index when its text is the choice's, else the
    first one not yet taken whose text is, else the first whose text is (two choices with one
    text may share it); a choice whose text no block has (an empty one) gets its own index if
    nothing is there, else the first index above every block and tool call.
    Read back, each choice gets the text of that block, which is its own."""
    texts = {b.index: b.text for b in exchange.blocks if b.type == TEXT}
    used = {b.index for b in exchange.blocks} | {c.index for c in exchange.tool_calls if c.index is not None}
    taken: set[int] = set()
    out: list[tuple[dict[str, Any], int]] = []
    for choice in exchange.choices or []:
        own, text = choice["index"], choice["text"] or ""
        same = [i for i in sorted(texts) if texts[i] == text]
        free = [i for i in same if i not in taken]
        if own in free:
            index = own
        elif free or same:
            index = (free or same)[0]
        elif own not in used and own not in taken:
            index = own
        else:
            index = max(used | taken) + 1
        taken.add(index)
        out.append((choice, index))
    return out


def ended(exchange: Exchange) -> bool:
    """True when the recorded stream ended with its end event: outcome ``completed``, or
    ``error`` without a ``missing_stream_end`` violation (draft §5.3: after an error the
    endpoint SHOULD send ``stream.end``)."""
    if exchange.outcome == Outcome.COMPLETED:
        return True
    if exchange.outcome != Outcome.ERROR:
        return False
    return not any(v.kind == ViolationKind.MISSING_STREAM_END for v in exchange.violations)


def message_stop_index(exchange: Exchange, replayed: list[Block]) -> int:
    """The ``index`` of the ``content.stop`` carrying the message's stop reason (step 5 of the
    module docstring): for ``tool_use`` the last tool call with an index; else the last
    replayed ``text`` block, else the last replayed block, else the last tool call with an
    index, else 0. ``replayed``: the blocks replayed in step 2, in index order."""
    tool_indexes = [c.index for c in exchange.tool_calls if c.index is not None]
    if exchange.stop_reason == TOOL_USE and tool_indexes:
        return tool_indexes[-1]
    texts = [b.index for b in replayed if b.type == TEXT]
    if texts:
        return texts[-1]
    if replayed:
        return replayed[-1].index
    return tool_indexes[-1] if tool_indexes else 0


def encode_sse(events: list[dict[str, Any]]) -> bytes:
    """The SSE bytes of ``events`` (draft §5.1): per event an ``event:`` line (its ``type``)
    and one ``data:`` line (its JSON, UTF-8, no newline inside: JSON escapes them), then one
    blank line. Raises ``orjson.JSONEncodeError`` for a lone surrogate in a string."""
    return b"".join(
        b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n" for event in events
    )


class _Events:
    """The event list being built: each event gets ``v``, the next ``seq`` and ``type`` first."""

    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out: list[dict[str, Any]] = []

    def add(self, type_: str, fields: dict[str, Any]) -> None:
        self.out.append({"v": VERSION, "seq": len(self.out), "type": type_, **fields})


def _replayed_blocks(exchange: Exchange, all_blocks: bool) -> list[Block]:
    """The blocks of step 2, in index order: ``text`` ones, or all but ``tool_use`` ones."""
    keep = [b for b in exchange.blocks if b.type != TOOL_USE and (all_blocks or b.type == TEXT)]
    return sorted(keep, key=_index)


def _pieces(text: str) -> list[str]:
    """``text`` cut into pieces of at most ``DELTA_MAX_CHARS`` characters; ``[""]`` for ``""``."""
    if not text:
        return [""]
    return [text[i : i + DELTA_MAX_CHARS] for i in range(0, len(text), DELTA_MAX_CHARS)]


def _index(block: Block) -> int:
    return block.index
