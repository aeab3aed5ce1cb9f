"""The draft standard dialect ``llm-stream-1.0``: ``application/llm-request+json`` requests and
their SSE event streams.

Source: Internet-Draft "A Standard Wire Format for LLM Inference Streaming" — §4.1 media type,
§4.2-§4.7 request envelope, §5.1 framing, §5.2 envelope (``v``, ``seq``, ``type``), §5.3 event
types, §5.4 lifecycle, §8.3 extensions not interpreted, §8.4 sequence exhaustion, §9.1 media
type parameters.

Extensions (§4.7 ``vendor:name`` keys; §8.3 says other readers need not interpret them) are
ignored but for the observer's own, which its replay in the standard format writes
(``observer.standard_replay``), so that a replayed exchange reads back as recorded:
``llm-stream-observer:block_type`` on ``content.delta`` (``reasoning``, ``refusal``: the block's
type), ``llm-stream-observer:stop_reason_raw`` on ``content.stop`` (the vendor's stop reason;
``null``: none was sent),
``llm-stream-observer:response_id`` / ``system_fingerprint`` / ``service_tier`` on
``stream.start`` and ``llm-stream-observer:cache_read_input_tokens`` /
``cache_creation_input_tokens`` / ``reasoning_output_tokens`` / ``total_tokens`` /
``usage_details`` on ``usage``, ``llm-stream-observer:choices`` on ``content.delta`` (an array
of choice indexes: the choices of several, OpenAI ``n`` / Gemini ``candidateCount``, whose text
is this block: a ``ChoiceOpen`` each) and ``llm-stream-observer:choice`` on ``content.stop`` (the
stop ends that choice, whose text is the stopped block: a ``StopEvent`` of that choice, the
block's own stop reason left unset, as the recorded dialects leave it). A value of the wrong type
is ignored like any unknown field. On the request envelope, the extension **name** ``llm-stream-observer:tools_declared_elsewhere`` (names are all
the record keeps of extensions, §8.3) says the request does not declare the tools the model may
call (an AI SDK app's tools live on its server): ``declares_tools`` is then False for it, each
tool call ``declared: null`` and no ``undeclared_tool`` (§8.2 cannot be judged from the wire);
and ``llm-stream-observer:tool_names`` (an array of strings: the names a replay's recorded dialect
read from tools in its own shapes, which the draft's ``tools[].name`` does not reach) adds those
names to the declared ones.

Conversation linking (``observer.conversation``) uses the defaults of ``DialectBase``: messages
``{"role", "content"}`` with string or typed-part content (text parts joined, binary parts by
type and ``data_bytes``), tool calls and results read OpenAI-style (``tool_calls``,
``tool_call_id``) where a message carries them.
"""

from __future__ import annotations

from typing import Any

import orjson

from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import (
    INT64_MAX,
    base64_decoded_size,
    check_messages,
    is_int,
    load_request,
    read_tools,
    tool_names,
)
from observer.events import (
    CanonicalEvent,
    ChoiceOpen,
    ContentDelta,
    ContentStop,
    ErrorEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallEvent,
    UsageEvent,
)
from observer.records import RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import Framing

MEDIA_TYPE = "application/llm-request+json"
#: The request extension name saying the tools are declared outside the request (module docstring).
TOOLS_DECLARED_ELSEWHERE = "llm-stream-observer:tools_declared_elsewhere"
#: The request extension naming tools declared in a recorded dialect's shapes (module docstring).
TOOL_NAMES = "llm-stream-observer:tool_names"
SUPPORTED_VERSION = "1.0"
SEQ_SAFE_MAX = 2**53  # draft §8.4: beyond the JSON/JavaScript safe integer limit
BINARY_PART_TYPES = frozenset({"image", "document", "audio"})  # draft §4.3 content parts

V = ViolationKind


class StandardDialect(DialectBase):
    """``llm-stream-1.0``: recognised by the request media type alone (draft §4.1), compared
    case-insensitively and with any parameters (``; version=1.0; charset=utf-8``) ignored."""

    name = "llm-stream-1.0"
    any_host = True  # its media type identifies LLM traffic on any host (draft §4.1)

    def matches(self, request: RequestView) -> bool:
        return MEDIA_TYPE in request.media_types

    def framing(self, spec: ResponseSpec) -> Framing | None:
        """Always SSE (draft §4.9: ``text/event-stream``); any other media type is unreadable."""
        response_media_type = spec.media_type
        return Framing.SSE if response_media_type == "text/event-stream" else None

    def parse_request(self, body: bytes, request: RequestView | None = None) -> tuple[RequestFacts, list[Violation]]:
        """Reads the request envelope (draft §4.2). Binary content parts are reduced to type,
        media type and decoded size (``data_bytes``); the base64 payload is not kept.
        Never raises: malformed input gives ``invalid_request`` / ``unsupported_version``."""
        facts = RequestFacts(body_bytes=len(body))
        violations: list[Violation] = []
        if request is not None and request.method != "POST":
            violations.append(Violation(V.INVALID_REQUEST, None, f"method {request.method} (draft §3: POST)"))
        doc, problems = load_request(body)
        if doc is None:
            return facts, problems

        missing = [k for k in ("version", "stream", "model", "messages") if k not in doc]
        if missing:
            violations.append(Violation(V.INVALID_REQUEST, None, f"missing required fields: {', '.join(missing)}"))
        version = doc.get("version")
        facts.version = version if isinstance(version, str) else None
        if "version" in doc and version != SUPPORTED_VERSION:
            violations.append(Violation(V.UNSUPPORTED_VERSION, None, f"request version {version!r}"))
        stream = doc.get("stream")
        facts.stream = stream if isinstance(stream, bool) else None
        if "stream" in doc and not isinstance(stream, bool):
            violations.append(Violation(V.INVALID_REQUEST, None, "stream is not a boolean"))
        elif stream is False:
            violations.append(Violation(V.INVALID_REQUEST, None, "stream is false (draft §4.2: MUST be true)"))
        model = doc.get("model")
        facts.model = model if isinstance(model, str) else None
        if "model" in doc and not isinstance(model, str):
            violations.append(Violation(V.INVALID_REQUEST, None, "model is not a string"))

        messages = doc.get("messages")
        if isinstance(messages, list):
            facts.messages = [_message(m) for m in messages]
            check_messages(messages, violations)
        elif messages is not None:
            violations.append(Violation(V.INVALID_REQUEST, None, "messages is not an array"))
        facts.tools = read_tools(doc, "tools", violations)
        facts.tool_names = tool_names(facts.tools)
        for key in ("parameters", "metadata"):
            value = doc.get(key)
            if isinstance(value, dict):
                setattr(facts, key, value)
            elif value is not None:
                violations.append(Violation(V.INVALID_REQUEST, None, f"{key} is not an object"))
        extensions = doc.get("extensions")
        if isinstance(extensions, dict):
            facts.extensions = sorted(str(k) for k in extensions)  # names only; values not interpreted (§8.3)
            named = extensions.get(TOOL_NAMES)  # but our own (module docstring)
            if isinstance(named, list):
                known = set(facts.tool_names)
                for name in named:
                    if isinstance(name, str) and name not in known:
                        known.add(name)
                        facts.tool_names.append(name)
        elif extensions is not None:
            violations.append(Violation(V.INVALID_REQUEST, None, "extensions is not an object"))
        user = facts.metadata.get("user_id")
        facts.end_user = user if isinstance(user, str) else None
        request_id = facts.metadata.get("request_id")
        facts.request_id = request_id if isinstance(request_id, str) else None
        if request_id is not None and not isinstance(request_id, str):
            violations.append(Violation(V.INVALID_REQUEST, None, "metadata.request_id is not a string"))
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> StandardAdapter:
        return StandardAdapter()

    def declares_tools(self, request: RequestFacts) -> bool:
        """False when the envelope names ``TOOLS_DECLARED_ELSEWHERE`` among its extensions
        (module docstring; ``observer.dialects.base.Dialect``'s ``declares_tools``)."""
        return TOOLS_DECLARED_ELSEWHERE not in request.extensions


def _message(m: Any) -> Any:
    if not isinstance(m, dict):
        return m  # recorded as sent (and flagged by the caller)
    out = dict(m)
    content = m.get("content")
    if isinstance(content, list):
        out["content"] = [_part(p) for p in content]
    return out


def _part(p: Any) -> Any:
    if not isinstance(p, dict):
        return p
    if "data" not in p:
        return p
    out = {k: v for k, v in p.items() if k != "data"}
    data = p["data"]
    out["data_bytes"] = base64_decoded_size(data) if isinstance(data, str) else None
    return out


class StandardAdapter(AdapterBase):
    """Per-stream mapping of ``llm-stream-1.0`` SSE events onto canonical events, checking the
    envelope and lifecycle (draft §5.2-§5.4): ``seq`` gaps and repeats, the first event being
    ``stream.start`` with seq 0, the JSON ``type`` matching the SSE ``event`` field, the ``v``
    version, seq beyond 2^53, a ``content.stop`` for an index that no ``content.delta`` or
    ``tool.call`` opened (``block_not_started``, §5.4 rule 5; its stop reason is still recorded).
    Unknown fields and unknown event types are ignored (§5.2)."""

    def __init__(self) -> None:
        self._first = True
        self._started = False
        self._last_seq: int | None = None
        self._skipped = 0  # events lost to invalid JSON since the last good seq
        self._bad_versions: set[str] = set()
        self._exhausted = False
        # Block indexes a content.delta or tool.call opened; the fast lane's last one (its
        # deltas add to the set only when the index changes).
        self._opened: set[int] = set()
        self._delta_index = -1

    def on_lost(self) -> None:
        self._skipped += 1

    def on_message(self, event: Message) -> list[CanonicalEvent | Violation]:
        out: list[CanonicalEvent | Violation] = []
        try:
            obj = orjson.loads(event.data)
        except orjson.JSONDecodeError as exc:
            self._skipped += 1
            out.append(Violation(V.INVALID_JSON, None, f"event {event.event or 'message'!r}: {exc}"))
            return out
        return self.on_object(event, obj)

    def on_object(self, event: Message, obj: Any) -> list[CanonicalEvent | Violation]:
        """``on_message(event)`` for an event whose data already parsed as JSON to ``obj``
        (any JSON value): the same events and violations, without parsing again."""
        out: list[CanonicalEvent | Violation] = []
        if not isinstance(obj, dict):
            self._skipped += 1
            out.append(Violation(V.INVALID_EVENT, None, "event data is not a JSON object"))
            return out

        seq = self._check_seq(obj, out)
        etype = obj.get("type")
        if not isinstance(etype, str):
            out.append(Violation(V.INVALID_EVENT, seq, "missing or non-string type"))
            etype = event.event or None
        sse_type = event.event or "message"  # WHATWG: an event without `event` has type "message"
        if etype != sse_type:
            out.append(Violation(V.TYPE_MISMATCH, seq, f"SSE event {sse_type!r} but JSON type {etype!r}"))
        self._check_version(obj, seq, out)
        if self._first:
            self._first = False
            if etype != "stream.start" or seq != 0:
                out.append(Violation(V.MISSING_STREAM_START, seq, f"first event is {etype!r} with seq {seq}"))
        elif etype == "stream.start":
            detail = "second stream.start" if self._started else "stream.start after other events"
            out.append(Violation(V.INVALID_EVENT, seq, detail))
        if etype == "stream.start":
            self._started = True
        elif etype in _OPENS:
            self._open(obj, etype)
        elif etype == "content.stop":
            self._check_stop(obj, seq, out)
        mapper = _MAPPERS.get(etype) if etype else None
        if mapper is not None:
            mapper(obj, seq, out)
        return out

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane for the bulk of a stream (``StreamAdapter.fast``): a ``content.delta``
        whose envelope is exactly as expected (SSE ``event`` equal to its ``type``, ``v`` 1.0,
        ``seq`` the previous one + 1, valid ``index`` and ``delta.text``) is ``sink.text(index,
        "text", text)`` after the same state update as :meth:`on_message`, returning True;
        anything else returns False (nothing changed: the general mapping runs)."""
        if event != b"content.delta" or obj.__class__ is not dict or self._first:
            return False
        get = obj.get
        if get("type") != "content.delta" or get("v") != SUPPORTED_VERSION or "extensions" in obj:
            return False
        seq = get("seq")
        last = self._last_seq
        if seq.__class__ is not int or last is None or seq != last + 1 or seq > SEQ_SAFE_MAX:
            return False
        index = get("index")
        if index.__class__ is not int or index < 0 or index > INT64_MAX:
            return False
        delta = get("delta")
        if delta.__class__ is not dict:
            return False
        text = delta.get("text")
        if text.__class__ is not str:
            return False
        self._last_seq = seq
        self._skipped = 0
        if index != self._delta_index:
            self._delta_index = index
            self._opened.add(index)
        sink.text(index, "text", text, now_s)
        return True

    def _open(self, obj: dict[str, Any], etype: str) -> None:
        """Notes the block index a ``content.delta`` (an invalid index reads as 0, as its mapper
        reads it) or ``tool.call`` (a valid index only) opens."""
        index = obj.get("index")
        if is_int(index) and index >= 0:
            self._opened.add(index)
        elif etype == "content.delta":
            self._opened.add(0)

    def _check_stop(self, obj: dict[str, Any], seq: int | None, out: list[CanonicalEvent | Violation]) -> None:
        """``block_not_started`` for a ``content.stop`` whose index (0 when invalid, as its mapper
        reads it) no ``content.delta`` or ``tool.call`` opened."""
        index = obj.get("index")
        index = index if is_int(index) and index >= 0 else 0
        if index not in self._opened:
            detail = f"content.stop for index {index}, which no content.delta or tool.call opened: its stop_reason kept"
            out.append(Violation(V.BLOCK_NOT_STARTED, seq, detail))

    def _check_seq(self, obj: dict[str, Any], out: list[CanonicalEvent | Violation]) -> int | None:
        seq = obj.get("seq")
        if not is_int(seq) or seq < 0:
            out.append(Violation(V.INVALID_EVENT, None, f"seq is not a non-negative 64-bit integer: {seq!r}"))
            return None
        if seq > SEQ_SAFE_MAX and not self._exhausted:
            self._exhausted = True
            out.append(Violation(V.SEQ_EXHAUSTED, seq, "seq beyond 2^53 (draft §8.4)"))
        last = self._last_seq
        if last is not None:
            if seq <= last:
                out.append(Violation(V.SEQ_REPEAT, seq, f"seq {seq} after {last}"))
            elif seq > last + 1 + self._skipped:
                out.append(Violation(V.SEQ_GAP, seq, f"expected {last + 1}, got {seq}"))
        self._last_seq = seq if last is None else max(last, seq)
        self._skipped = 0
        return seq

    def _check_version(self, obj: dict[str, Any], seq: int | None, out: list[CanonicalEvent | Violation]) -> None:
        v = obj.get("v")
        if v == SUPPORTED_VERSION:
            return
        key = repr(v)
        if key not in self._bad_versions:  # once per distinct value, not once per event
            self._bad_versions.add(key)
            out.append(Violation(V.UNSUPPORTED_VERSION, seq, f"event v {v!r}"))


def _str(obj: dict[str, Any], key: str, seq: int | None, out: list[Any], *, required: bool = True) -> str | None:
    v = obj.get(key)
    if isinstance(v, str):
        return v
    if v is not None or required:
        out.append(Violation(V.INVALID_EVENT, seq, f"{obj.get('type')}: {key} is not a string"))
    return None


def _int(obj: dict[str, Any], key: str, seq: int | None, out: list[Any], default: int | None) -> int | None:
    v = obj.get(key)
    if is_int(v) and v >= 0:
        return v
    out.append(Violation(V.INVALID_EVENT, seq, f"{obj.get('type')}: {key} is not a non-negative integer"))
    return default


OWN = "llm-stream-observer:"  # the observer's extension keys (module docstring)
BLOCK_TYPES = frozenset({"text", "reasoning", "refusal"})
USAGE_COUNTS = ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_output_tokens", "total_tokens")


def _own(obj: dict[str, Any], name: str) -> Any:
    """The value of the observer's extension ``name`` on event ``obj`` (``None`` without one)."""
    extensions = obj.get("extensions")
    return extensions.get(OWN + name) if isinstance(extensions, dict) else None


def _stream_start(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    model = _str(obj, "model", seq, out)
    out.append(StreamStart(seq, model, _str(obj, "request_id", seq, out, required=False)))
    identity = [_own(obj, k) for k in ("response_id", "system_fingerprint", "service_tier")]
    identity = [v if isinstance(v, str) else None for v in identity]
    if any(identity):
        out.append(ResponseIdentity(seq, *identity))


def _content_delta(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    index = _int(obj, "index", seq, out, 0)
    delta = obj.get("delta")
    text = delta.get("text") if isinstance(delta, dict) else None
    if not isinstance(text, str):
        out.append(Violation(V.INVALID_EVENT, seq, "content.delta: delta.text is not a string"))
        return
    block_type = _own(obj, "block_type")
    choices = _own(obj, "choices")
    if isinstance(choices, list):  # the choices whose text this block is (module docstring)
        out.extend(ChoiceOpen(seq, c, index or 0) for c in choices if is_int(c) and c >= 0)
    out.append(ContentDelta(seq, index or 0, text, block_type if block_type in BLOCK_TYPES else "text"))


def _content_stop(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    index = _int(obj, "index", seq, out, 0)
    reason = _str(obj, "stop_reason", seq, out)
    extensions = obj.get("extensions")
    raw = extensions.get(OWN + "stop_reason_raw", reason) if isinstance(extensions, dict) else reason
    if raw is not None and not isinstance(raw, str):
        raw = reason  # of the wrong type: ignored; null: the vendor sent none (module docstring)
    choice = _own(obj, "choice")
    if is_int(choice) and choice >= 0:  # one choice's stop (module docstring)
        out.append(StopEvent(seq, reason, raw, choice, index or 0))
    else:
        out.append(ContentStop(seq, index or 0, reason, raw))


def _tool_call(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    index = _int(obj, "index", seq, out, None)
    arguments = obj.get("arguments")
    if not isinstance(arguments, str):
        out.append(Violation(V.INVALID_EVENT, seq, "tool.call: arguments is not a JSON-encoded string"))
        arguments = "" if arguments is None else orjson.dumps(arguments).decode()
    out.append(ToolCallEvent(seq, index, _str(obj, "id", seq, out), _str(obj, "name", seq, out), arguments))


def _usage(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    counts = [_own(obj, k) for k in USAGE_COUNTS]
    details = _own(obj, "usage_details")
    pairs: list[tuple[str, str, int]] = []
    if isinstance(details, dict):
        for group, names in details.items():
            if isinstance(names, dict):
                pairs.extend((group, name, v) for name, v in names.items() if is_int(v) and v >= 0)
    out.append(
        UsageEvent(
            seq,
            _int(obj, "input_tokens", seq, out, None),
            _int(obj, "output_tokens", seq, out, None),
            *(c if is_int(c) and c >= 0 else None for c in counts),
            details=tuple(pairs),
        )
    )


def _error(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    out.append(ErrorEvent(seq, _str(obj, "code", seq, out), _str(obj, "message", seq, out)))


def _stream_end(obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
    out.append(StreamEnd(seq, _str(obj, "request_id", seq, out, required=False)))


#: Event types that open a content block at their ``index`` (draft §5.3).
_OPENS = frozenset({"content.delta", "tool.call"})

_MAPPERS = {
    "stream.start": _stream_start,
    "content.delta": _content_delta,
    "content.stop": _content_stop,
    "tool.call": _tool_call,
    "usage": _usage,
    "error": _error,
    "stream.end": _stream_end,
}
