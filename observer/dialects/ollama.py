"""Ollama's native API: ``POST /api/chat`` and ``POST /api/generate``, streamed as NDJSON.

Sources: ollama ``docs/api.md`` ("Conventions: Streaming responses", "Generate a completion",
"Generate a chat completion": parameters, streamed and final objects, ``done_reason`` values
``stop``/``length``/``load``/``unload``, tool calls with object ``arguments``), ollama
``server/routes.go`` ``streamResponse`` (``application/x-ndjson``, one JSON object per line; an
error after the first byte is one ``{"error": "..."}`` line, then the stream ends; before it,
an HTTP error status with an ``application/json`` body), ollama ``openai/openai.go``
``ToChunk``/``ToChatCompletion`` (Ollama's own mapping of a response that produced tool calls
to finish reason ``tool_calls``); vendor-wire-formats §6.

Streaming is the default: a request is streamed unless it says ``"stream": false``, in which
case the answer is one ``application/json`` object of the same shape as the final line.
"""

from __future__ import annotations

from typing import Any

import orjson

from observer.conversation import CanonicalAttachment, CanonicalMessage, default_message, recorded_answer
from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import (
    JSON_NAMES,
    Out,
    base64_decoded_size,
    check_messages,
    not_llm_request,
    vendor_object,
)
from observer.dialects.usage import UsageMap, read_usage
from observer.dialects.vercel import is_ui_request, parse_ui_request
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    StopEvent,
    StreamEnd,
    ToolCallEvent,
)
from observer.records import Exchange, RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import Framing

PATHS = ("/api/chat", "/api/generate")
NDJSON_MEDIA_TYPES = frozenset({"application/x-ndjson", "application/ndjson"})
TEXT_BLOCK = 0  # message.content / response
REASONING_BLOCK = 1  # message.thinking / thinking
# done_reason -> draft stop reason where the meaning is the same; others (load, unload) kept raw.
DONE_REASONS = {"stop": "end_turn", "length": "max_tokens"}
TOOL_USE = "tool_use"  # a `stop` answer that produced tool calls (as Ollama's openai.go does)
# Top-level request fields that are generation settings (recorded in `parameters` beside `options`).
TOP_LEVEL_PARAMETERS = ("format", "think", "keep_alive", "raw", "logprobs", "top_logprobs")

V = ViolationKind


class OllamaDialect(DialectBase):
    """Ollama ``/api/chat`` and ``/api/generate``, recognised by a POST whose path (query
    stripped) ends with one of them, so a path prefix (``/ollama/api/chat``) is fine.

    AI SDK apps also serve ``POST /api/chat``; their responses are claimed by
    ``VercelUIDialect`` from the response header, after this match, but the request facts are
    read here: an AI SDK body (``is_ui_request``) is read as one (``parse_ui_request``)."""

    name = "ollama"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and request.path_only.rstrip("/").endswith(PATHS)

    def framing(self, spec: ResponseSpec) -> Framing | None:
        """NDJSON for ``application/x-ndjson`` (streamed), the whole body for
        ``application/json`` (``"stream": false``); anything else is unreadable."""
        response_media_type = spec.media_type
        if response_media_type in NDJSON_MEDIA_TYPES:
            return Framing.NDJSON
        if response_media_type == "application/json":
            return Framing.JSON
        return None

    def parse_request(self, body: bytes, request: RequestView | None = None) -> tuple[RequestFacts, list[Violation]]:
        """Reads a chat (``messages``) or generate (``prompt``, ``system``, ``images``) request.

        Recorded: ``model``; ``stream`` (``True`` unless ``"stream": false``); ``messages`` as
        sent with base64 ``images`` replaced by ``[{"data_bytes": N}]`` (a generate request
        becomes ``[system?, {"role": "user", "content": prompt, "images"?, "suffix"?}]``);
        ``tools`` (OpenAI-style ``{"type": "function", "function": {"name"}}``) and their names;
        ``parameters``: every ``options`` entry plus ``TOP_LEVEL_PARAMETERS``.

        Violations (``invalid_request``) only for what Ollama itself rejects by type: a body
        that is not a JSON object, and fields present with the wrong type. Missing fields are
        not flagged (Ollama answers them with an HTTP error, recorded as such), and a body
        shaped like an AI SDK UI request gets none.

        Shape (else ``not_llm_request``, metadata only): a JSON object with a string ``model``
        and, on ``/api/chat``, a ``messages`` array (a generate request's ``prompt``, when
        present, a string); or an AI SDK UI request. Never raises.
        """
        doc, why = vendor_object(body)
        if doc is None:
            return not_llm_request(body, why)
        if is_ui_request(doc):
            return parse_ui_request(body), []
        generate = request is not None and request.path_only.rstrip("/").endswith("/api/generate")
        generate = generate or ("prompt" in doc and "messages" not in doc)
        if not isinstance(doc.get("model"), str):
            return not_llm_request(body, "no model string")
        if generate and not isinstance(doc.get("prompt", ""), str):
            return not_llm_request(body, "prompt is not a string")
        if not generate and not isinstance(doc.get("messages"), list):
            return not_llm_request(body, "no messages array")
        facts = RequestFacts(body_bytes=len(body), stream=True)
        violations: list[Violation] = []
        facts.model = _typed(doc, "model", str, violations)
        stream = _typed(doc, "stream", bool, violations)
        facts.stream = True if doc.get("stream") is None else stream  # absent or null: streamed
        if generate:
            facts.messages = _generate_messages(doc, violations)
        else:
            facts.messages = _chat_messages(doc, violations)
        tools = _typed(doc, "tools", list, violations)
        if tools is not None:
            facts.tools = [t for t in tools if isinstance(t, dict)]
            facts.tool_names = [n for n in map(_tool_name, facts.tools) if n is not None]
        options = _typed(doc, "options", dict, violations)
        facts.parameters = dict(options or {})
        facts.parameters.update({k: doc[k] for k in TOP_LEVEL_PARAMETERS if k in doc})
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> OllamaAdapter:
        return OllamaAdapter()

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        """The messages in canonical form (``observer.conversation``): the default mapping
        (``content``, ``tool_calls`` with object ``arguments``, a ``tool`` message's content as
        its result) with every call id dropped (Ollama's ids are optional and its clients'
        message types do not keep them), ``images`` as image attachments (``data_bytes``);
        ``thinking`` and ``tool_name`` are left out."""
        return [_history_message(m) for m in request.messages]

    def answer_message(self, exchange: Exchange) -> CanonicalMessage | None:
        """The default answer (text and tool calls, ids dropped); ``None`` for
        ``/api/generate``, whose client continues with the returned ``context``, not by
        resending messages."""
        if exchange.path.split("?", 1)[0].rstrip("/").endswith("/api/generate"):
            return None
        return recorded_answer(exchange, keep_ids=False)


def _typed(doc: dict[str, Any], key: str, kind: type, violations: list[Violation]) -> Any:
    """``doc[key]`` if it has type ``kind``; ``None`` if absent or null; else ``None`` and an
    ``invalid_request`` violation (``bool`` is not accepted as an ``int``: JSON keeps them apart)."""
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, kind):
        return value
    violations.append(Violation(V.INVALID_REQUEST, None, f"{key} is not {JSON_NAMES[kind]}"))
    return None


def _images(images: Any) -> Any:
    """Base64 images as ``{"data_bytes": N}`` (decoded size); non-strings kept as sent."""
    if not isinstance(images, list):
        return images
    return [{"data_bytes": base64_decoded_size(i)} if isinstance(i, str) else i for i in images]


def _history_message(m: Any) -> CanonicalMessage:
    message = default_message(m, keep_ids=False)
    images = m.get("images") if isinstance(m, dict) else None
    if not isinstance(images, list):
        return message
    found = tuple(
        CanonicalAttachment("image", i.get("data_bytes") if isinstance(i.get("data_bytes"), int) else None)
        for i in images
        if isinstance(i, dict)
    )
    return CanonicalMessage(message.role, message.text, message.tool_calls, message.tool_results, found)


def _chat_message(m: Any) -> Any:
    if not isinstance(m, dict) or "images" not in m:
        return m
    return {**m, "images": _images(m["images"])}


def _chat_messages(doc: dict[str, Any], violations: list[Violation]) -> list[Any]:
    messages = _typed(doc, "messages", list, violations)
    if messages is None:
        return []
    check_messages(messages, violations)
    return [_chat_message(m) for m in messages]


def _generate_messages(doc: dict[str, Any], violations: list[Violation]) -> list[Any]:
    prompt = _typed(doc, "prompt", str, violations)
    system = _typed(doc, "system", str, violations)
    suffix = _typed(doc, "suffix", str, violations)
    messages: list[Any] = [{"role": "system", "content": system}] if system is not None else []
    if prompt is None and "images" not in doc:
        return messages
    user: dict[str, Any] = {"role": "user", "content": prompt or ""}
    if "images" in doc:
        user["images"] = _images(doc["images"])
    if suffix is not None:
        user["suffix"] = suffix
    messages.append(user)
    return messages


def _tool_name(tool: dict[str, Any]) -> str | None:
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) else None


class OllamaAdapter(AdapterBase):
    """Maps Ollama response objects (NDJSON lines, or the one ``stream: false`` object) onto
    canonical events; one instance per response.

    Per object: ``model`` -> ``ModelEvent`` (when it changes); ``message.thinking`` (chat) /
    ``thinking`` (generate) -> reasoning block ``REASONING_BLOCK``; ``message.content`` /
    ``response`` -> text block ``TEXT_BLOCK`` (empty strings emit nothing);
    ``message.tool_calls`` -> one complete ``ToolCallEvent`` each, numbered in order of arrival
    across the stream, ``id`` when present, ``function.arguments`` (an object) serialised as
    compact JSON with orjson (a string is kept as sent). ``done: true`` -> ``StopEvent`` from
    ``done_reason`` (``stop`` -> ``end_turn``, or ``tool_use`` when the response produced tool
    calls, since Ollama reports ``stop`` for those too; ``length`` -> ``max_tokens``; others
    raw; none when absent), ``UsageEvent`` (``OLLAMA_USAGE``: ``prompt_eval_count`` input,
    ``eval_count`` output, tokens; the durations in ``details``), then ``StreamEnd``. ``{"error": "..."}`` -> ``ErrorEvent``
    with code ``None``; Ollama closes the stream after it, so no ``StreamEnd`` follows.
    """

    def __init__(self) -> None:
        self._model: str | None = None
        self._tool_calls = 0

    def on_message(self, message: Message) -> Out:
        out: Out = []
        if not message.data.strip():
            return out
        try:
            obj = orjson.loads(message.data)
        except orjson.JSONDecodeError as exc:
            out.append(Violation(V.INVALID_JSON, None, f"NDJSON line: {exc}"))
            return out
        return self.on_object(message, obj)

    def on_object(self, message: Message, obj: Any) -> Out:
        """``on_message(message)`` for a line that already parsed as JSON to ``obj`` (any JSON
        value): the same events and violations, without parsing again."""
        out: Out = []
        if not isinstance(obj, dict):
            out.append(Violation(V.INVALID_EVENT, None, "NDJSON line is not a JSON object"))
            return out
        if "error" in obj:
            error = obj["error"]
            out.append(ErrorEvent(None, None, error if isinstance(error, str) else orjson.dumps(error).decode()))
            return out
        self._model_event(obj, out)
        self._content(obj, out)
        done = obj.get("done")
        if done is True:
            self._done(obj, out)
        elif done is not None and done is not False:
            out.append(Violation(V.INVALID_EVENT, None, "done is not a boolean"))
        return out

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane (``StreamAdapter.fast``): a line that only continues the text
        (``message.content`` of ``/api/chat``, ``response`` of ``/api/generate``; no error,
        ``done`` absent or false, no thinking, tool calls or model change) is
        ``sink.text(TEXT_BLOCK, "text", text)``, or nothing when the text is empty/null (no
        event); both return True. Anything else returns False (the general mapping runs). Same
        result as :meth:`on_message`."""
        if obj.__class__ is not dict or "error" in obj:
            return False
        get = obj.get
        done = get("done")
        if done is not None and done is not False:
            return False
        model = get("model")
        if model.__class__ is str and model and model != self._model:
            return False
        if "message" in obj:
            source = obj["message"]
            if source.__class__ is not dict:
                return False
            text = source.get("content")
        else:
            source = obj
            text = get("response")
        if source.get("thinking") is not None or source.get("tool_calls") is not None:
            return False
        if text.__class__ is str:
            if text:
                sink.text(TEXT_BLOCK, "text", text, now_s)
            return True
        return text is None

    def _model_event(self, obj: dict[str, Any], out: Out) -> None:
        model = obj.get("model")
        if isinstance(model, str) and model and model != self._model:
            self._model = model
            out.append(ModelEvent(None, model))

    def _content(self, obj: dict[str, Any], out: Out) -> None:
        source = obj
        if "message" in obj:
            source = obj["message"]
            if not isinstance(source, dict):
                out.append(Violation(V.INVALID_EVENT, None, "message is not an object"))
                return
        text_key = "content" if source is not obj else "response"
        _delta(source, "thinking", REASONING_BLOCK, "reasoning", out)
        _delta(source, text_key, TEXT_BLOCK, "text", out)
        calls = source.get("tool_calls")
        if isinstance(calls, list):
            for call in calls:
                self._tool_call(call, out)
        elif calls is not None:
            out.append(Violation(V.INVALID_EVENT, None, "tool_calls is not an array"))

    def _tool_call(self, call: Any, out: Out) -> None:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            out.append(Violation(V.INVALID_EVENT, None, "tool call without a function object"))
            return
        name = function.get("name")
        if not isinstance(name, str):
            out.append(Violation(V.INVALID_EVENT, None, "tool call function.name is not a string"))
            name = None
        args = function.get("arguments")
        arguments = args if isinstance(args, str) else "" if args is None else orjson.dumps(args).decode()
        call_id = call.get("id")
        call_id = call_id if isinstance(call_id, str) else None
        out.append(ToolCallEvent(None, self._tool_calls, call_id, name, arguments))
        self._tool_calls += 1

    def _done(self, obj: dict[str, Any], out: Out) -> None:
        reason = obj.get("done_reason")
        if isinstance(reason, str) and reason:
            canonical = TOOL_USE if reason == "stop" and self._tool_calls else DONE_REASONS.get(reason, reason)
            out.append(StopEvent(None, canonical, reason))
        elif reason is not None:
            out.append(Violation(V.INVALID_EVENT, None, "done_reason is not a string"))
        read_usage(obj, OLLAMA_USAGE, None, out, where="")
        out.append(StreamEnd(None))


def _delta(source: dict[str, Any], key: str, index: int, block_type: str, out: Out) -> None:
    text = source.get(key)
    if isinstance(text, str):
        if text:
            out.append(ContentDelta(None, index, text, block_type))
    elif text is not None:
        out.append(Violation(V.INVALID_EVENT, None, f"{key} is not a string"))


#: The final chunk's counts (Ollama API docs, "Generate a chat completion", response fields):
#: ``prompt_eval_count``, ``eval_count`` (tokens) and the timings ``total_duration``,
#: ``load_duration``, ``prompt_eval_duration``, ``eval_duration`` (nanoseconds), the latter as
#: ``details.duration_ns`` (``total``, ``load``, ``prompt_eval``, ``eval``).
OLLAMA_USAGE = UsageMap(
    input=("prompt_eval_count",),
    output=("eval_count",),
    named=(
        ("duration_ns", "total", "total_duration"),
        ("duration_ns", "load", "load_duration"),
        ("duration_ns", "prompt_eval", "prompt_eval_duration"),
        ("duration_ns", "eval", "eval_duration"),
    ),
)
