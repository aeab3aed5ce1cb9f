"""OpenAI Chat Completions (``POST …/chat/completions``) and the servers that copy it: OpenAI,
Azure OpenAI, OpenRouter, vLLM, SGLang, llama.cpp, Ollama ``/v1``, Mistral, DeepSeek, Groq, ….

Sources: OpenAI API reference "Chat Completions" (create request; ``chat.completion`` and
``chat.completion.chunk`` objects; ``stream_options.include_usage``: every chunk has
``"usage": null`` and one extra chunk with ``choices: []`` carries the totals before
``data: [DONE]``); vendor-wire-formats §1 (identification; Azure deployment path), §2 (wire shape,
reassembly rules, errors), §9 (compatible-server quirks: OpenRouter comments and in-band errors,
Azure filter chunks, vLLM ``{"object":"error"}``, Ollama #15457 reused tool index, Fireworks
repeated ids, Mistral ``"id":"null"``, reasoning fields of DeepSeek/vLLM/OpenRouter).

Stop reasons (``finish_reason`` -> canonical, draft §5.3 where the meaning is the same):
``stop`` -> ``end_turn``, ``length`` -> ``max_tokens``, ``tool_calls`` -> ``tool_use``,
``function_call`` (legacy) -> ``tool_use``, ``content_filter`` -> ``content_filter``; any other
value (OpenRouter ``error``, servers' own) is kept as sent. ``stop_reason_raw`` is always the
vendor's value.

llama.cpp's old non-standard ``error:`` SSE field (before Sept. 2025), which WHATWG's parser
ignores, reaches this adapter as an event of type ``error`` (``observer.wire.sse`` surfaces a
JSON-valued unknown field, with a ``nonstandard_field`` violation) and is an ``ErrorEvent``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from observer.conversation import CanonicalMessage, call, default_message, recorded_answer, result
from observer.dialects._openai_common import (
    CHAT_USAGE,
    arguments,
    call_id,
    error_event,
    identity,
    read_envelope,
    reduce_binary,
    text,
)
from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import (
    INT64_MAX,
    MAX_CHOICES_SEEN,
    check_messages,
    is_int,
    load_object,
    not_llm_request,
    read_tools,
)
from observer.dialects.usage import read_usage
from observer.events import (
    CanonicalEvent,
    ChoiceOpen,
    ContentDelta,
    ModelEvent,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
)
from observer.records import Exchange, RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import JSONFrame

V = ViolationKind
_PLAIN_DELTA_KEYS = frozenset({"content", "role"})
REUSED_TOOL_INDEX = "reused_tool_index"  # not yet in ViolationKind

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "content_filter",
}
REASONING_BLOCK = 1000  # block index of choice c's reasoning text: 1000 + c
REFUSAL_BLOCK = 2000  # block index of choice c's refusal text: 2000 + c
_AZURE_DEPLOYMENT = re.compile(r"/openai/deployments/([^/]+)/(?:extensions/)?chat/completions/?$")
_OWN_FIELDS = ("messages", "functions")


class OpenAIChatDialect(DialectBase):
    """OpenAI Chat Completions: any ``POST`` whose path (query excluded) ends in
    ``/chat/completions`` — ``/v1/…`` (OpenAI and compatible servers), OpenRouter
    ``/api/v1/…``, Azure ``/openai/deployments/{deployment}/…`` and ``/openai/v1/…``. The host
    is not looked at (vendor-wire-formats §1). Responses: SSE (``text/event-stream``) or one
    JSON object (``application/json``, non-streaming requests)."""

    name = "openai.chat"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and request.path_only.rstrip("/").endswith("/chat/completions")

    def parse_request(self, body: bytes, request: RequestView | None = None) -> tuple[RequestFacts, list[Violation]]:
        """Reads a chat-completions request body.

        - ``model``: the body's ``model``; when absent, the Azure deployment name from the path
          ``/openai/deployments/{deployment}/chat/completions`` (or ``…/extensions/chat/…``,
          "On Your Data"; URL-decoded): Azure routes by deployment and the body may omit it.
        - ``messages``: as sent, inline binary payloads reduced to ``data_bytes``
          (``_openai_common.reduce_binary``).
        - ``tools``: ``tools`` then legacy ``functions``, as sent; ``tool_names`` from
          ``function.name`` (``{type:"function"}``), ``custom.name`` (``{type:"custom"}``) or a
          legacy function's ``name``.
        - ``stream``: absent means ``False``; ``parameters``: every other top-level key
          (temperature, max_tokens, stop, response_format, tool_choice, stream_options, …);
          ``metadata``; ``end_user``: ``safety_identifier`` else ``user``.
        Shape (else ``not_llm_request``, metadata only): a JSON object with a ``messages`` array
        and a string ``model`` (or an Azure deployment path). Other problems are
        ``invalid_request`` violations. Never raises.
        """
        doc, facts, violations = read_envelope(body, _OWN_FIELDS)
        if doc is None:
            return facts, violations
        if facts.model is None and request is not None:
            match = _AZURE_DEPLOYMENT.search(request.path_only)
            if match:
                facts.model = unquote(match.group(1))
        messages = doc.get("messages")
        if not isinstance(messages, list):
            return not_llm_request(body, "no messages array")
        if facts.model is None:
            return not_llm_request(body, "no model string")
        facts.messages = [reduce_binary(m) for m in messages]
        check_messages(messages, violations)
        facts.tools = read_tools(doc, "tools", violations) + read_tools(doc, "functions", violations)
        facts.tool_names = [n for n in (_tool_name(t) for t in facts.tools) if n is not None]
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> OpenAIChatAdapter:
        return OpenAIChatAdapter()

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        """The messages in canonical form (``observer.conversation``): the default mapping
        (``content`` text or parts, ``tool_calls`` with their ids, a ``tool`` message's
        ``tool_call_id``: the API makes clients echo them), plus the legacy ``function_call`` of
        an assistant message (a call without id) and ``function`` messages (a result without
        id). ``name``, ``refusal``, ``audio`` and ``annotations`` are left out."""
        return [_history_message(m) for m in request.messages]

    def answer_message(self, exchange: Exchange) -> CanonicalMessage | None:
        """The default answer (text and tool calls), or ``None`` when the request asked for
        ``n > 1`` choices: which one the client keeps is unknown, and the record's tool calls
        do not say their choice."""
        n = exchange.request.parameters.get("n")
        if is_int(n) and n > 1:
            return None
        return recorded_answer(exchange)


def _history_message(m: Any) -> CanonicalMessage:
    message = default_message(m)
    if not isinstance(m, dict):
        return message
    if m.get("role") == "function":  # legacy: the result of a function_call, by function name
        return CanonicalMessage("tool", tool_results=(result(None, m.get("content") or ""),))
    legacy = m.get("function_call")
    if isinstance(legacy, dict):
        legacy_call = call(None, legacy.get("name"), legacy.get("arguments"))
        return CanonicalMessage(message.role, message.text, (*message.tool_calls, legacy_call), (), message.attachments)
    return message


def _tool_name(tool: dict[str, Any]) -> str | None:
    """``function.name`` / ``custom.name`` of a tool, or ``name`` of a legacy function."""
    for key in ("function", "custom"):
        inner = tool.get(key)
        if isinstance(inner, dict):
            return text(inner.get("name"))
    return text(tool.get("name"))


@dataclass(slots=True)
class _OpenCall:
    key: str  # the ToolCallDelta key of the call open at one (choice, tool index)
    id: str | None


class OpenAIChatAdapter(AdapterBase):
    """Maps chat-completion chunks (SSE ``data:`` events) or one ``chat.completion`` object
    (whole-body JSON) onto canonical events. No sequence numbers: every event has ``seq=None``.

    - Start/model: the first chunk with a non-empty ``id`` or ``model`` gives ``StreamStart``
      (``request_id`` = the completion ``id``); a later different non-empty ``model`` gives a
      ``ModelEvent``. Azure's filter chunks (``id``/``model`` ``""``) give neither.
    - Text: ``delta.content`` of choice ``c`` in block ``c``; reasoning (``reasoning_content``,
      DeepSeek/vLLM, else ``reasoning``, OpenRouter/newer vLLM) in block ``1000 + c``; refusal in
      block ``2000 + c``. Empty and null values are skipped.
    - Tool calls: fragments keyed by (choice, ``tool_calls[].index``); the call's recorded index
      is that tool index (in a ``chat.completion`` object: the position in ``tool_calls``). A
      fragment whose ``id`` differs from the id of the call open at its key starts a separate
      call and adds a ``reused_tool_index`` violation (Ollama ``/v1`` #15457); the same id again
      continues the call (Fireworks repeats id and name on every fragment). A fragment without
      ``index`` (Ollama before 0.4.7) uses its position in the array, once flagged
      ``invalid_event``. ``custom`` tool calls (``custom.input``) and the legacy
      ``delta.function_call`` (recorded with index ``None``) are tool calls too — unless the
      choice also streams ``tool_calls``: llama-cpp-python mirrors every fragment into both, and
      the mirror is not a second call.
    - ``finish_reason`` -> ``StopEvent`` (mapping in the module docstring); any object
      ``usage`` (else Groq's ``x_groq.usage``) -> ``UsageEvent`` (``_openai_common.CHAT_USAGE``:
      ``prompt_tokens`` input, ``completion_tokens`` output, cached, reasoning, total and the
      details); ``"usage": null`` is no report.
    - The chunk's ``id`` (``chatcmpl-…``), ``system_fingerprint`` and ``service_tier`` ->
      ``ResponseIdentity`` (given when one first appears; the id is also the record's ``request_id``, as
      before). Each choice index is announced when first seen (``ChoiceOpen``, its text block
      its own index), and each ``finish_reason`` is also that choice's (``StopEvent.choice``): with
      several choices (``n > 1``) the record's ``choices`` list each, one that never finished too.
    - Errors: ``{"error": {…}}`` (OpenAI, OpenRouter — which may also send choices with
      ``finish_reason: "error"`` — SGLang, newer vLLM) or ``{"object": "error", …}`` (vLLM) ->
      ``ErrorEvent`` (``_openai_common.error_event``); a later ``[DONE]`` does not undo it.
    - ``data: [DONE]`` -> ``StreamEnd``; a whole-body JSON answer ends with ``StreamEnd`` once
      parsed (its body is complete by construction).
    - Fields of the wrong JSON type are ``invalid_event`` violations, never dropped silently:
      ``content`` neither text, parts nor null; a present choice ``index`` that is not a
      non-negative integer (choice 0 is used); ``finish_reason`` or ``model`` not a string; a
      token count that is not a non-negative integer. Absent and null fields stay silent.
    """

    def __init__(self) -> None:
        self._started = False
        self._model: str | None = None
        self._calls: dict[tuple[int, int], _OpenCall] = {}
        self._generation: Counter[tuple[int, int]] = Counter()
        self._index_missing_reported = False
        self._modern_choices: set[int] = set()  # choices that stream ``tool_calls``
        self._identity_seen: set[str] = set()  # ResponseIdentity fields given (``identity``)
        # ``_fast_fragment``'s memory: the (choice, tool index) slot of its last fragment and
        # the call open there (forgotten whenever a call opens in any slot).
        self._fast_c: int | None = None
        self._fast_index: int | None = None
        self._fast_call: _OpenCall | None = None
        # Choices announced (``ChoiceOpen``, at most MAX_CHOICES_SEEN); the fast lane's last one.
        self._choices_seen: set[int] = set()
        self._fast_choice = -1

    def on_message(self, message: Message) -> list[CanonicalEvent | Violation]:
        data = message.data.strip()
        if not data:
            return []
        if data == "[DONE]":
            return [StreamEnd(None)]
        out: list[CanonicalEvent | Violation] = []
        obj = load_object(data, out, "chat completion chunk")
        if obj is None:
            return out
        return self.on_object(message, obj)

    def on_object(self, message: Message, obj: Any) -> list[CanonicalEvent | Violation]:
        """``on_message(message)`` for a message whose data already parsed as JSON to ``obj``
        (any JSON value): the same events and violations, without parsing again."""
        if obj.__class__ is not dict:
            return [Violation(V.INVALID_EVENT, None, "chat completion chunk: data is not a JSON object")]
        whole = isinstance(message, JSONFrame)
        out: list[CanonicalEvent | Violation] = []
        self._identity(obj, out)
        if "error" in obj and obj["error"] is not None:
            out.append(error_event(None, obj["error"]))
        elif obj.get("object") == "error":
            out.append(error_event(None, obj))
        elif message.event == "error":  # llama.cpp's `error:` field, surfaced by observer.wire.sse as an event
            out.append(error_event(None, obj))
        choices = obj.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    self._choice(choice, whole, out)
                else:
                    out.append(Violation(V.INVALID_EVENT, None, "choices[] item is not an object"))
        elif choices is not None:
            out.append(Violation(V.INVALID_EVENT, None, "choices is not an array"))
        usage = obj.get("usage")
        if not isinstance(usage, dict):
            groq = obj.get("x_groq")  # Groq streams put the totals in the final chunk's x_groq.usage
            usage = groq.get("usage") if isinstance(groq, dict) else None
        read_usage(usage, CHAT_USAGE, None, out)
        if whole:
            out.append(StreamEnd(None))
        return out

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane (``StreamAdapter.fast``) for the bulk of a stream: a streamed chunk
        whose only news is choice ``c``'s text (one choice, delta keys within
        ``content``/``role``, no finish reason, usage, error or model change) is
        ``sink.text(c, "text", content)``, or nothing when its content is empty/null (no event);
        one whose only news is an argument fragment of an open tool call is ``sink.fragment``
        (``_fast_fragment``); each returns True. Anything else returns False (the general
        mapping runs). Same result as :meth:`on_message`."""
        # Subscripts inside one try: a non-dict ``obj``/``choice``, ``choices`` not exactly one
        # element, a missing key all raise (TypeError/ValueError/KeyError): general mapping.
        try:
            (choice,) = obj["choices"]
            delta = choice["delta"]
        except (KeyError, TypeError, ValueError):
            return False
        if delta.__class__ is not dict or obj.__class__ is not dict or not self._started:
            return False
        get = obj.get
        model = get("model")
        if (model != self._model and model is not None and model != "") or get("error") is not None:
            return False
        if get("usage") is not None or "x_groq" in obj or get("object") == "error":
            return False
        if choice.get("finish_reason") is not None:
            return False
        c = choice.get("index")
        if c != self._fast_choice:  # a choice not announced yet takes the general mapping
            if c not in self._choices_seen:
                return False
            self._fast_choice = c
        if c.__class__ is not int or c < 0 or c > INT64_MAX:
            return False
        if len(delta) == 1:
            content = delta.get("content")
            if content.__class__ is str:  # the commonest chunk of all: {"content": "..."}
                if content:
                    sink.text(c, "text", content, now_s)
                return True
            if "tool_calls" in delta:
                return self._fast_fragment(c, delta["tool_calls"], sink)
        for key in delta:
            if key not in _PLAIN_DELTA_KEYS:
                return False
        content = delta.get("content")
        if content.__class__ is str:
            if content:
                sink.text(c, "text", content, now_s)
            return True
        return content is None

    def _fast_fragment(self, c: int, calls: Any, sink: DeltaSink) -> bool:
        """The fast lane for a delta that only continues an open tool call: one
        ``tool_calls`` fragment with a valid ``index``, no ``id``, a ``function`` with string
        ``arguments`` and no ``name``: ``sink.fragment`` with the ``ToolCallDelta`` fields as
        ``_fragment`` makes them and True, else False."""
        if calls.__class__ is not list or len(calls) != 1:
            return False
        call = calls[0]
        if call.__class__ is not dict or call.get("id") is not None:
            return False
        index = call.get("index")
        if index.__class__ is not int or index < 0 or index > INT64_MAX:
            return False
        function = call.get("function")
        if function.__class__ is not dict or function.get("name") is not None:
            return False
        args = function.get("arguments")
        if args.__class__ is not str:
            return False
        if c == self._fast_c and index == self._fast_index:
            open_call = self._fast_call  # the same slot as last time, still open
        else:
            open_call = self._calls.get((c, index))
            if open_call is None:
                return False
            self._modern_choices.add(c)
            self._fast_c, self._fast_index, self._fast_call = c, index, open_call
        sink.fragment(None, open_call.key, index, None, None, args)
        return True

    def _identity(self, obj: dict[str, Any], out: list[Any]) -> None:
        rid, model = text(obj.get("id")), text(obj.get("model"))
        if model is None and not isinstance(obj.get("model"), str | None):
            out.append(Violation(V.INVALID_EVENT, None, f"model is not a string: {obj['model']!r:.40}"))
        if not self._started:
            if rid is not None or model is not None:
                self._started = True
                self._model = model
                out.append(StreamStart(None, model, rid))
        elif model is not None and model != self._model:
            self._model = model
            out.append(ModelEvent(None, model))
        identity(obj, None, out, self._identity_seen)

    def _choice(self, choice: dict[str, Any], whole: bool, out: list[Any]) -> None:
        c = choice.get("index")
        if not (is_int(c) and c >= 0):
            if c is not None:  # present but unusable (absent: the only choice, 0)
                out.append(Violation(V.INVALID_EVENT, None, f"choices[].index {c!r:.40} invalid: choice 0 used"))
            c = 0
        if c not in self._choices_seen and len(self._choices_seen) < MAX_CHOICES_SEEN:
            self._choices_seen.add(c)
            out.append(ChoiceOpen(None, c, c))
        body = choice.get("message" if whole else "delta")
        if isinstance(body, dict):
            self._content(c, body, out)
            calls = body.get("tool_calls")
            if isinstance(calls, list) and calls:
                self._modern_choices.add(c)
            if isinstance(calls, list):
                for pos, call in enumerate(calls):
                    if not isinstance(call, dict):
                        out.append(Violation(V.INVALID_EVENT, None, "tool_calls[] item is not an object"))
                    elif whole:
                        out.append(_complete_call(pos, call))
                    else:
                        self._fragment(c, pos, call, out)
            legacy = body.get("function_call")
            if isinstance(legacy, dict) and c not in self._modern_choices:
                name, args = text(legacy.get("name")), arguments(legacy.get("arguments"))
                if whole:
                    out.append(ToolCallEvent(None, None, None, name, args))
                else:
                    out.append(ToolCallDelta(None, f"{c}:function_call", None, None, name, args))
        raw_reason = choice.get("finish_reason")
        reason = text(raw_reason)
        if reason is not None:
            out.append(StopEvent(None, STOP_REASONS.get(reason, reason), reason, c))
        elif raw_reason is not None and not isinstance(raw_reason, str):
            out.append(Violation(V.INVALID_EVENT, None, f"finish_reason is not a string: {raw_reason!r:.40}"))

    def _content(self, c: int, body: dict[str, Any], out: list[Any]) -> None:
        reasoning = text(body.get("reasoning_content")) or text(body.get("reasoning"))
        if reasoning is not None:
            out.append(ContentDelta(None, REASONING_BLOCK + c, reasoning, "reasoning"))
        raw = body.get("content")
        content = _content_text(raw)
        if content is not None:
            out.append(ContentDelta(None, c, content, "text"))
        elif raw is not None and not isinstance(raw, (str, list)):
            out.append(Violation(V.INVALID_EVENT, None, f"content is not text: {raw!r:.40} dropped"))
        refusal = text(body.get("refusal"))
        if refusal is not None:
            out.append(ContentDelta(None, REFUSAL_BLOCK + c, refusal, "refusal"))

    def _fragment(self, c: int, pos: int, call: dict[str, Any], out: list[Any]) -> None:
        index = call.get("index")
        missing = not (is_int(index) and index >= 0)
        if missing:
            if "index" in call:  # present but not a usable index: say so for each such fragment
                out.append(
                    Violation(V.INVALID_EVENT, None, f"tool_calls[] fragment index {index!r} invalid: position used")
                )
            elif not self._index_missing_reported:  # Ollama before 0.4.7 omits it on every fragment
                self._index_missing_reported = True
                out.append(Violation(V.INVALID_EVENT, None, "tool_calls[] fragment without index: position used"))
            index = pos
        cid = call_id(call.get("id"))
        name, args = _call_body(call)
        slot = (c, index)
        open_call = self._calls.get(slot)
        if open_call is None or (cid is not None and open_call.id is not None and cid != open_call.id):
            if open_call is not None and not missing:
                out.append(
                    Violation(
                        REUSED_TOOL_INDEX,
                        None,
                        f"choice {c} tool_calls index {index}: id {cid!r} while {open_call.id!r} is open;"
                        " recorded as a separate call",
                    )
                )
            generation = self._generation[slot]
            self._generation[slot] += 1
            key = f"{c}:{index}" if generation == 0 else f"{c}:{index}:{generation}"
            open_call = self._calls[slot] = _OpenCall(key, cid)
            self._fast_c = None  # the fast lane's remembered slot may be this one
        elif open_call.id is None:
            open_call.id = cid
        out.append(ToolCallDelta(None, open_call.key, index, cid, name, args))


def _call_body(call: dict[str, Any]) -> tuple[str | None, str]:
    """(name, arguments) of a ``function`` tool call (``function.arguments``) or a ``custom``
    one (``custom.input``, free text)."""
    for key, field in (("function", "arguments"), ("custom", "input")):
        inner = call.get(key)
        if isinstance(inner, dict):
            return text(inner.get("name")), arguments(inner.get(field))
    return None, ""


def _complete_call(pos: int, call: dict[str, Any]) -> ToolCallEvent:
    name, args = _call_body(call)
    return ToolCallEvent(None, pos, call_id(call.get("id")), name, args)


def _content_text(content: Any) -> str | None:
    """``content`` as text: a string, or the ``text`` of ``{"type": "text"}`` parts (some
    compatible servers answer with a parts array)."""
    if isinstance(content, list):
        content = "".join(p["text"] for p in content if _is_text_part(p))
    return text(content)


def _is_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
