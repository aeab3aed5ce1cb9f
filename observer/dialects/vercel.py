"""Vercel AI SDK streams seen by the browser: the UI message stream (AI SDK 5+) and the older
data stream (AI SDK 3/4).

Sources: vercel/ai ``content/docs/04-ai-sdk-ui/50-stream-protocol.mdx`` ("Data Stream
Protocol": every part, ``data: [DONE]``, the ``x-vercel-ai-ui-message-stream: v1`` header),
``packages/ai/src/ui-message-stream/ui-message-chunks.ts`` (the chunk schema:
``finish.finishReason`` values, optional ``start.messageId``, ``abort.reason``),
``create-ui-message-stream-response.test.ts`` (response headers; ``[DONE]`` after an ``error``
part); for the legacy stream ``packages/ui-utils/src/data-stream-parts.ts`` (the ``CODE:JSON``
line parts and their value shapes); vendor-wire-formats §7.

Recognition is by RESPONSE header only (``matches_response``): the request is app-defined
(typically ``POST /api/chat`` with ``{id, messages:[{id, role, parts}], trigger, messageId}``,
but any route: ``DefaultChatTransport({api: "/api/assistant"})``), so the request alone never
shows the dialect. Its body is therefore kept on the side while it streams on
(``may_match_response``: which requests, ``observer.capture.held``: how), until the response
headers decide. The app declares its tools on its server (``streamText({tools})``), never in
the UI request, so whether a tool call was declared is unknown (``declares_tools = False``:
``declared`` is ``null``, no ``undeclared_tool``).

- ``x-vercel-ai-ui-message-stream: v1``: SSE, every event ``data: {"type": ...}``, ending with
  ``data: [DONE]`` (framing ``sse`` for ``text/event-stream``).
- ``x-vercel-ai-data-stream: v1``: one ``CODE:JSON`` part per line, e.g. ``0:"Hello"``
  (framing ``ndjson``, i.e. line framing, for ``text/plain``); ends with the ``d:`` finish
  message part.

``framing`` and ``new_adapter`` do not see the response headers, so the two protocols are told
apart by the response media type (``framing``) and by the framer's message type (the adapter:
SSE events are v5 parts, ``JSONFrame`` lines are v4 parts).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from observer.conversation import CanonicalMessage, CanonicalResult, attachment, call, default_message, result
from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import JSON_NAMES, Out, base64_decoded_size, count, load_object
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
    UsageEvent,
)
from observer.records import RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import Framing, JSONFrame

UI_STREAM_HEADER = "x-vercel-ai-ui-message-stream"  # AI SDK 5+ (SSE)
DATA_STREAM_HEADER = "x-vercel-ai-data-stream"  # AI SDK 3/4 (CODE:JSON lines)
SUPPORTED_VERSION = "v1"
DONE = "[DONE]"

# LanguageModel finish reasons (ui-message-chunks.ts, data-stream-parts.ts) -> draft values where
# the meaning is the same; any other value ("error", "other", "unknown") is kept as sent.
FINISH_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool-calls": "tool_use",
    "content-filter": "content_filter",
}
ABORT = "abort"  # stop reason recorded for an `abort` part (canonical and raw)
# Block and tool call ids remembered per stream (count): above the record's own caps
# (observer.limits), so the adapter's memory stays bounded on a hostile stream of fresh ids.
MAX_TRACKED_IDS = 10_000

# Request media types whose body is kept until the response headers decide (``may_match_response``).
HELD_MEDIA_TYPES = frozenset({"application/json", "text/plain", ""})

_DATA_URL = re.compile(r"data:[^,]*;base64,", re.IGNORECASE)

V = ViolationKind


class VercelUIDialect(DialectBase):
    """The AI SDK UI message stream (v5, SSE) and the legacy data stream (v4, lines), recognised
    by their ``v1`` response header; never by the request (``matches`` is always false).
    ``declares_tools``: False, the UI request never declares the app's tools (module docstring)."""

    name = "vercel.ui"
    declares_tools = False

    def matches(self, request: RequestView) -> bool:
        return False

    def may_match_response(self, request: RequestView) -> bool:
        """True for a request whose body is worth keeping until its response headers say
        whether it is an AI SDK stream: a ``POST`` whose media type is JSON
        (``application/json`` or ``*+json``: ``DefaultChatTransport``, ``useCompletion``, v4
        ``useChat``), ``text/plain`` (``fetch`` with a string body and no ``Content-Type``)
        or absent. Cheap: method and headers only. (Source: vercel/ai
        ``packages/ai/src/ui/http-chat-transport.ts``, which POSTs
        ``JSON.stringify({id, messages, trigger, messageId, ...body})`` with
        ``Content-Type: application/json``; the route is the app's ``api`` option.)"""
        if request.method.upper() != "POST":
            return False
        return any(t in HELD_MEDIA_TYPES or t.endswith("+json") for t in request.media_types or [""])

    def matches_response(self, request: RequestView, response_headers: Mapping[str, str]) -> bool:
        """True when either AI SDK stream header says ``v1`` (case and surrounding spaces ignored)."""
        return any(
            (response_headers.get(h) or "").strip().lower() == SUPPORTED_VERSION
            for h in (UI_STREAM_HEADER, DATA_STREAM_HEADER)
        )

    def framing(self, spec: ResponseSpec) -> Framing | None:
        """``sse`` for ``text/event-stream`` (v5), line framing (``ndjson``) for ``text/plain``
        (v4, whose ``toDataStreamResponse`` sends ``text/plain; charset=utf-8``)."""
        response_media_type = spec.media_type
        if response_media_type == "text/event-stream":
            return Framing.SSE
        if response_media_type == "text/plain":
            return Framing.NDJSON
        return None

    def parse_request(self, body: bytes, request: RequestView | None = None) -> tuple[RequestFacts, list[Violation]]:
        """Reads the app-defined request; see ``parse_ui_request``."""
        return parse_ui_request(body), []

    def new_adapter(self, spec: ResponseSpec) -> VercelUIAdapter:
        return VercelUIAdapter()

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        """The UI messages in canonical form (``observer.conversation``): ``parts`` when present
        (else v4 ``content`` and ``toolInvocations``) — ``text`` parts joined; tool parts (v5
        ``tool-{name}`` and ``dynamic-tool``, v4 ``tool-invocation``) as calls (``toolCallId``
        kept: the UI echoes it), ``file`` parts and v4 ``experimental_attachments`` as
        attachments. A UI message holding tool outputs (``output-available``/``output-error``,
        v4 ``result``) is followed by a tool message with those results: the UI keeps a tool's
        call and its output in one assistant message. Reasoning, ``step-start``, sources, data
        parts, ids and metadata are left out. The system prompt and tools live on the server:
        the UI request does not show them."""
        out: list[CanonicalMessage] = []
        for m in request.messages:
            out.extend(_history_message(m))
        return out


def parse_ui_request(body: bytes) -> RequestFacts:
    """Reads an AI SDK chat request as far as it has a known shape; never raises, flags nothing.

    The body is app-defined and may be absent (the observer may first learn the dialect from
    the response), empty, or not JSON: then only ``body_bytes`` is recorded. Recorded:
    ``messages`` (``useChat``: ``[{id, role, parts}]``, v4 ``[{role, content, parts,
    experimental_attachments}]``) as sent with base64 ``data:`` URLs of ``parts`` and
    ``experimental_attachments`` reduced to ``data_bytes``; a ``useCompletion`` ``prompt``
    string as one user message; ``id`` (chat id), ``trigger`` and ``messageId`` into
    ``metadata``. ``model`` stays ``None`` and ``tools`` empty: the UI request names neither
    (tools live on the server), so each tool call's ``declared`` is unknown (``null``, never
    ``undeclared_tool``: ``VercelUIDialect.declares_tools``).
    """
    facts = RequestFacts(body_bytes=len(body), stream=True)
    try:
        doc = orjson.loads(body) if body.strip() else None
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return facts
    messages = doc.get("messages")
    prompt = doc.get("prompt")
    if isinstance(messages, list):
        facts.messages = [ui_message(m) for m in messages]
    elif isinstance(prompt, str):
        facts.messages = [{"role": "user", "content": prompt}]
    facts.metadata = {k: doc[k] for k in ("id", "trigger", "messageId") if isinstance(doc.get(k), str)}
    return facts


def is_ui_request(doc: Any) -> bool:
    """True for a JSON body shaped like an AI SDK ``useChat`` request: messages carrying
    ``parts`` (UI messages; Ollama's and OpenAI's never have them, whatever else the app adds,
    e.g. its own ``model`` field). Used by dialects that share the ``/api/chat`` path (Ollama)."""
    if not isinstance(doc, dict):
        return False
    messages = doc.get("messages")
    return isinstance(messages, list) and any(isinstance(m, dict) and "parts" in m for m in messages)


def ui_message(m: Any) -> Any:
    """One UI message as sent, with ``parts`` and ``experimental_attachments`` reduced by
    ``reduce_data_url``; anything that is not an object is kept as is."""
    if not isinstance(m, dict):
        return m
    out = dict(m)
    for key in ("parts", "experimental_attachments"):
        items = m.get(key)
        if isinstance(items, list):
            out[key] = [reduce_data_url(p) for p in items]
    return out


def _history_message(m: Any) -> list[CanonicalMessage]:
    if not isinstance(m, dict):
        return [default_message(m)]
    role = m.get("role") if isinstance(m.get("role"), str) else ""
    texts, calls, results, attachments = [], [], [], []
    for part in _ui_parts(m):
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "file" and (found := attachment(part, part.get("mediaType"))) is not None:
            attachments.append(found)
        elif kind.startswith("tool-") or kind == "dynamic-tool":
            tool = part.get("toolInvocation") if kind == "tool-invocation" else part
            if isinstance(tool, dict):
                name = tool.get("toolName") if kind in ("dynamic-tool", "tool-invocation") else kind[len("tool-") :]
                calls.append(call(tool.get("toolCallId"), name, tool.get("input", tool.get("args"))))
                results.extend(_tool_output(tool))
    given = m.get("experimental_attachments")
    for item in given if isinstance(given, list) else ():
        found = attachment(item, item.get("contentType")) if isinstance(item, dict) else None
        if found is not None:
            attachments.append(found)
    message = CanonicalMessage(role, "".join(texts), tuple(calls), (), tuple(attachments))
    return [message, CanonicalMessage("tool", tool_results=tuple(results))] if results else [message]


def _ui_parts(m: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts of a UI message with a string ``type``: ``parts``, else (v4) ``content`` as a
    text part and each of ``toolInvocations`` as a ``tool-invocation`` part."""
    parts = m.get("parts")
    if not isinstance(parts, list):
        content, invocations = m.get("content"), m.get("toolInvocations")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
        if isinstance(invocations, list):
            parts += [{"type": "tool-invocation", "toolInvocation": i} for i in invocations]
    return [p for p in parts if isinstance(p, dict) and isinstance(p.get("type"), str)]


def _tool_output(tool: dict[str, Any]) -> list[CanonicalResult]:
    """The result a tool part holds: v5 ``output`` (``output-available``) or ``errorText``
    (``output-error``), v4 ``result`` (state ``result``); none before the tool ran."""
    state, tool_id = tool.get("state"), tool.get("toolCallId")
    if state == "output-available":
        return [result(tool_id, tool.get("output"))]
    if state == "output-error":
        return [result(tool_id, tool.get("errorText") or "")]
    if state == "result":
        return [result(tool_id, tool.get("result"))]
    return []


def reduce_data_url(part: Any) -> Any:
    """A part whose ``url`` is a base64 ``data:`` URL (``file`` parts, v4 attachments) without
    the payload: ``url`` replaced by ``data_bytes`` (decoded size in bytes, RFC 2397 + RFC 4648);
    other parts unchanged."""
    if not isinstance(part, dict):
        return part
    url = part.get("url")
    if not isinstance(url, str):
        return part
    m = _DATA_URL.match(url)
    if m is None:
        return part
    out = {k: v for k, v in part.items() if k != "url"}
    out["data_bytes"] = base64_decoded_size(url[m.end() :])
    return out


def finish_reason(raw: str) -> StopEvent:
    """A ``StopEvent`` for an AI SDK finish reason (canonical per ``FINISH_REASONS``)."""
    return StopEvent(None, FINISH_REASONS.get(raw, raw), raw)


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text (orjson: no spaces, key order kept); the tool ``input``
    objects of the AI SDK are re-serialised this way to become ``ToolCall.arguments``."""
    return orjson.dumps(value).decode()


class VercelUIAdapter(AdapterBase):
    """Maps AI SDK stream parts onto canonical events; one instance per response.

    Blocks: every ``text-start`` / ``reasoning-start`` (v5) opens a new block, numbered in order
    of appearance (text and reasoning share one index space; a delta for an unknown ``id``
    opens one too, and a reused ``id`` after a new ``*-start`` opens a fresh block, as
    providers restart ids per step); v4 ``0:`` text and ``g:`` reasoning are one block each,
    numbered in order of first appearance.

    Tool calls, keyed by ``toolCallId`` and numbered in order of appearance: the input streamed
    by ``tool-input-start``/``tool-input-delta`` (v4 ``b:``/``c:``) is recorded as streamed.
    The complete input of ``tool-input-available`` / ``tool-input-error`` (v4 ``9:`` ``args``),
    an object, is used only when no delta arrived for that call: then it is serialised with
    ``compact_json`` (appended to the started call, or a complete ``ToolCallEvent`` when the
    call was not started); otherwise it is ignored (the streamed text is the wire's record).

    Ends: ``data: [DONE]`` (v5) and the ``d:`` finish message (v4) give ``StreamEnd``; ``error``
    (v5) and ``3:`` (v4) give ``ErrorEvent`` with code ``None``. ``abort`` is not an error: it
    gives stop reason ``abort``, and the ``[DONE]`` the SDK still appends ends the stream.
    ``start.messageId`` (v5) and the first ``f:`` ``messageId`` (v4) become the request id.
    """

    def __init__(self) -> None:
        self._blocks: dict[tuple[str, str], int] = {}  # (block type, wire id) -> block index
        self._next_block = 0
        self._calls: dict[str, _Call] = {}  # toolCallId -> state
        self._next_call = 0
        self._started = False  # a request id was taken (first `start` / `f:`)

    def on_message(self, message: Message) -> Out:
        if isinstance(message, JSONFrame):
            return self._on_line(message.data)
        return self._on_sse(message.data)

    # ----- shared state -----
    def _block(self, block_type: str, wire_id: str, *, new: bool = False) -> int:
        key = (block_type, wire_id)
        index = self._blocks.get(key)
        if index is None or new:
            index = self._next_block
            self._next_block += 1
            if key in self._blocks or len(self._blocks) < MAX_TRACKED_IDS:
                self._blocks[key] = index
        return index

    def _call(self, call_id: str) -> _Call:
        call = self._calls.get(call_id)
        if call is None:
            call = _Call(self._next_call)
            self._next_call += 1
            if len(self._calls) < MAX_TRACKED_IDS:
                self._calls[call_id] = call
        return call

    def _start(self, message_id: Any, out: Out) -> None:
        if not self._started:
            self._started = True
            out.append(StreamStart(None, None, message_id if isinstance(message_id, str) else None))

    def _tool_start(self, call_id: str, name: str | None, out: Out) -> None:
        call = self._call(call_id)
        out.append(ToolCallDelta(None, call_id, call.index, call_id, name, ""))

    def _tool_delta(self, call_id: str, text: str, out: Out) -> None:
        call = self._call(call_id)
        call.has_input = True
        out.append(ToolCallDelta(None, call_id, call.index, call_id, None, text))

    def _tool_complete(self, call_id: str, name: str | None, value: Any, out: Out) -> None:
        started = call_id in self._calls  # a fragment already opened this call in the record
        call = self._call(call_id)
        if call.has_input:
            return
        call.has_input = True
        if started:
            out.append(ToolCallDelta(None, call_id, call.index, call_id, name, compact_json(value)))
        else:
            out.append(ToolCallEvent(None, call.index, call_id, name, compact_json(value)))

    # ----- v5: UI message stream (SSE) -----
    def _on_sse(self, data: str) -> Out:
        out: Out = []
        if data.strip() == DONE:
            out.append(StreamEnd(None))
            return out
        obj = load_object(data, out, "UI message chunk", "UI message chunk is not a JSON object")
        if obj is None:
            return out
        return self._sse_object(obj, out)

    def on_object(self, message: Message, obj: Any) -> Out:
        """``on_message(message)`` for a message whose data already parsed as JSON to ``obj``
        (any JSON value): the same events and violations, without parsing again (v4 lines,
        ``JSONFrame``, are not JSON texts: they go through :meth:`on_message`)."""
        if isinstance(message, JSONFrame):
            return self.on_message(message)
        out: Out = []
        if not isinstance(obj, dict):
            out.append(Violation(V.INVALID_EVENT, None, "UI message chunk is not a JSON object"))
            return out
        return self._sse_object(obj, out)

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane (``StreamAdapter.fast``, v5 SSE only: ``event`` is ``None`` for v4
        lines): a ``text-delta``/``reasoning-delta`` chunk with string ``id`` and ``delta`` is
        ``sink.text(block, kind, delta)``, or nothing for an empty delta (no event); a
        ``tool-input-delta`` with string ``toolCallId`` and ``inputTextDelta`` is
        ``sink.fragment`` with the ``ToolCallDelta`` fields; each returns True. Anything else
        returns False (the general mapping runs). Same result as :meth:`on_message`."""
        if event is None or obj.__class__ is not dict:
            return False
        ptype = obj.get("type")
        if ptype == "text-delta":
            kind = "text"
        elif ptype == "reasoning-delta":
            kind = "reasoning"
        elif ptype == "tool-input-delta":
            call_id = obj.get("toolCallId")
            value = obj.get("inputTextDelta")
            if call_id.__class__ is not str or value.__class__ is not str:
                return False
            call = self._call(call_id)
            call.has_input = True
            sink.fragment(None, call_id, call.index, call_id, None, value)
            return True
        else:
            return False
        wire_id = obj.get("id")
        delta = obj.get("delta")
        if wire_id.__class__ is not str or delta.__class__ is not str:
            return False
        if delta:
            sink.text(self._block(kind, wire_id), kind, delta, now_s)
        return True

    def _sse_object(self, obj: dict[str, Any], out: Out) -> Out:
        ptype = obj.get("type")
        if not isinstance(ptype, str):
            out.append(Violation(V.INVALID_EVENT, None, "UI message chunk without a string type"))
            return out
        handler = _V5.get(ptype)
        if handler is not None:
            handler(self, obj, out)
        return out  # unknown types (source-*, file, data-*, custom, tool-output-*, ...) ignored

    def _v5_start(self, obj: dict[str, Any], out: Out) -> None:
        self._start(obj.get("messageId"), out)
        _metadata(obj.get("messageMetadata"), out)

    def _v5_content(self, obj: dict[str, Any], out: Out) -> None:
        ptype: str = obj["type"]
        block_type, _, phase = ptype.partition("-")
        wire_id = _field(obj, "id", str, out)
        if wire_id is None:
            return
        if phase == "start":
            self._block(block_type, wire_id, new=True)
            return
        delta = _field(obj, "delta", str, out)
        if delta:
            out.append(ContentDelta(None, self._block(block_type, wire_id), delta, block_type))

    def _v5_tool_start(self, obj: dict[str, Any], out: Out) -> None:
        call_id = _field(obj, "toolCallId", str, out)
        if call_id is not None:
            self._tool_start(call_id, _field(obj, "toolName", str, out), out)

    def _v5_tool_delta(self, obj: dict[str, Any], out: Out) -> None:
        call_id = _field(obj, "toolCallId", str, out)
        text = _field(obj, "inputTextDelta", str, out)
        if call_id is not None and text is not None:
            self._tool_delta(call_id, text, out)

    def _v5_tool_input(self, obj: dict[str, Any], out: Out) -> None:
        call_id = _field(obj, "toolCallId", str, out)
        if call_id is not None:
            self._tool_complete(call_id, _field(obj, "toolName", str, out), obj.get("input"), out)

    def _v5_error(self, obj: dict[str, Any], out: Out) -> None:
        out.append(ErrorEvent(None, None, _field(obj, "errorText", str, out)))

    def _v5_abort(self, obj: dict[str, Any], out: Out) -> None:
        out.append(StopEvent(None, ABORT, ABORT))

    def _v5_finish(self, obj: dict[str, Any], out: Out) -> None:
        reason = obj.get("finishReason")
        if isinstance(reason, str):
            out.append(finish_reason(reason))
        elif reason is not None:
            out.append(Violation(V.INVALID_EVENT, None, "finish: finishReason is not a string"))
        _metadata(obj.get("messageMetadata"), out)

    def _v5_metadata(self, obj: dict[str, Any], out: Out) -> None:
        _metadata(obj.get("messageMetadata"), out)

    # ----- v4: data stream (CODE:JSON lines) -----
    def _on_line(self, line: str) -> Out:
        out: Out = []
        line = line.strip()
        if not line:
            return out
        code, sep, text = line.partition(":")
        if not sep or not code:
            out.append(Violation(V.INVALID_EVENT, None, f"data stream line without a CODE: prefix: {line[:40]!r}"))
            return out
        handler = _V4.get(code)
        if handler is None:
            return out  # unknown or ignored part (2 data, 8 annotations, a tool result, e/f/h/i/j/k ...)
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            out.append(Violation(V.INVALID_JSON, None, f"data stream part {code!r}: {exc}"))
            return out
        handler(self, code, value, out)
        return out

    def _v4_content(self, code: str, value: Any, out: Out) -> None:
        if not isinstance(value, str):
            out.append(Violation(V.INVALID_EVENT, None, f"data stream part {code!r}: value is not a string"))
            return
        block_type = "text" if code == "0" else "reasoning"
        if value:
            out.append(ContentDelta(None, self._block(block_type, ""), value, block_type))

    def _v4_error(self, code: str, value: Any, out: Out) -> None:
        message = value if isinstance(value, str) else compact_json(value)
        out.append(ErrorEvent(None, None, message))

    def _v4_start_step(self, code: str, value: Any, out: Out) -> None:
        if isinstance(value, dict):
            self._start(value.get("messageId"), out)

    def _v4_tool_call(self, code: str, value: Any, out: Out) -> None:
        obj = _part_object(code, value, out)
        call_id = _field(obj, "toolCallId", str, out, code) if obj is not None else None
        if obj is None or call_id is None:
            return
        if code == "c":
            text = _field(obj, "argsTextDelta", str, out, code)
            if text is not None:
                self._tool_delta(call_id, text, out)
            return
        name = _field(obj, "toolName", str, out, code)
        if code == "9":
            self._tool_complete(call_id, name, obj.get("args"), out)
        else:
            self._tool_start(call_id, name, out)

    def _v4_finish(self, code: str, value: Any, out: Out) -> None:
        obj = _part_object(code, value, out)
        if obj is not None:
            reason = _field(obj, "finishReason", str, out, code)
            if reason is not None:
                out.append(finish_reason(reason))
            _usage(obj.get("usage"), out)
        out.append(StreamEnd(None))


class _Call:
    """Per tool call: its ``index``, and ``has_input`` once argument text was recorded (a
    delta, or the complete input: the complete input is then not added)."""

    __slots__ = ("index", "has_input")

    def __init__(self, index: int) -> None:
        self.index = index
        self.has_input = False


_V5: dict[str, Callable[[VercelUIAdapter, dict[str, Any], Out], None]] = {
    "start": VercelUIAdapter._v5_start,
    "text-start": VercelUIAdapter._v5_content,
    "text-delta": VercelUIAdapter._v5_content,
    "reasoning-start": VercelUIAdapter._v5_content,
    "reasoning-delta": VercelUIAdapter._v5_content,
    "tool-input-start": VercelUIAdapter._v5_tool_start,
    "tool-input-delta": VercelUIAdapter._v5_tool_delta,
    "tool-input-available": VercelUIAdapter._v5_tool_input,
    "tool-input-error": VercelUIAdapter._v5_tool_input,
    "error": VercelUIAdapter._v5_error,
    "abort": VercelUIAdapter._v5_abort,
    "finish": VercelUIAdapter._v5_finish,
    "message-metadata": VercelUIAdapter._v5_metadata,
}

_V4: dict[str, Callable[[VercelUIAdapter, str, Any, Out], None]] = {
    "0": VercelUIAdapter._v4_content,
    "g": VercelUIAdapter._v4_content,
    "3": VercelUIAdapter._v4_error,
    "f": VercelUIAdapter._v4_start_step,
    "9": VercelUIAdapter._v4_tool_call,
    "b": VercelUIAdapter._v4_tool_call,
    "c": VercelUIAdapter._v4_tool_call,
    "d": VercelUIAdapter._v4_finish,
}


def _part_object(code: str, value: Any, out: Out) -> dict[str, Any] | None:
    if isinstance(value, dict):
        return value
    out.append(Violation(V.INVALID_EVENT, None, f"data stream part {code!r}: value is not an object"))
    return None


def _field(obj: dict[str, Any], key: str, kind: type, out: Out, code: str | None = None) -> Any:
    """``obj[key]`` when it has type ``kind``; else ``None`` and an ``invalid_event`` naming the
    v5 chunk ``type`` or the v4 part ``code``."""
    value = obj.get(key)
    if isinstance(value, kind):
        return value
    where = f"data stream part {code!r}" if code is not None else str(obj.get("type"))
    out.append(Violation(V.INVALID_EVENT, None, f"{where}: {key} is not {JSON_NAMES[kind]}"))
    return None


def _count(usage: dict[str, Any], *keys: str) -> int | None:
    """The first of ``keys`` whose value is a token count (``toolkit.count``), else ``None``."""
    for key in keys:
        tokens = count(usage.get(key))
        if tokens is not None:
            return tokens
    return None


def _usage(usage: Any, out: Out) -> None:
    """A ``UsageEvent`` from an AI SDK usage object: ``inputTokens``/``outputTokens`` (v5
    ``LanguageModelUsage``) or ``promptTokens``/``completionTokens`` (v4); nothing if neither
    count is an integer in 0..2^63-1 (v4 sends ``null`` for a NaN count)."""
    if not isinstance(usage, dict):
        return
    inp = _count(usage, "inputTokens", "promptTokens")
    outp = _count(usage, "outputTokens", "completionTokens")
    if inp is not None or outp is not None:
        out.append(UsageEvent(None, inp, outp))


def _metadata(meta: Any, out: Out) -> None:
    """Model and usage from app-defined ``messageMetadata`` when it uses the obvious names: a
    ``model`` string; token counts in ``usage`` or at the top level (see ``_usage``)."""
    if not isinstance(meta, dict):
        return
    model = meta.get("model")
    if isinstance(model, str) and model:
        out.append(ModelEvent(None, model))
    _usage(meta.get("usage") if isinstance(meta.get("usage"), dict) else meta, out)
