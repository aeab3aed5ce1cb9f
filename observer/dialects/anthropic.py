"""Anthropic Messages API (``POST /v1/messages``), direct and on Google Vertex AI.

Sources: Anthropic API reference "Messages" (request body: ``model``, ``messages``, ``system``,
``max_tokens``, ``metadata.user_id``, ``tools``, ``stream``, sampling knobs; response
``message`` object) and "Streaming messages" (event flow ``message_start``,
``content_block_start``/``_delta``/``_stop``, ``message_delta``, ``message_stop``, ``ping``,
``error``; delta types ``text_delta``, ``thinking_delta``, ``signature_delta``,
``input_json_delta``, ``citations_delta``; "new event types may be added": unknown ones are
skipped); Vertex AI "Use Claude models" (``.../publishers/anthropic/models/{model}:rawPredict``
and ``:streamRawPredict``, model in the URL, ``anthropic_version`` in the body);
vendor-wire-formats §1 (identification) and §4 (wire shape, reassembly, errors, quirks).

Decisions (the record's conventions applied to this vendor):

- ``system`` (a string or text blocks) is recorded as a leading ``{"role": "system",
  "content": <as sent>}`` message, so ``messages`` holds the whole prompt.
- Base64 payloads (``{"type": "base64", "media_type", "data"}`` sources of image and document
  blocks, at any depth, e.g. inside ``tool_result`` content) are replaced by
  ``"data_bytes": N`` (decoded size); every other field is kept as sent.
- ``parameters``: the generation knobs in ``PARAMETER_KEYS``, keyed by Anthropic's names.
  ``mcp_servers`` is deliberately not recorded (it carries ``authorization_token``).
- ``request_id`` stays ``None``: the Messages API has no client correlation id (the message id
  ``msg_...`` is the vendor's and is not recorded).
- Block indexes are Anthropic's own (unique per message): text blocks are ``"text"``,
  ``thinking`` and ``redacted_thinking`` blocks ``"reasoning"`` (a redacted block is recorded
  empty: its payload is encrypted), ``tool_use``/``server_tool_use`` blocks become tool calls
  at that index (fragments keyed by the index). Every text/thinking block is recorded from its
  ``content_block_start``, even if it stays empty.
- Usage is assigned, never added: ``message_start.message.usage`` and every
  ``message_delta.usage`` carry the totals so far. ``input_tokens`` is Anthropic's value, which
  excludes cache reads and writes: those are ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens`` as sent, the split of the cache write by lifetime
  (``cache_creation.ephemeral_5m_input_tokens``, ``…_1h_…``) is ``details.cache_creation``
  (``ephemeral_5m``, ``ephemeral_1h``), server tool requests (``server_tool_use``,
  ``web_search_requests``) ``details.server_tool_use``, any ``output_tokens_details`` counts
  ``details.output``; no total and no reasoning count are sent (``null``). Source: Messages API reference, "Usage" object; "Prompt caching".
- ``message.id`` (``msg_…``) is the ``response_id`` and ``usage.service_tier`` the
  ``service_tier`` (``ResponseIdentity``).
- ``data: [DONE]`` (appended by some Anthropic-compatible proxies, under ``event: done`` or
  none) maps to nothing, before or after ``message_stop`` (no ``event_after_end``), and is
  recorded once per stream as ``invalid_event``: it is not an Anthropic event, and the official
  ``anthropic`` SDK (2.x) fails with a JSON error on it, so the record shows why a client broke
  while the outcome stays what the Anthropic events say.
- An SSE ``event`` name that differs from the JSON ``type`` is a ``type_mismatch``; the JSON
  ``type`` decides the mapping. An event without an ``event`` field is mapped by its ``type``
  with no violation.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import unquote

import orjson

from observer.conversation import CanonicalMessage, attachment, call, default_message, part_text, result
from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import (
    Out,
    base64_decoded_size,
    check_messages,
    not_llm_request,
    read_tools,
    tool_names,
    vendor_object,
)
from observer.dialects.usage import UsageMap, read_usage
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
)
from observer.records import RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec

V = ViolationKind

PATH_SUFFIX = "/v1/messages"
VERTEX_PUBLISHER = "/publishers/anthropic/models/"
VERTEX_VERBS = (":streamRawPredict", ":rawPredict")
PARAMETER_KEYS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "thinking",
    "tool_choice",
    "service_tier",
    "container",
    "context_management",
)
TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use"})
REASONING_BLOCKS = frozenset({"thinking", "redacted_thinking"})


class AnthropicDialect(DialectBase):
    """Anthropic Messages: ``POST .../v1/messages`` (any proxy prefix, query ignored) and Vertex
    ``POST .../publishers/anthropic/models/{model}:streamRawPredict`` / ``:rawPredict``.
    Bedrock's ``/invoke-with-response-stream`` (binary eventstream) is not matched. Framing is
    the base default: SSE for ``text/event-stream``, one JSON message for JSON bodies."""

    name = "anthropic.messages"

    def matches(self, request: RequestView) -> bool:
        if request.method.upper() != "POST":
            return False
        path = unquote(request.path_only)
        return path.endswith(PATH_SUFFIX) or vertex_model(path) is not None

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        """Reads a Messages request body (see the module docstring for what goes where).

        Shape (else ``not_llm_request``, metadata only): a JSON object with a ``messages`` array
        and a string ``model`` (or a Vertex AI path naming the model). Other problems (e.g. no
        ``max_tokens``) are ``invalid_request`` violations. Never raises."""
        path_model = vertex_model(unquote(request.path_only)) if request is not None else None
        return read_messages_request(body, path_model)

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        """The messages in canonical form (``observer.conversation``), the recorded leading
        ``system`` message first: ``content`` a string or blocks — ``text`` blocks joined,
        ``tool_use``/``server_tool_use`` as calls (``id``, ``name``, ``input``), ``tool_result``
        as results (``tool_use_id``: the API makes clients echo it; text of its content),
        ``image``/``document`` as attachments (``source``: ``data_bytes``, ``url``,
        ``file_id``). Thinking blocks, signatures, ``cache_control``, citations and other block
        types (server tool results the record does not hold) are left out."""
        return [_history_message(m) for m in request.messages]

    def new_adapter(self, spec: ResponseSpec) -> AnthropicAdapter:
        return AnthropicAdapter()


def read_messages_request(body: bytes, path_model: str | None) -> tuple[RequestFacts, list[Violation]]:
    """A Messages request body as ``AnthropicDialect.parse_request`` reads it, ``path_model``
    the model its URL names (Vertex AI, Amazon Bedrock), if any: then the body needs none."""
    doc, why = vendor_object(body)
    if doc is None:
        return not_llm_request(body, why)
    model = doc.get("model")
    if not isinstance(doc.get("messages"), list):
        return not_llm_request(body, "no messages array")
    if path_model is None and not isinstance(model, str):
        return not_llm_request(body, "no model string")
    facts = RequestFacts(body_bytes=len(body), stream=False)
    violations: list[Violation] = []
    if "max_tokens" not in doc:
        violations.append(Violation(V.INVALID_REQUEST, None, "missing required fields: max_tokens"))
    if path_model is not None and "model" in doc and not isinstance(model, str):
        violations.append(Violation(V.INVALID_REQUEST, None, "model is not a string"))
    facts.model = path_model or (model if isinstance(model, str) else None)
    facts.stream = _stream_flag(doc, violations)
    facts.messages = _messages(doc, violations)
    # Client tools {name, description, input_schema} and server tools {type, name, ...}
    # both declare a name; a tool_use/server_tool_use block uses it.
    facts.tools = read_tools(doc, "tools", violations)
    facts.tool_names = tool_names(facts.tools)
    facts.parameters = {k: doc[k] for k in PARAMETER_KEYS if k in doc}
    metadata = doc.get("metadata")
    if isinstance(metadata, dict):
        facts.metadata = metadata
        user = metadata.get("user_id")
        facts.end_user = user if isinstance(user, str) else None
    elif metadata is not None:
        violations.append(Violation(V.INVALID_REQUEST, None, "metadata is not an object"))
    return facts, violations


def vertex_model(path: str) -> str | None:
    """The model of a Vertex ``.../publishers/anthropic/models/{model}:(stream)RawPredict`` path
    (already URL-decoded), else ``None``."""
    head, sep, tail = path.rpartition(VERTEX_PUBLISHER)
    if not sep:
        return None
    model, colon, verb = tail.partition(":")
    if not colon or f":{verb}" not in VERTEX_VERBS or not model or "/" in model:
        return None
    return model


def _stream_flag(doc: dict[str, Any], violations: list[Violation]) -> bool | None:
    """``stream``: absent means false (the API default)."""
    stream = doc.get("stream", False)
    if isinstance(stream, bool):
        return stream
    violations.append(Violation(V.INVALID_REQUEST, None, "stream is not a boolean"))
    return None


def _messages(doc: dict[str, Any], violations: list[Violation]) -> list[Any]:
    out: list[Any] = []
    system = doc.get("system")
    if system is not None:
        if not isinstance(system, (str, list)):
            violations.append(Violation(V.INVALID_REQUEST, None, "system is neither a string nor an array"))
        out.append({"role": "system", "content": strip_base64(system)})
    messages = doc.get("messages")
    if isinstance(messages, list):
        check_messages(messages, violations)
        out.extend(strip_base64(m) for m in messages)
    elif messages is not None:
        violations.append(Violation(V.INVALID_REQUEST, None, "messages is not an array"))
    return out


def _history_message(m: Any) -> CanonicalMessage:
    if not isinstance(m, dict):
        return default_message(m)
    role = m.get("role") if isinstance(m.get("role"), str) else ""
    content = m.get("content")
    if isinstance(content, str):
        return CanonicalMessage(role, content)
    texts, calls, results, attachments = [], [], [], []
    for block in content if isinstance(content, list) else ():
        kind = block.get("type") if isinstance(block, dict) else None
        text = part_text(block)
        if text is not None:
            texts.append(text)
        elif kind in TOOL_BLOCKS:
            calls.append(call(block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            results.append(result(block.get("tool_use_id"), block.get("content") or ""))
        elif kind in ("image", "document") and (found := attachment(block)) is not None:
            attachments.append(found)
    return CanonicalMessage(role, "".join(texts), tuple(calls), tuple(results), tuple(attachments))


def strip_base64(value: Any) -> Any:
    """``value`` with every base64 source ``{"type": "base64", "data": "..."}`` (at any depth)
    reduced to its other fields plus ``data_bytes`` (decoded size in bytes). Text sources
    (``"type": "text"``) and everything else are returned as sent."""
    if isinstance(value, list):
        return [strip_base64(v) for v in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") == "base64" and isinstance(value.get("data"), str):
        out = {k: v for k, v in value.items() if k != "data"}
        out["data_bytes"] = base64_decoded_size(value["data"])
        return out
    return {k: strip_base64(v) for k, v in value.items()}


class AnthropicAdapter(AdapterBase):
    """Maps one Messages response onto canonical events: the SSE events of a streamed answer,
    or the single ``message`` object of a non-streamed one (same mapping, then ``StreamEnd``).

    Checks: invalid JSON (``invalid_json``), an event that is not a JSON object or lacks a
    string ``type``, a bad block ``index``, a delta whose kind does not fit the block its
    ``content_block_start`` opened, a second ``content_block_start`` at one index
    (``invalid_event``; ``reused_tool_index`` when a tool block follows a tool block there: the
    new call is recorded separately and later fragments join it), a ``content_block_stop`` for an
    index no ``content_block_start`` opened (``block_not_started``: nothing else is lost, the stop
    reason comes in ``message_delta``), and an SSE ``event`` name different from the JSON
    ``type`` (``type_mismatch``)."""

    def __init__(self) -> None:
        self._kinds: dict[int, str] = {}  # block index -> "text" | "reasoning" | "tool" | other type
        self._tool_keys: dict[int, str] = {}  # block index -> ToolCallDelta key of the call open there
        self._starts: Counter[int] = Counter()  # tool blocks started per index
        self._done_seen = False

    def on_message(self, message: Message) -> Out:
        name = message.event or "message"
        if message.data.strip() == "[DONE]":
            return self._done_marker()
        try:
            obj = orjson.loads(message.data)
        except orjson.JSONDecodeError as exc:
            return [Violation(V.INVALID_JSON, None, f"event {name!r}: {exc}")]
        return self.on_object(message, obj)

    def on_object(self, message: Message, obj: Any) -> Out:
        """``on_message(message)`` for a message whose data already parsed as JSON to ``obj``
        (any JSON value): the same events and violations, without parsing again."""
        name = message.event or "message"
        if not isinstance(obj, dict):
            return [Violation(V.INVALID_EVENT, None, f"event {name!r}: data is not a JSON object")]
        etype = obj.get("type")
        if not isinstance(etype, str):
            return [Violation(V.INVALID_EVENT, None, f"event {name!r}: missing or non-string type")]
        out: Out = []
        if message.event and message.event != etype:
            out.append(Violation(V.TYPE_MISMATCH, None, f"SSE event {message.event!r} but JSON type {etype!r}"))
        handler = _HANDLERS.get(etype)
        if handler is not None:
            handler(self, obj, out)
        return out

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane (``StreamAdapter.fast``): a ``content_block_delta`` carrying a
        ``text_delta``/``thinking_delta`` string for a block opened with that kind, with no SSE
        ``event`` or one equal to its ``type``, is ``sink.text(index, kind, text)``, what
        :meth:`on_message` maps it to; an ``input_json_delta`` of an open tool block is
        ``sink.fragment`` with the ``ToolCallDelta`` fields; each returns True. Anything else
        returns False (the general mapping runs)."""
        if obj.__class__ is not dict or obj.get("type") != "content_block_delta":
            return False
        if event and event != b"content_block_delta":
            return False
        index = obj.get("index")
        if index.__class__ is not int or index < 0 or index >= 2**63:
            return False
        delta = obj.get("delta")
        if delta.__class__ is not dict:
            return False
        dtype = delta.get("type")
        if dtype == "text_delta":
            kind, value = "text", delta.get("text")
        elif dtype == "thinking_delta":
            kind, value = "reasoning", delta.get("thinking")
        elif dtype == "input_json_delta":
            value = delta.get("partial_json")
            if value.__class__ is not str or self._kinds.get(index) != "tool":
                return False
            sink.fragment(None, self._tool_keys.get(index, str(index)), index, None, None, value)
            return True
        else:
            return False
        if value.__class__ is not str or self._kinds.get(index) != kind:
            return False
        sink.text(index, kind, value, now_s)
        return True

    def _done_marker(self) -> Out:
        """A proxy's ``[DONE]`` terminator (module docstring): flagged once, mapped to nothing."""
        if self._done_seen:
            return []
        self._done_seen = True
        return [Violation(V.INVALID_EVENT, None, "data [DONE] is not an Anthropic event (a proxy's terminator)")]

    def _message_start(self, obj: dict[str, Any], out: Out) -> None:
        msg = obj.get("message")
        if not isinstance(msg, dict):
            out.append(Violation(V.INVALID_EVENT, None, "message_start: message is not an object"))
            return
        model = msg.get("model")
        out.append(StreamStart(None, model if isinstance(model, str) else None, None))
        _message_identity(msg, out)
        _usage(msg.get("usage"), out)

    def _block_start(self, obj: dict[str, Any], out: Out) -> None:
        index = _index(obj, out)
        block = obj.get("content_block")
        if index is None:
            return
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            out.append(Violation(V.INVALID_EVENT, None, "content_block_start: content_block has no type"))
            return
        kind = _kind(block["type"])
        if index in self._kinds:
            reused = kind == "tool" and self._kinds[index] == "tool"
            detail = f"content_block_start for index {index}, already started" + (
                ": recorded as a separate call" if reused else ""
            )
            out.append(Violation(V.REUSED_TOOL_INDEX if reused else V.INVALID_EVENT, None, detail))
        self._kinds[index] = kind
        if kind == "tool":
            self._starts[index] += 1
            n = self._starts[index]
            self._tool_keys[index] = str(index) if n == 1 else f"{index}:{n}"
        _block(index, block, out, key=self._tool_keys.get(index, str(index)))

    def _block_delta(self, obj: dict[str, Any], out: Out) -> None:
        index = _index(obj, out)
        delta = obj.get("delta")
        if index is None:
            return
        if not isinstance(delta, dict):
            out.append(Violation(V.INVALID_EVENT, None, "content_block_delta: delta is not an object"))
            return
        dtype = delta.get("type")
        mapped = _DELTAS.get(dtype) if isinstance(dtype, str) else None
        if mapped is None:
            return  # signature_delta, citations_delta and unknown deltas: nothing the record holds
        kind, field = mapped
        value = delta.get(field)
        if not isinstance(value, str):
            detail = f"content_block_delta: {dtype}.{field} is not a string"
            out.append(Violation(V.INVALID_EVENT, None, detail))
            return
        opened = self._kinds.get(index)
        if opened != kind:
            what = f"a {opened!r} block" if opened else "no content_block_start"
            out.append(Violation(V.INVALID_EVENT, None, f"{dtype} at index {index} with {what}"))
        if kind == "tool":
            out.append(ToolCallDelta(None, self._tool_keys.get(index, str(index)), index, None, None, value))
        else:
            out.append(ContentDelta(None, index, value, kind))

    def _block_stop(self, obj: dict[str, Any], out: Out) -> None:
        """``content_block_stop``: the record holds nothing of it, but a stop for an index that no
        ``content_block_start`` opened is ``block_not_started`` (a bad index: ``invalid_event``)."""
        index = _index(obj, out)
        if index is not None and index not in self._kinds:
            detail = f"content_block_stop for index {index}, which no content_block_start opened"
            out.append(Violation(V.BLOCK_NOT_STARTED, None, detail))

    def _message_delta(self, obj: dict[str, Any], out: Out) -> None:
        delta = obj.get("delta")
        reason = delta.get("stop_reason") if isinstance(delta, dict) else None
        if isinstance(reason, str):
            out.append(StopEvent(None, reason, reason))  # Anthropic's names are the canonical ones
        _usage(obj.get("usage"), out)

    def _message_stop(self, obj: dict[str, Any], out: Out) -> None:
        out.append(StreamEnd(None))

    def _error(self, obj: dict[str, Any], out: Out) -> None:
        err = obj.get("error")
        err = err if isinstance(err, dict) else {}
        code, text = err.get("type"), err.get("message")
        out.append(ErrorEvent(None, code if isinstance(code, str) else None, text if isinstance(text, str) else None))

    def _whole_message(self, obj: dict[str, Any], out: Out) -> None:
        """A non-streamed ``message`` object: start, every content block at its array position,
        stop reason, usage, end."""
        model = obj.get("model")
        out.append(StreamStart(None, model if isinstance(model, str) else None, None))
        _message_identity(obj, out)
        content = obj.get("content")
        if isinstance(content, list):
            for index, block in enumerate(content):
                if isinstance(block, dict) and isinstance(block.get("type"), str):
                    _block(index, block, out, key=None)
        reason = obj.get("stop_reason")
        if isinstance(reason, str):
            out.append(StopEvent(None, reason, reason))
        _usage(obj.get("usage"), out)
        out.append(StreamEnd(None))


def _kind(block_type: str) -> str:
    if block_type == "text":
        return "text"
    if block_type in REASONING_BLOCKS:
        return "reasoning"
    if block_type in TOOL_BLOCKS:
        return "tool"
    return block_type


def _block(index: int, block: dict[str, Any], out: Out, *, key: str | None) -> None:
    """One content block, from ``content_block_start`` (``key``: the tool call's fragment key)
    or from a whole message (``key`` ``None``). Tool input is a JSON object: serialised
    compactly with orjson (``{}`` at a stream's start contributes nothing; its
    ``input_json_delta`` fragments follow)."""
    btype = block["type"]
    if btype == "text":
        text = block.get("text")
        out.append(ContentDelta(None, index, text if isinstance(text, str) else "", "text"))
    elif btype == "thinking":
        text = block.get("thinking")
        out.append(ContentDelta(None, index, text if isinstance(text, str) else "", "reasoning"))
    elif btype == "redacted_thinking":
        out.append(ContentDelta(None, index, "", "reasoning"))
    elif btype in TOOL_BLOCKS:
        tid, name, raw = block.get("id"), block.get("name"), block.get("input")
        tid = tid if isinstance(tid, str) else None
        name = name if isinstance(name, str) else None
        if key is not None:
            arguments = orjson.dumps(raw).decode() if raw not in (None, {}) else ""
            out.append(ToolCallDelta(None, key, index, tid, name, arguments))
        else:
            arguments = orjson.dumps(raw).decode() if raw is not None else ""
            out.append(ToolCallEvent(None, index, tid, name, arguments))
    # other block types (web_search_tool_result, mcp_tool_use, ...): nothing the record holds


def _index(obj: dict[str, Any], out: Out) -> int | None:
    index = obj.get("index")
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 2**63:
        return index
    out.append(Violation(V.INVALID_EVENT, None, f"{obj.get('type')}: index is not a non-negative integer"))
    return None


#: The Messages API ``Usage`` object (module docstring).
ANTHROPIC_USAGE = UsageMap(
    input=("input_tokens",),
    output=("output_tokens",),
    cache_read=("cache_read_input_tokens",),
    cache_creation=("cache_creation_input_tokens",),
    objects=(
        ("cache_creation", "cache_creation"),
        ("server_tool_use", "server_tool_use"),
        ("output", "output_tokens_details"),
    ),
)


def _usage(usage: Any, out: Out) -> None:
    """A cumulative ``usage`` object (``ANTHROPIC_USAGE``; null or absent counts are not in
    this event; a non-integer count is an ``invalid_event``) and its ``service_tier``."""
    read_usage(usage, ANTHROPIC_USAGE, None, out)
    if isinstance(usage, dict) and isinstance(usage.get("service_tier"), str) and usage["service_tier"]:
        out.append(ResponseIdentity(None, service_tier=usage["service_tier"]))


def _message_identity(msg: dict[str, Any], out: Out) -> None:
    """The message's ``id`` (``msg_…``) as the ``response_id``."""
    mid = msg.get("id")
    if isinstance(mid, str) and mid:
        out.append(ResponseIdentity(None, response_id=mid))


_DELTAS = {
    "text_delta": ("text", "text"),
    "thinking_delta": ("reasoning", "thinking"),
    "input_json_delta": ("tool", "partial_json"),
}

_HANDLERS = {
    "message_start": AnthropicAdapter._message_start,
    "content_block_start": AnthropicAdapter._block_start,
    "content_block_delta": AnthropicAdapter._block_delta,
    "content_block_stop": AnthropicAdapter._block_stop,
    "message_delta": AnthropicAdapter._message_delta,
    "message_stop": AnthropicAdapter._message_stop,
    "error": AnthropicAdapter._error,
    "message": AnthropicAdapter._whole_message,
    # ping and unknown types: nothing to record
}
