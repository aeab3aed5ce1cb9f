"""Connect / gRPC / gRPC-Web streams of LLM tools whose schema is private: Cursor
(``connect.cursor``), Windsurf / Codeium / Devin CLI (``connect.windsurf``), and any other
enveloped protobuf stream on an LLM host (``connect.unknown``).

Sources: the project reference ``binary-formats.md`` §4 (framing, end-stream JSON, gRPC-Web
trailers), §5 (Cursor ``agent.v1`` field map: ``AgentClientMessage``, ``AgentServerMessage``;
legacy ``aiserver.v1`` ``StreamUnifiedChatWithTools``), §6 (Windsurf ``exa.api_server_pb``
``GetChatMessageRequest`` / ``GetChatMessageResponse``), §7 (schema-less protobuf); connectrpc
``docs/protocol.md``; grpc ``doc/statuscodes.md`` (the status code names).

Framing: ``Framing.CONNECT`` / ``GRPC`` / ``GRPC_WEB`` / ``GRPC_WEB_TEXT`` by the response's media
type (``observer.wire.envelope.protocol_for``); each envelope's payload (decompressed) reaches the
adapter's ``on_binary`` as bytes: data messages (``event`` ``None``) are read with a per-endpoint
``observer.wire.protobuf.FieldMap``, the Connect end-stream envelope (``b"end-stream"``) with
``end_stream_error``, a gRPC-Web trailer frame (``b"trailers"``) with ``grpc_status``.

Decisions:

- Detection is the request's media type (``application/connect+*``, ``application/grpc*``)
  plus the RPC path; ``connect.unknown`` takes any other enveloped ``POST`` on an LLM host (the
  registry asks hosts for path-known dialects only).
- The request is read from its envelopes (at most ``MAX_REQUEST_ENVELOPES``: the first and the
  latest, ``request_envelopes``; each decompressed on its own, bounded by the request limits). A body that holds no envelope at all
  is not the dialect's request (``not_llm_request``).
- **Credentials inside request bodies are never stored**: the field maps do not name Windsurf's
  ``Metadata.api_key`` (1.3) or ``user_jwt`` (1.21), so they are never read; for
  ``connect.unknown`` every string found is passed through ``observer.redact.redact_shaped`` and
  a long unbroken token of letters and digits (an opaque key) is replaced with ``REDACTED``.
- Cursor ``Run``: text deltas (1.1.1), thinking (1.4.1), tool calls keyed by ``call_id``
  (``tool_call_started`` 1.2 and ``partial_tool_call`` 1.7 with argument deltas 1.7.3; the tool's
  name is a case of a 70-member ``oneof`` whose numbers are not public, so it stays unknown),
  ``routed_model`` (1.24.1) as the response model, and ``turn_ended`` (1.14): usage from its
  fields 1 (input) and 2 (output) when sent (absent is unknown, never 0), stop reason
  ``end_turn`` (raw ``turn_ended``) and the stream's end. Heartbeats, exec requests, checkpoints
  and KV blobs are not part of the record. The stream usually stays open after the turn, or
  carries the next one (``conversation_action``, request field 4): each ``turn_ended`` closes
  that turn's record at once (``multi_turn``: ``observer.tap`` cuts the stream into turns), and
  a later turn is a record of its own; heartbeats or a reset after the last turn make no
  record. Each turn's request is what the client had sent on the stream when the turn ended.
  ``RunSSE`` (the HTTP/1.1 shim) has the same response; its request is only a
  ``BidiRequestId`` (kept as ``metadata.bidi_request_id``): the prompt goes in separate unary
  ``BidiService/BidiAppend`` calls, which are not joined to the stream (limitation).
- Legacy Cursor ``StreamUnifiedChatWithTools`` (oneof 2 ``stream_unified_chat_response``): text
  2.1, thinking 2.25.1; its tool calls (2.13/2.36) are not read (shape not public enough).
- Windsurf ``GetChatMessage``: ``delta_text`` 3, ``delta_thinking`` 9, tool call 6 ``{1 id, 2
  name, 3 arguments_json}`` (fragments joined by id), usage 7 ``{2 input, 3 output}``,
  ``stop_reason`` 5 (3 ``max_tokens``, 10 ``tool_use``, other values kept as their number).
- End: a Connect end-stream ``{}`` is ``stream.end``, ``{"error": ...}`` an error (its ``code``
  and ``message``); a gRPC-Web trailer frame ``grpc-status: 0`` is ``stream.end``, non-zero an
  error named by the gRPC code (``resource_exhausted``, ...). gRPC's own status travels in HTTP/2
  trailers (or the headers of a trailers-only response), which reach ``on_trailers`` at the
  stream's clean end with the same meaning; a gRPC stream that ends without them (a reset) and
  without its dialect's turn marker is ``truncated`` / ``client_aborted`` (``missing_stream_end``).
- ``connect.unknown``: every printable string of each message (``protobuf.strings``) as text (one
  line each) and one ``schema_unknown`` violation per side.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import orjson

from observer.dialects.base import AdapterBase, DialectBase, RequestView
from observer.dialects.toolkit import Out, not_llm_request
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    UsageEvent,
)
from observer.records import RequestFacts, Violation, ViolationKind
from observer.redact import REDACTED, redact_shaped
from observer.response import ResponseSpec
from observer.wire.envelope import EnvelopeDecoder, EnvelopeProtocol, end_stream_error, grpc_status, protocol_for
from observer.wire.frames import END_STREAM_EVENT, TRAILERS_EVENT, BinaryFrame, Framing
from observer.wire.protobuf import FieldMap, strings

V = ViolationKind

MAX_REQUEST_ENVELOPES = 16  # request envelopes read for the record (a bidi client's first messages)
MAX_STRINGS = 1000  # strings kept per message of an unknown endpoint
_FRAMINGS = {
    EnvelopeProtocol.CONNECT: Framing.CONNECT,
    EnvelopeProtocol.GRPC: Framing.GRPC,
    EnvelopeProtocol.GRPC_WEB: Framing.GRPC_WEB,
}
# grpc doc/statuscodes.md, lower-cased as Connect names them.
GRPC_CODES = (
    "ok",
    "canceled",
    "unknown",
    "invalid_argument",
    "deadline_exceeded",
    "not_found",
    "already_exists",
    "permission_denied",
    "resource_exhausted",
    "failed_precondition",
    "aborted",
    "out_of_range",
    "unimplemented",
    "internal",
    "unavailable",
    "data_loss",
    "unauthenticated",
)
# A long unbroken run of token characters with letters and digits: an opaque key (``connect.unknown``).
_OPAQUE = re.compile(
    r"(?<![A-Za-z0-9_\-.+/=])(?=[A-Za-z0-9_\-.+/=]*[0-9])(?=[A-Za-z0-9_\-.+/=]*[A-Za-z])[A-Za-z0-9_\-.+/=]{32,}"
)

CURSOR_RUN_SSE = "/agent.v1.AgentService/RunSSE"
CURSOR_RUN = frozenset({"/agent.v1.AgentService/Run", CURSOR_RUN_SSE})
CURSOR_LEGACY = frozenset(
    {"/aiserver.v1.ChatService/StreamUnifiedChatWithTools", "/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE"}
)
WINDSURF_CHAT = frozenset({"/exa.api_server_pb.ApiServerService/GetChatMessage"})

# -- field maps (binary-formats §5.2, §6) ---------------------------------------------------------

CURSOR_REQUEST = FieldMap(
    {
        "1": ("run_request", "message"),
        "1.2.1.1.1": ("prompt", "string"),
        "1.2.1.1.4": ("mode", "enum"),
        "1.3.1": ("model_id", "string"),
        "1.3.4": ("model_name", "string"),
        "1.5": ("conversation_id", "string"),
        "1.8": ("system", "string"),
        "1.4.1": (
            "tools",
            FieldMap({"1": ("name", "string"), "2": ("description", "string"), "5": ("tool_name", "string")}),
        ),
        "4.1.1.1": ("followup", "string"),
    }
)
CURSOR_RESPONSE = FieldMap(
    {
        "1.1.1": ("text", "string"),
        "1.4.1": ("thinking", "string"),
        "1.2": ("started", FieldMap({"1": ("call_id", "string"), "3": ("model_call_id", "string")})),
        "1.7": ("partial", FieldMap({"1": ("call_id", "string"), "3": ("args", "string")})),
        "1.14": (
            "turn_ended",
            FieldMap(
                {
                    "1": ("input", "uint64"),
                    "2": ("output", "uint64"),
                    "3": ("cache_read", "uint64"),
                    "4": ("cache_write", "uint64"),
                    "5": ("reasoning", "uint64"),
                }
            ),
        ),
        "1.24.1": ("routed_model", "string"),
    }
)
BIDI_REQUEST_ID = FieldMap({"1": ("request_id", "string")})
CURSOR_LEGACY_REQUEST = FieldMap(
    {
        "1": ("conversation", FieldMap({"1": ("text", "string"), "2": ("type", "enum")})),
        "5.1": ("model", "string"),
        "23": ("conversation_id", "string"),
    }
)
CURSOR_LEGACY_RESPONSE = FieldMap({"2.1": ("text", "string"), "2.25.1": ("thinking", "string")})
WINDSURF_REQUEST = FieldMap(
    {
        # Metadata (1): only what is not a credential (1.3 api_key and 1.21 user_jwt are never read).
        "1.1": ("ide_name", "string"),
        "1.2": ("extension_version", "string"),
        "1.4": ("locale", "string"),
        "1.7": ("ide_version", "string"),
        "1.10": ("session_id", "string"),
        "2": ("system", "string"),
        "3": (
            "messages",
            FieldMap(
                {
                    "1": ("message_id", "string"),
                    "2": ("source", "enum"),
                    "3": ("prompt", "string"),
                    "6": (
                        "tool_calls",
                        FieldMap({"1": ("id", "string"), "2": ("name", "string"), "3": ("arguments", "string")}),
                    ),
                    "7": ("tool_call_id", "string"),
                }
            ),
        ),
        "7": ("request_type", "enum"),
        "8.2": ("max_tokens", "uint64"),
        "10": (
            "tools",
            FieldMap({"1": ("name", "string"), "2": ("description", "string"), "3": ("json_schema", "string")}),
        ),
        "16": ("cascade_id", "string"),
        "21": ("model", "string"),
    }
)
WINDSURF_RESPONSE = FieldMap(
    {
        "3": ("text", "string"),
        "9": ("thinking", "string"),
        "5": ("stop_reason", "enum"),
        "6": ("tool", FieldMap({"1": ("id", "string"), "2": ("name", "string"), "3": ("arguments", "string")})),
        "7": (
            "usage",
            FieldMap(
                {
                    "2": ("input", "uint64"),
                    "3": ("output", "uint64"),
                    "4": ("cache_write", "uint64"),
                    "5": ("cache_read", "uint64"),
                }
            ),
        ),
    }
)
WINDSURF_ROLES = {1: "user", 2: "system", 3: "assistant", 4: "tool"}
WINDSURF_STOPS = {3: "max_tokens", 10: "tool_use"}


def enveloped(request: RequestView) -> bool:
    """True for a ``POST`` whose ``Content-Type`` is an enveloped streaming type (Connect
    streaming, gRPC, gRPC-Web)."""
    return request.method.upper() == "POST" and any(protocol_for(t) is not None for t in request.media_types)


def message_encoding(headers: Any) -> str | None:
    """The per-message encoding a side declared: ``connect-content-encoding`` or ``grpc-encoding``."""
    return headers.get("connect-content-encoding") or headers.get("grpc-encoding") or None


def request_envelopes(body: bytes, request: RequestView) -> tuple[list[bytes], list[Violation]]:
    """The payloads of ``body``'s request envelopes (decompressed, each on its own; gzip when
    compressed and no encoding was declared), and the framing violations. At most
    ``MAX_REQUEST_ENVELOPES``: the first (a bidi stream's run request) and the latest (the
    client's newest turn; heartbeats count too), those between dropped with one
    ``oversize_request``. A body cut inside an envelope (a bidi upload still going) is not a
    violation: what was complete is read."""
    found = protocol_for(request.headers.get("content-type"))
    protocol = found[0] if found else EnvelopeProtocol.CONNECT
    decoder = EnvelopeDecoder(protocol, message_encoding(request.headers) or "gzip", request=True)
    first: list[bytes] = []
    latest: deque[bytes] = deque(maxlen=MAX_REQUEST_ENVELOPES - 1)
    seen = 0
    violations: list[Violation] = []
    for item in decoder.feed(body):
        if isinstance(item, Violation):
            violations.append(item)
        elif not first:
            first.append(item.payload)
        else:
            seen += 1
            latest.append(item.payload)
    if seen > len(latest):
        dropped = seen - len(latest)
        violations.append(
            Violation(
                V.OVERSIZE_REQUEST,
                None,
                f"{dropped} request envelopes between the first and the last {len(latest)} not read",
            )
        )
    return first + list(latest), violations


def _first(values: dict[str, list], name: str) -> Any:
    got = values.get(name)
    return got[-1] if got else None  # protobuf: the last value of a singular field wins


def _errors(errors: list[str], what: str) -> list[Violation]:
    if not errors:
        return []
    return [Violation(V.INVALID_EVENT, None, f"{what}: protobuf: {errors[0]}")]


class _ConnectBase(DialectBase):
    """What the Connect dialects share: detection by media type and path, enveloped framings."""

    paths: frozenset[str] = frozenset()

    def matches(self, request: RequestView) -> bool:
        return enveloped(request) and request.path_only in self.paths

    def framing(self, spec: ResponseSpec) -> Framing | None:
        found = protocol_for(spec.content_type)
        if found is None:
            return None
        protocol, text = found
        return Framing.GRPC_WEB_TEXT if text else _FRAMINGS[protocol]

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        payloads, violations = request_envelopes(body, request)
        if not payloads:
            return not_llm_request(body, "no request envelope")
        facts = RequestFacts(body_bytes=len(body), stream=True)
        self._read(payloads, facts, violations, request)
        return facts, violations

    def _read(
        self, payloads: list[bytes], facts: RequestFacts, violations: list[Violation], request: RequestView
    ) -> None:
        raise NotImplementedError


# -- Cursor ---------------------------------------------------------------------------------------


class CursorDialect(_ConnectBase):
    """Cursor's agent ``Run`` / ``RunSSE`` and the legacy ``StreamUnifiedChatWithTools(SSE)``."""

    name = "connect.cursor"
    paths = CURSOR_RUN | CURSOR_LEGACY

    def _read(
        self, payloads: list[bytes], facts: RequestFacts, violations: list[Violation], request: RequestView
    ) -> None:
        if request.path_only in CURSOR_LEGACY:
            _read_cursor_legacy(payloads, facts, violations)
            return
        if request.path_only == CURSOR_RUN_SSE:
            # ``aiserver.v1.BidiRequestId{request_id = 1}``: the prompt travels in separate unary
            # ``BidiService/BidiAppend`` calls, which are not joined to this stream (limitation).
            values, errors = BIDI_REQUEST_ID.extract(payloads[0])
            violations += _errors(errors, "request")
            if _first(values, "request_id"):
                facts.metadata["bidi_request_id"] = _first(values, "request_id")
            return
        messages: list[dict[str, Any]] = []
        tools: list[dict[str, Any]] = []
        for payload in payloads:
            values, errors = CURSOR_REQUEST.extract(payload)
            violations += _errors(errors, "request")
            if values.get("run_request"):
                system = _first(values, "system")
                if system:
                    messages.append({"role": "system", "content": system})
                prompt = _first(values, "prompt")
                if prompt is not None:
                    messages.append({"role": "user", "content": prompt})
                facts.model = _first(values, "model_id") or _first(values, "model_name") or facts.model
                conversation = _first(values, "conversation_id")
                if conversation:
                    facts.metadata["conversation_id"] = conversation
                mode = _first(values, "mode")
                if mode is not None:
                    facts.parameters["mode"] = mode
                for tool in values.get("tools", []):
                    tools.append({k: v[-1] for k, v in tool.items()})
            for text in values.get("followup", []):
                messages.append({"role": "user", "content": text})
        facts.messages = messages
        facts.tools = tools
        facts.tool_names = [t.get("tool_name") or t["name"] for t in tools if t.get("tool_name") or t.get("name")]

    def new_adapter(self, spec: ResponseSpec) -> ConnectAdapter:
        legacy = spec.path.split("?", 1)[0] in CURSOR_LEGACY
        return CursorLegacyAdapter() if legacy else CursorAdapter()


def _read_cursor_legacy(payloads: list[bytes], facts: RequestFacts, violations: list[Violation]) -> None:
    for payload in payloads:
        values, errors = CURSOR_LEGACY_REQUEST.extract(payload)
        violations += _errors(errors, "request")
        for turn in values.get("conversation", []):
            role = {1: "user", 2: "assistant"}.get(_first(turn, "type"), "user")
            facts.messages.append({"role": role, "content": _first(turn, "text") or ""})
        facts.model = _first(values, "model") or facts.model
        conversation = _first(values, "conversation_id")
        if conversation:
            facts.metadata["conversation_id"] = conversation


class ConnectAdapter(AdapterBase):
    """The shared part of the Connect adapters: envelopes in (``on_binary``), the end-stream
    envelope and gRPC-Web trailers read here, data messages to ``_data``."""

    multi_turn = False  # observer.tap: a stream that may carry several turns is cut into them

    def __init__(self) -> None:
        self.next_turn()

    def next_turn(self) -> None:
        """Forgets the turn that ended (``observer.tap`` calls it after cutting a turn of a
        ``multi_turn`` stream): the next turn's blocks and tool calls are numbered from 0."""
        self._started = False
        self._ended = False
        self._after_end = False
        self._text_index: int | None = None
        self._reasoning_index: int | None = None
        self._next_index = 0
        self._tools: dict[str, int] = {}

    def on_message(self, message: Any) -> Out:
        """The general path (an adapter seen without ``on_binary``): a ``BinaryFrame``."""
        if isinstance(message, BinaryFrame):
            event = message.event.encode() if message.event else None
            return self.on_binary((event, message.data, None, None, message.size_bytes))
        return [Violation(V.INVALID_EVENT, None, "a Connect stream message that is not binary")]

    def on_binary(self, message: tuple) -> Out:
        event, data = message[0], message[1]
        out: Out = []
        if event is None:
            if not self._started:
                self._started = True
                out.append(StreamStart(None, None, None))
            self._data(data, out)
        elif event == END_STREAM_EVENT:
            found = end_stream_error(data)
            if found is not None:
                out.append(ErrorEvent(None, found[0], found[1]))
            elif not self._ended:
                self._end(out)
        elif event == TRAILERS_EVENT:
            status, text = grpc_status(orjson.loads(data), percent_encoded=False)
            if status is None:
                out.append(ErrorEvent(None, "unknown", "gRPC-Web trailers without a grpc-status"))
            else:
                self._status(status, text, out)
        return out

    def on_trailers(self, fields: list[tuple[str, str]]) -> Out:
        """The response's HTTP/2 trailers, or the headers of a gRPC trailers-only response
        (``observer.tap`` at the stream's clean end): gRPC's status travels there (grpc
        ``doc/PROTOCOL-HTTP2.md``, "Trailers"; ``grpc-message`` percent-encoded). Without a
        ``grpc-status`` they say nothing of the stream's end (Connect ends in its body)."""
        status, text = grpc_status(fields)
        out: Out = []
        if status is not None:
            self._status(status, text, out)
        return out

    def _status(self, status: int, text: str | None, out: Out) -> None:
        """A gRPC status: 0 ends the stream, any other is the error named by its code."""
        if status != 0:
            code = GRPC_CODES[status] if status < len(GRPC_CODES) else str(status)
            out.append(ErrorEvent(None, code, text))
        elif not self._ended:
            self._end(out)

    def _end(self, out: Out) -> None:
        self._ended = True
        out.append(StreamEnd(None))

    def _content(self, text: str, block_type: str, out: Out) -> None:
        if self._ended:
            self._late(out)
            return
        if block_type == "text":
            if self._text_index is None:
                self._text_index, self._next_index = self._next_index, self._next_index + 1
            index = self._text_index
        else:
            if self._reasoning_index is None:
                self._reasoning_index, self._next_index = self._next_index, self._next_index + 1
            index = self._reasoning_index
        out.append(ContentDelta(None, index, text, block_type))

    def _tool(self, key: str, id: str | None, name: str | None, arguments: str, out: Out) -> None:
        if self._ended:
            self._late(out)
            return
        index = self._tools.get(key)
        if index is None:
            index = self._tools[key] = self._next_index
            self._next_index += 1
        out.append(ToolCallDelta(None, key, index, id, name, arguments))

    def _late(self, out: Out) -> None:
        if not self._after_end:
            self._after_end = True
            out.append(
                Violation(
                    V.EVENT_AFTER_END,
                    None,
                    "content after the turn ended (a further turn on the same stream): not recorded",
                )
            )

    def _data(self, data: bytes, out: Out) -> None:
        raise NotImplementedError


class CursorAdapter(ConnectAdapter):
    """``AgentServerMessage`` (module docstring). Multi-turn: each ``turn_ended`` closes a
    record while the stream stays open."""

    multi_turn = True

    def _data(self, data: bytes, out: Out) -> None:
        values, errors = CURSOR_RESPONSE.extract(data)
        out += _errors(errors, "AgentServerMessage")
        model = _first(values, "routed_model")
        if model and not self._ended:
            out.append(ModelEvent(None, model))
        for text in values.get("thinking", []):
            self._content(text, "reasoning", out)
        for text in values.get("text", []):
            self._content(text, "text", out)
        for call in values.get("started", []):
            call_id = _first(call, "call_id")
            self._tool(call_id or f"started-{len(self._tools)}", call_id, None, "", out)
        for part in values.get("partial", []):
            call_id = _first(part, "call_id")
            self._tool(call_id or "partial", call_id, None, _first(part, "args") or "", out)
        for turn in values.get("turn_ended", []):
            if self._ended:
                continue
            out.append(StopEvent(None, "end_turn", "turn_ended"))
            _usage(turn, out)
            self._end(out)


class CursorLegacyAdapter(ConnectAdapter):
    """``StreamUnifiedChatResponseWithTools`` (module docstring)."""

    def _data(self, data: bytes, out: Out) -> None:
        values, errors = CURSOR_LEGACY_RESPONSE.extract(data)
        out += _errors(errors, "StreamUnifiedChatResponseWithTools")
        for text in values.get("thinking", []):
            self._content(text, "reasoning", out)
        for text in values.get("text", []):
            self._content(text, "text", out)


# -- Windsurf -------------------------------------------------------------------------------------


class WindsurfDialect(_ConnectBase):
    """Windsurf / Codeium / Devin CLI ``ApiServerService/GetChatMessage``."""

    name = "connect.windsurf"
    paths = WINDSURF_CHAT

    def _read(
        self, payloads: list[bytes], facts: RequestFacts, violations: list[Violation], request: RequestView
    ) -> None:
        values, errors = WINDSURF_REQUEST.extract(payloads[0])  # a server stream: one request message
        violations += _errors(errors, "request")
        messages: list[dict[str, Any]] = []
        system = _first(values, "system")
        if system:
            messages.append({"role": "system", "content": system})
        for m in values.get("messages", []):
            source = _first(m, "source")
            entry: dict[str, Any] = {
                "role": WINDSURF_ROLES.get(source, f"source_{source}"),
                "content": _first(m, "prompt") or "",
            }
            calls = [{k: v[-1] for k, v in c.items()} for c in m.get("tool_calls", [])]
            if calls:
                entry["tool_calls"] = calls
            if _first(m, "tool_call_id"):
                entry["tool_call_id"] = _first(m, "tool_call_id")
            messages.append(entry)
        facts.messages = messages
        facts.model = _first(values, "model")
        facts.tools = [{k: v[-1] for k, v in t.items()} for t in values.get("tools", [])]
        facts.tool_names = [t["name"] for t in facts.tools if t.get("name")]
        for name in ("request_type", "max_tokens"):
            if _first(values, name) is not None:
                facts.parameters[name] = _first(values, name)
        for name in ("ide_name", "ide_version", "extension_version", "locale", "session_id", "cascade_id"):
            if _first(values, name):
                facts.metadata[name] = _first(values, name)

    def new_adapter(self, spec: ResponseSpec) -> WindsurfAdapter:
        return WindsurfAdapter()


class WindsurfAdapter(ConnectAdapter):
    """``GetChatMessageResponse`` (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._last_tool: str | None = None

    def _data(self, data: bytes, out: Out) -> None:
        values, errors = WINDSURF_RESPONSE.extract(data)
        out += _errors(errors, "GetChatMessageResponse")
        for text in values.get("thinking", []):
            self._content(text, "reasoning", out)
        for text in values.get("text", []):
            self._content(text, "text", out)
        for call in values.get("tool", []):
            call_id = _first(call, "id")
            key = call_id or self._last_tool or "tool"
            self._last_tool = key
            self._tool(key, call_id, _first(call, "name"), _first(call, "arguments") or "", out)
        for usage in values.get("usage", []):
            if not self._ended:
                _usage(usage, out)
        reason = _first(values, "stop_reason")
        if reason is not None and not self._ended:
            out.append(StopEvent(None, WINDSURF_STOPS.get(reason, str(reason)), str(reason)))


# -- any other enveloped stream on an LLM host ----------------------------------------------------


def redact_token(text: str) -> str:
    """``text`` with credential shapes (``redact_shaped``) and long opaque tokens replaced."""
    text = redact_shaped(text) or text
    return _OPAQUE.sub(REDACTED, text) if len(text) >= 32 else text


def found_strings(payload: bytes) -> list[str]:
    """The printable strings of one message, credentials replaced (``redact_token``)."""
    return [redact_token(s.strip()) for s in strings(payload)[:MAX_STRINGS] if s.strip()]


class UnknownConnectDialect(_ConnectBase):
    """Any enveloped ``POST`` on an LLM host without a field map: the strings found, and
    ``schema_unknown``."""

    name = "connect.unknown"

    def matches(self, request: RequestView) -> bool:
        return enveloped(request)

    def _read(
        self, payloads: list[bytes], facts: RequestFacts, violations: list[Violation], request: RequestView
    ) -> None:
        found = [s for payload in payloads for s in found_strings(payload)]
        facts.stream = None
        facts.parameters["strings"] = found
        violations.append(
            Violation(V.SCHEMA_UNKNOWN, None, f"request: protobuf without a field map; {len(found)} strings kept")
        )

    def new_adapter(self, spec: ResponseSpec) -> UnknownConnectAdapter:
        return UnknownConnectAdapter()


class UnknownConnectAdapter(ConnectAdapter):
    """Each message's strings as lines of text; one ``schema_unknown``."""

    def __init__(self) -> None:
        super().__init__()
        self._flagged = False

    def _data(self, data: bytes, out: Out) -> None:
        if not self._flagged:
            self._flagged = True
            out.append(
                Violation(V.SCHEMA_UNKNOWN, None, "response: protobuf without a field map; strings kept as text")
            )
        for text in found_strings(data):
            self._content(text + "\n", "text", out)


def _usage(values: dict[str, Any], out: list[Any]) -> None:
    """A usage message's counts as read by the field map (Cursor ``turn_ended`` 1.14.1-5: input,
    output, cache read, cache write, reasoning; Windsurf ``ModelUsageStats`` 7.2-5: input, output,
    cache write, cache read; binary-formats reference) -> one ``UsageEvent`` when it has any."""
    counts = [_first(values, name) for name in ("input", "output", "cache_read", "cache_write", "reasoning")]
    if any(c is not None for c in counts):
        out.append(UsageEvent(None, counts[0], counts[1], counts[2], counts[3], counts[4]))
