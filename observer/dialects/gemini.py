"""Google Gemini ``generateContent`` / ``streamGenerateContent`` (Gemini API and Vertex AI).

Sources: Gemini API reference "Generating content" (``models.generateContent``,
``models.streamGenerateContent``: request ``contents``, ``systemInstruction``, ``tools``,
``toolConfig``, ``safetySettings``, ``generationConfig``, ``cachedContent``; response
``GenerateContentResponse``: ``candidates[].content.parts[]``, ``finishReason``,
``promptFeedback.blockReason``, ``usageMetadata``, ``modelVersion``; ``FinishReason`` enum),
"Thinking" (``thought: true`` summary parts, ``thoughtSignature``, ``thoughtsTokenCount``),
"Function calling" (``functionCall {id?, name, args}`` parts), Vertex AI
``projects.locations.publishers.models.streamGenerateContent`` (``labels``);
vendor-wire-formats §1 and §5 (``alt=sse`` framing, JSON-array framing, reassembly rules).

Decisions (the record's conventions applied to this vendor):

- Model: from the URL path (``.../models/{model}:verb``, URL-decoded); ``modelVersion`` of the
  response gives the record's ``model`` (one ``ModelEvent`` per distinct value).
- ``stream``: true for ``:streamGenerateContent``, false for ``:generateContent``. Framing: SSE
  for ``text/event-stream`` (``alt=sse``); for JSON bodies, the elements of the streamed array
  (``:streamGenerateContent`` without ``alt=sse``) or the one response object
  (``:generateContent``).
- ``systemInstruction`` is recorded as a leading message ``{"role": "system", "parts": ...}``
  (its other fields kept); ``contents`` follow as sent. Inline data (``inlineData`` /
  ``inline_data``) loses its base64 ``data`` for ``data_bytes`` (decoded size), at any depth.
- ``parameters``: every ``generationConfig`` field under its own name, plus ``safetySettings``,
  ``toolConfig`` and ``cachedContent`` (snake-case spellings accepted and kept as sent).
  ``metadata``: Vertex ``labels``. No end-user field exists.
- Blocks: candidate ``c`` writes its answer text to block ``2c`` (``"text"``) and its thought
  summaries (``thought: true``) to block ``2c + 1`` (``"reasoning"``); empty text parts (e.g.
  carrying only a ``thoughtSignature``) are not recorded. A ``text`` that is not a string, and a
  ``usageMetadata`` token count present but not a non-negative integer, are ``invalid_event``.
- Tool calls: each ``functionCall`` part is one complete call; ``index`` is its ordinal in the
  response (0, 1, ... across chunks and candidates), ``id`` the part's ``id`` when sent (else
  ``None``), ``arguments`` the ``args`` object serialised compactly with orjson (``""`` when
  ``args`` is absent).
- Streamed function-call arguments (Gemini 3 on Vertex, ``toolConfig.functionCallingConfig.
  streamFunctionCallArguments``; vendor-wire-formats §5 "Newer Vertex option", recorded in
  vercel/ai ``packages/google/src/__fixtures__/google-stream-tool-call-arguments.chunks.txt``,
  consumed by its ``google-json-accumulator.ts``): a call opens with ``functionCall {name,
  willContinue: true}`` (optionally ``id``, ``args``, ``partialArgs``); the following nameless
  ``functionCall`` parts of the same candidate carry ``partialArgs: [{jsonPath, stringValue |
  numberValue | boolValue | nullValue, willContinue?}]``; the call is closed by a
  ``functionCall`` part without ``willContinue: true`` (the recorded streams send an empty
  ``{"functionCall": {}}``). Each value is set at its ``jsonPath`` (``$.a.b``, ``$.items[0]``,
  ``$['key']``; missing objects and arrays are created, an array index may only replace an
  element or append one) in one JSON object per open call; a ``stringValue`` sent with
  ``willContinue: true`` stays open and the next ``stringValue`` parts at the same path are
  appended to it (the recorded stream ends such a string with an empty ``stringValue``). A
  partial argument without a value is skipped. When the call closes it is recorded as ONE
  complete call (``arguments``: the assembled object serialised compactly with orjson), with
  the ``index`` (ordinal) it got when it opened. Bounds: at most ``MAX_CALL_PATHS`` values
  and ``MAX_CALL_CHARS`` characters (paths + string values) per call, paths of at most
  ``MAX_PATH_DEPTH`` segments; beyond them the data is dropped with one ``invalid_event``
  per call. An invalid or conflicting ``jsonPath`` (e.g. through a string, or an index past
  the end of its array) is an ``invalid_event`` and that value is dropped. A call still open
  when a new call of the same candidate opens, when that candidate's ``finishReason``
  arrives, or when the body ends (``on_close``) is recorded with what was assembled, plus an
  ``invalid_event`` "function call not closed". A nameless ``functionCall`` with no call
  open is not recorded.
- Stop reason: ``STOP`` -> ``end_turn``, or ``tool_use`` when that candidate produced function
  calls; ``MAX_TOKENS`` -> ``max_tokens``; any other value (``SAFETY``, ``RECITATION``,
  ``MALFORMED_FUNCTION_CALL``, ...) as sent. ``stop_reason_raw`` is always Gemini's value.
- A blocked prompt (``promptFeedback.blockReason``, no candidates) is a stop
  ``content_filter`` (raw: the block reason) ending the response, not an error: like an
  Anthropic ``refusal`` or an OpenAI ``content_filter`` finish, the exchange completed and the
  safety system's answer is the stop reason (the SDKs do not raise on it either).
- Usage: assigned from every ``usageMetadata`` that has counts (running totals; the last
  wins): input = ``promptTokenCount``, output = ``candidatesTokenCount`` +
  ``thoughtsTokenCount`` (thinking is generated output, as Anthropic and OpenAI count it);
  cached = ``cachedContentTokenCount``, reasoning = ``thoughtsTokenCount``, total =
  ``totalTokenCount``, the per-modality lists in ``details`` (``GEMINI_USAGE``).
- ``responseId`` is the ``response_id`` and Vertex's ``usageMetadata.trafficType``
  (``ON_DEMAND``, ``PROVISIONED_THROUGHPUT``: how the request was billed) the ``service_tier``
  (``ResponseIdentity``; read from the chunks that carry counts or a new id).
- Candidates (``candidateCount > 1``): each candidate is announced when first seen
  (``ChoiceOpen``) and each ``finishReason`` is a ``StopEvent`` of choice ``index`` (the
  candidate's ``index``; absent, its position in ``candidates``; present but not a non-negative
  integer, its position and an ``invalid_event``) whose text is block ``2 * index``, so the
  record's ``choices`` hold each candidate's text and stop reason (``null`` for one that never
  finished); the record's ``stop_reason`` is the last one sent (as for OpenAI's ``n``).
- An ``error`` object in a chunk is an ``ErrorEvent`` (code: its ``status``, else its numeric
  ``code`` as text).
- End: Gemini sends no end marker. ``StreamEnd`` is emitted when the body ends
  (``on_close``) if a ``finishReason`` or a ``blockReason`` was seen, so usage arriving after
  the finishing chunk still counts; a body that ends without one is ``missing_stream_end``
  (outcome ``truncated``). A stray ``data: [DONE]`` (not Gemini's) maps to nothing and is
  recorded once per stream as ``invalid_event``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote

import orjson

from observer.conversation import (
    CanonicalAttachment,
    CanonicalMessage,
    call,
    default_message,
    recorded_answer,
    result,
)
from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import (
    MAX_CHOICES_SEEN,
    Out,
    base64_decoded_size,
    not_llm_request,
    read_tools,
    vendor_object,
)
from observer.dialects.usage import UsageMap, read_usage
from observer.events import (
    ChoiceOpen,
    ContentDelta,
    ErrorEvent,
    ModelEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    ToolCallEvent,
)
from observer.records import Exchange, RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import Framing

V = ViolationKind

MODELS_SEGMENT = "/models/"
STREAM_VERB = ":streamGenerateContent"
UNARY_VERB = ":generateContent"
CONFIG_KEYS = ("generationConfig", "generation_config")
PARAMETER_KEYS = (
    "safetySettings",
    "safety_settings",
    "toolConfig",
    "tool_config",
    "cachedContent",
    "cached_content",
)
INLINE_KEYS = frozenset({"inlineData", "inline_data"})
DECLARATION_KEYS = ("functionDeclarations", "function_declarations")
STOP_REASONS = {"STOP": "end_turn", "MAX_TOKENS": "max_tokens"}
MAX_CALL_PATHS = 1000  # values set per streamed call (string continuations not counted)
MAX_CALL_CHARS = 8 << 20  # jsonPath + stringValue characters per streamed call
MAX_PATH_DEPTH = 64  # segments of one jsonPath (orjson serialises at most 255 levels)
NOT_CLOSED = "function call not closed"
# one jsonPath segment after "$": .name | [index] | ['key'] / ["key"]
PATH_SEGMENT = re.compile(r"\.([^.\[\]]+)|\[(\d{1,9})\]|\[(['\"])(.*?)\3\]", re.S)


class GeminiDialect(DialectBase):
    """Gemini ``POST .../models/{model}:streamGenerateContent`` and ``:generateContent`` (Gemini
    API ``/v1beta/models/...``, ``/v1/models/...``; Vertex
    ``/v1/projects/{p}/locations/{l}/publishers/google/models/{model}:...``)."""

    name = "gemini"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and path_model(unquote(request.path_only)) is not None

    def framing(self, spec: ResponseSpec) -> Framing | None:
        """SSE for ``text/event-stream``; for JSON, a streamed array (``stream``) or one object."""
        response_media_type = spec.media_type
        if response_media_type == "text/event-stream":
            return Framing.SSE
        if response_media_type == "application/json" or response_media_type.endswith("+json"):
            return Framing.JSON_ARRAY if spec.request_stream else Framing.JSON
        return None

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        """Reads a ``GenerateContentRequest`` (see the module docstring for what goes where).
        Shape (else ``not_llm_request``, metadata only): a JSON object with a ``contents`` array.
        Other problems are ``invalid_request`` violations. Never raises."""
        doc, why = vendor_object(body)
        if doc is None:
            return not_llm_request(body, why)
        if not isinstance(doc.get("contents"), list):
            return not_llm_request(body, "no contents array")
        facts = RequestFacts(body_bytes=len(body))
        violations: list[Violation] = []
        if request is not None:
            path = unquote(request.path_only)
            facts.model = path_model(path)
            facts.stream = path.endswith(STREAM_VERB) if facts.model is not None else None
        facts.messages = _messages(doc, violations)
        _tools(doc, facts, violations)
        facts.parameters = _parameters(doc, violations)
        labels = doc.get("labels")
        if isinstance(labels, dict):
            facts.metadata = labels
        elif labels is not None:
            violations.append(Violation(V.INVALID_REQUEST, None, "labels is not an object"))
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> GeminiAdapter:
        return GeminiAdapter()

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        """The contents in canonical form (``observer.conversation``), the recorded leading
        ``systemInstruction`` first: role ``model`` is ``assistant`` (an absent role ``user``);
        ``text`` parts joined, except thought summaries (``thought: true``);
        ``functionCall`` parts as calls (optional ``id``, ``name``, ``args``),
        ``functionResponse`` parts as results (``id``, ``response`` as JSON); ``inlineData`` /
        ``fileData`` as attachments (media type, ``data_bytes``, ``fileUri``). Snake-case
        spellings are read too; ``thoughtSignature`` and other parts are left out. The SDK's
        streamed history (one ``model`` content per chunk) merges into one assistant message."""
        return [_history_content(c) for c in request.messages]

    def answer_message(self, exchange: Exchange) -> CanonicalMessage | None:
        """The default answer (text and tool calls), or ``None`` when the request asked for
        more than one candidate (``candidateCount``): which one the client keeps is unknown."""
        count = exchange.request.parameters.get("candidateCount", exchange.request.parameters.get("candidate_count"))
        if isinstance(count, int) and count > 1:
            return None
        return recorded_answer(exchange)


def path_model(path: str) -> str | None:
    """The model of a URL-decoded ``.../models/{model}:(stream)GenerateContent`` path, else
    ``None``."""
    if not path.endswith((STREAM_VERB, UNARY_VERB)):
        return None
    head, sep, tail = path.rpartition(MODELS_SEGMENT)
    model = tail.rpartition(":")[0]
    if not sep or not model or "/" in model:
        return None
    return model


def _messages(doc: dict[str, Any], violations: list[Violation]) -> list[Any]:
    out: list[Any] = []
    system = doc.get("systemInstruction", doc.get("system_instruction"))
    if isinstance(system, dict):
        out.append({**strip_inline_data(system), "role": "system"})
    elif system is not None:
        violations.append(Violation(V.INVALID_REQUEST, None, "systemInstruction is not an object"))
    contents = doc.get("contents")
    if isinstance(contents, list):
        bad = sum(1 for c in contents if not isinstance(c, dict) or not isinstance(c.get("parts"), list))
        if bad:
            violations.append(Violation(V.INVALID_REQUEST, None, f"{bad} content(s) without an object and parts"))
        out.extend(strip_inline_data(c) for c in contents)
    return out


def _history_content(c: Any) -> CanonicalMessage:
    if not isinstance(c, dict):
        return default_message(c)
    role = c.get("role")
    role = "assistant" if role == "model" else role if isinstance(role, str) else "user"
    texts, calls, results, attachments = [], [], [], []
    parts = c.get("parts")
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict) or part.get("thought") is True:
            continue
        fn = _spelled(part, "functionCall", "function_call", dict)
        response = _spelled(part, "functionResponse", "function_response", dict)
        blob = _spelled(part, "inlineData", "inline_data", dict) or _spelled(part, "fileData", "file_data", dict)
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif fn is not None:
            calls.append(call(fn.get("id"), fn.get("name"), fn.get("args")))
        elif response is not None:
            results.append(result(response.get("id"), response.get("response")))
        elif blob is not None:
            size = blob.get("data_bytes")
            attachments.append(
                CanonicalAttachment(
                    _spelled(blob, "mimeType", "mime_type", str),
                    size if isinstance(size, int) and not isinstance(size, bool) else None,
                    _spelled(blob, "fileUri", "file_uri", str),
                )
            )
    return CanonicalMessage(role, "".join(texts), tuple(calls), tuple(results), tuple(attachments))


def _spelled(obj: dict[str, Any], camel: str, snake: str, kind: type) -> Any:
    """``obj[camel]``, else ``obj[snake]`` (the API reads both spellings), if it is a ``kind``;
    else ``None``."""
    value = obj.get(camel, obj.get(snake))
    return value if isinstance(value, kind) else None


def _tools(doc: dict[str, Any], facts: RequestFacts, violations: list[Violation]) -> None:
    """``tools: [{functionDeclarations: [{name, description, parameters}]}, {googleSearch: {}}, ...]``;
    only function declarations have names a ``functionCall`` can use."""
    facts.tools = read_tools(doc, "tools", violations)
    for tool in facts.tools:
        for key in DECLARATION_KEYS:
            decls = tool.get(key)
            for decl in decls if isinstance(decls, list) else ():
                if isinstance(decl, dict) and isinstance(decl.get("name"), str):
                    facts.tool_names.append(decl["name"])


def _parameters(doc: dict[str, Any], violations: list[Violation]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for key in CONFIG_KEYS:
        config = doc.get(key)
        if isinstance(config, dict):
            params.update(config)
        elif config is not None:
            violations.append(Violation(V.INVALID_REQUEST, None, f"{key} is not an object"))
    params.update({k: doc[k] for k in PARAMETER_KEYS if k in doc})
    return params


def strip_inline_data(value: Any) -> Any:
    """``value`` with the base64 ``data`` of every ``inlineData``/``inline_data`` blob (at any
    depth, e.g. inside ``functionResponse.parts``) replaced by ``data_bytes`` (decoded size in
    bytes); everything else returned as sent."""
    if isinstance(value, list):
        return [strip_inline_data(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in INLINE_KEYS and isinstance(item, dict) and isinstance(item.get("data"), str):
            blob = {k: v for k, v in item.items() if k != "data"}
            blob["data_bytes"] = base64_decoded_size(item["data"])
            out[key] = blob
        else:
            out[key] = strip_inline_data(item)
    return out


class GeminiAdapter(AdapterBase):
    """Maps ``GenerateContentResponse`` objects (SSE ``data``, JSON-array elements, or one whole
    JSON body — an array body is read element by element) onto canonical events; see the
    module docstring for the mapping. Checks: invalid JSON (``invalid_json``), a message that is
    not a JSON object (``invalid_event``)."""

    def __init__(self) -> None:
        self._model: str | None = None
        self._response_id: str | None = None  # the last responseId given (ResponseIdentity)
        self._finished = False  # a finishReason or blockReason was seen
        self._calls = 0  # function calls so far (their ordinal)
        self._calls_by_candidate: Counter[int] = Counter()
        self._done_seen = False
        self._open: dict[int, _StreamedCall] = {}  # streamed-arguments call open per candidate
        # Candidates announced (``ChoiceOpen``, at most MAX_CHOICES_SEEN); the fast lane's last one.
        self._choices_seen: set[int] = set()
        self._fast_choice = -1

    def on_message(self, message: Message) -> Out:
        if message.data.strip() == "[DONE]":
            return self._done_marker()
        try:
            obj = orjson.loads(message.data)
        except orjson.JSONDecodeError as exc:
            return [Violation(V.INVALID_JSON, None, f"response chunk: {exc}")]
        return self.on_object(message, obj)

    def on_object(self, message: Message, obj: Any) -> Out:
        """``on_message(message)`` for a message whose data already parsed as JSON to ``obj``
        (any JSON value): the same events and violations, without parsing again."""
        out: Out = []
        for item in obj if isinstance(obj, list) else [obj]:
            if isinstance(item, dict):
                self._response(item, out)
            else:
                out.append(Violation(V.INVALID_EVENT, None, "response chunk is not a JSON object"))
        return out

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane (``StreamAdapter.fast``): a response chunk whose only news is one text
        part of one candidate (no error, finish reason, function call, usage counts, prompt
        feedback or model change) is ``sink.text(block, "text"|"reasoning", text)``, or nothing
        for empty text (no event); one whose only news is a piece of a streamed function-call
        argument string is kept by the adapter (``_fast_call``, no event); each returns True.
        Anything else returns False (the general mapping runs). Same result as
        :meth:`on_message`."""
        # Subscripts inside one try: a non-dict ``obj``/candidate/``content``, ``candidates`` or
        # ``parts`` not exactly one element, a missing key all raise: general mapping.
        try:
            (cand,) = obj["candidates"]
            (part,) = cand["content"]["parts"]
        except (KeyError, TypeError, ValueError):
            return False
        if part.__class__ is not dict or obj.__class__ is not dict:
            return False
        get = obj.get
        if get("error").__class__ is dict:
            return False
        model = get("modelVersion")
        if model.__class__ is str and model and model != self._model:
            return False
        rid = get("responseId")
        if rid is not None and rid != self._response_id:
            return False
        meta = get("usageMetadata")
        if meta.__class__ is dict and not _COUNT_KEYS.isdisjoint(meta):
            return False  # counts (even null ones): the general path decides on a UsageEvent
        if cand.get("finishReason") is not None:
            return False
        index = cand.get("index")
        if index is None:
            index = 0
        elif index.__class__ is not int or not 0 <= index < 2**31:
            return False
        if index != self._fast_choice:  # a candidate not announced yet takes the general mapping
            if index not in self._choices_seen:
                return False
            self._fast_choice = index
        call = part.get("functionCall")
        if call is not None:
            return self._fast_call(index, part, call)
        text = part.get("text")
        if text.__class__ is not str:
            return False
        if not text:
            return True
        if part.get("thought") is True:
            sink.text(2 * index + 1, "reasoning", text, now_s)
        else:
            sink.text(2 * index, "text", text, now_s)
        return True

    def _fast_call(self, index: int, part: dict[str, Any], call: Any) -> bool:
        """The fast lane for a part that only continues the string being streamed into the open
        call of candidate ``index``: a nameless ``functionCall`` with ``willContinue: true`` and
        one ``partialArgs`` entry with the same ``jsonPath`` string as the value it continues, a
        string ``stringValue`` and ``willContinue: true``, within the call's caps, and no text
        in the part. Appends the piece as ``_StreamedCall.add`` would and returns True (no
        event); anything else False with nothing changed."""
        if call.__class__ is not dict or call.get("name") is not None or call.get("willContinue") is not True:
            return False
        streamed = self._open.get(index)
        if streamed is None or streamed.capped:
            return False
        partial = call.get("partialArgs")
        if partial.__class__ is not list or len(partial) != 1:
            return False
        arg = partial[0]
        if arg.__class__ is not dict or arg.get("willContinue") is not True:
            return False
        value = arg.get("stringValue")
        path = arg.get("jsonPath")
        if value.__class__ is not str or path.__class__ is not str or path != streamed.open_src:
            return False
        text = part.get("text")
        if text.__class__ is str and text:
            return False
        size = len(path) + len(value)
        if streamed.chars + size > MAX_CALL_CHARS:
            return False
        streamed.chars += size
        streamed.open_parts.append(value)
        return True

    def _done_marker(self) -> Out:
        if self._done_seen:
            return []
        self._done_seen = True
        return [Violation(V.INVALID_EVENT, None, "data [DONE] is not a Gemini response (a proxy's terminator)")]

    def on_close(self) -> Out:
        out: Out = []
        for candidate in sorted(self._open):
            self._close(candidate, out, NOT_CLOSED)
        if self._finished:
            out.append(StreamEnd(None))
        return out

    def _response(self, obj: dict[str, Any], out: Out) -> None:
        err = obj.get("error")
        if isinstance(err, dict):
            out.append(_error(err))
        model = obj.get("modelVersion")
        if isinstance(model, str) and model and model != self._model:
            self._model = model
            out.append(ModelEvent(None, model))
        rid = obj.get("responseId")
        if isinstance(rid, str) and rid and rid != self._response_id:
            self._response_id = rid
            out.append(ResponseIdentity(None, response_id=rid))
        candidates = obj.get("candidates")
        if isinstance(candidates, list) and candidates:
            for position, candidate in enumerate(candidates):
                if isinstance(candidate, dict):
                    self._candidate(position, candidate, out)
        else:
            self._prompt_feedback(obj.get("promptFeedback"), out)
        _usage(obj.get("usageMetadata"), out)

    def _candidate(self, position: int, cand: dict[str, Any], out: Out) -> None:
        index = cand.get("index")
        if not (isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 2**31):
            if index is not None:  # present but unusable (absent: its position, as the API numbers them)
                detail = f"candidates[].index {index!r:.40} invalid: its position {position} used"
                out.append(Violation(V.INVALID_EVENT, None, detail))
            index = position
        if index not in self._choices_seen and len(self._choices_seen) < MAX_CHOICES_SEEN:
            self._choices_seen.add(index)
            out.append(ChoiceOpen(None, index, 2 * index))
        content = cand.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if isinstance(part, dict):
                self._part(index, part, out)
        reason = cand.get("finishReason")
        if isinstance(reason, str):
            if index in self._open:
                self._close(index, out, NOT_CLOSED)
            self._finished = True
            canonical = STOP_REASONS.get(reason, reason)
            if reason == "STOP" and self._calls_by_candidate[index]:
                canonical = "tool_use"
            out.append(StopEvent(None, canonical, reason, index, 2 * index))

    def _part(self, candidate: int, part: dict[str, Any], out: Out) -> None:
        text = part.get("text")
        if isinstance(text, str) and text:
            if part.get("thought") is True:
                out.append(ContentDelta(None, 2 * candidate + 1, text, "reasoning"))
            else:
                out.append(ContentDelta(None, 2 * candidate, text, "text"))
        elif text is not None and not isinstance(text, str):
            out.append(Violation(V.INVALID_EVENT, None, f"part text is not a string: {text!r:.40} dropped"))
        call = part.get("functionCall")
        if isinstance(call, dict):
            self._function_call(candidate, call, out)

    def _function_call(self, candidate: int, call: dict[str, Any], out: Out) -> None:
        """A classic complete ``functionCall`` part, or one part of a streamed-arguments call
        (see the module docstring)."""
        name, cid = call.get("name"), call.get("id")
        cid = cid if isinstance(cid, str) else None
        more = call.get("willContinue") is True
        if isinstance(name, str):
            if candidate in self._open:
                self._close(candidate, out, NOT_CLOSED)
            args = call.get("args")
            if not more and call.get("partialArgs") is None:
                arguments = "" if args is None else orjson.dumps(args).decode()
                out.append(ToolCallEvent(None, self._calls, cid, name, arguments))
                self._calls += 1
                self._calls_by_candidate[candidate] += 1
                return
            self._open[candidate] = _StreamedCall(self._calls, cid, name, dict(args) if isinstance(args, dict) else {})
            self._calls += 1
            self._calls_by_candidate[candidate] += 1
        elif candidate not in self._open:
            return  # a continuation with no call open: not recorded
        streamed = self._open[candidate]
        partial = call.get("partialArgs")
        if isinstance(partial, list):
            for arg in partial:
                if isinstance(arg, dict):
                    streamed.add(arg, out)
        elif partial is not None:
            out.append(Violation(V.INVALID_EVENT, None, "functionCall.partialArgs is not an array"))
        if not more:
            self._close(candidate, out)

    def _close(self, candidate: int, out: Out, problem: str | None = None) -> None:
        streamed = self._open.pop(candidate)
        out.append(streamed.event())
        if problem is not None:
            out.append(Violation(V.INVALID_EVENT, None, f"{problem}: {streamed.name}"))

    def _prompt_feedback(self, feedback: Any, out: Out) -> None:
        reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
        if not isinstance(reason, str):
            return
        self._finished = True
        out.append(StopEvent(None, "content_filter", reason))


def parse_json_path(path: str) -> list[str | int] | None:
    """The segments of a ``partialArgs`` ``jsonPath`` (``$.a.b[0]['c d']`` -> ``["a", "b", 0,
    "c d"]``), or ``None`` when it is not such a path below the root."""
    if not path.startswith("$"):
        return None
    segments: list[str | int] = []
    pos = 1
    while pos < len(path):
        match = PATH_SEGMENT.match(path, pos)
        if match is None:
            return None
        name, index, _, quoted = match.groups()
        segments.append(name if name is not None else int(index) if index is not None else quoted)
        pos = match.end()
    return segments or None


def _partial_value(arg: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, value)`` for the first value a partial argument carries, else ``(False, None)``."""
    string = arg.get("stringValue")
    if isinstance(string, str):
        return True, string
    number = arg.get("numberValue")
    if isinstance(number, int | float) and not isinstance(number, bool):
        return True, number
    flag = arg.get("boolValue")
    if isinstance(flag, bool):
        return True, flag
    if "nullValue" in arg:
        return True, None
    return False, None


def _set_path(root: dict[str, Any], segments: list[str | int], value: Any) -> bool:
    """Sets ``value`` at ``segments`` below ``root``, creating missing (or ``null``) objects and
    arrays; ``False`` when the path runs through a value of another kind or an array index is
    past the end of its array (nothing is changed then, except containers created on the way)."""
    node: Any = root
    for depth, segment in enumerate(segments):
        last = depth == len(segments) - 1
        if isinstance(segment, int):
            if not isinstance(node, list) or segment > len(node):
                return False
        elif not isinstance(node, dict):
            return False
        if last:
            if isinstance(node, list) and segment == len(node):
                node.append(value)
            else:
                node[segment] = value
            return True
        child = node[segment] if (segment < len(node) if isinstance(node, list) else segment in node) else None
        if child is None:
            child = [] if isinstance(segments[depth + 1], int) else {}
            if isinstance(node, list) and segment == len(node):
                node.append(child)
            else:
                node[segment] = child
        node = child
    return False


@dataclass
class _StreamedCall:
    """One streamed-arguments function call being assembled (see the module docstring)."""

    index: int
    id: str | None
    name: str
    args: dict[str, Any]
    values: int = 0
    chars: int = 0
    capped: bool = False
    open_path: list[str | int] | None = None  # the string still being continued
    open_parts: list[str] = field(default_factory=list)
    open_src: str | None = None  # the jsonPath string that set open_path (for the fast lane)

    def add(self, arg: dict[str, Any], out: Out) -> None:
        path = arg.get("jsonPath")
        has_value, value = _partial_value(arg)
        if not isinstance(path, str) or not has_value or self.capped:
            return
        segments = parse_json_path(path)
        if segments is None or len(segments) > MAX_PATH_DEPTH:
            out.append(Violation(V.INVALID_EVENT, None, f"partialArgs jsonPath not supported: {path[:100]!r}"))
            return
        size = len(path) + (len(value) if isinstance(value, str) else 0)
        continuing = isinstance(value, str) and segments == self.open_path
        if self.chars + size > MAX_CALL_CHARS or (not continuing and self.values >= MAX_CALL_PATHS):
            self.capped = True
            out.append(
                Violation(
                    V.INVALID_EVENT,
                    None,
                    f"function call {self.name}: arguments beyond {MAX_CALL_PATHS} values or "
                    f"{MAX_CALL_CHARS} chars dropped",
                )
            )
            return
        self.chars += size
        if continuing:
            self.open_parts.append(value)
        else:
            self._flush()
            self.values += 1
            if not _set_path(self.args, segments, value):
                detail = f"partialArgs jsonPath conflicts with earlier values: {path[:100]!r}"
                out.append(Violation(V.INVALID_EVENT, None, detail))
                return
            if isinstance(value, str):
                self.open_path, self.open_parts, self.open_src = segments, [value], path
        if isinstance(value, str) and arg.get("willContinue") is not True:
            self._flush()

    def _flush(self) -> None:
        """Writes the string being continued, joined, at its path."""
        if self.open_path is not None:
            _set_path(self.args, self.open_path, "".join(self.open_parts))
            self.open_path, self.open_parts, self.open_src = None, [], None

    def event(self) -> ToolCallEvent:
        self._flush()
        try:
            arguments = orjson.dumps(self.args).decode()
        except orjson.JSONEncodeError:  # not reachable with values from orjson.loads; kept total
            arguments = ""
        return ToolCallEvent(None, self.index, self.id, self.name, arguments)


def _error(err: dict[str, Any]) -> ErrorEvent:
    status, code, text = err.get("status"), err.get("code"), err.get("message")
    if isinstance(status, str):
        code_text: str | None = status
    elif isinstance(code, int) and not isinstance(code, bool):
        code_text = str(code)
    else:
        code_text = None
    return ErrorEvent(None, code_text, text if isinstance(text, str) else None)


def _count(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


#: ``GenerateContentResponse.usageMetadata`` (Gemini API reference, "UsageMetadata"):
#: ``promptTokenCount`` (cached content included), ``cachedContentTokenCount``,
#: ``candidatesTokenCount``, ``thoughtsTokenCount``, ``toolUsePromptTokenCount``,
#: ``totalTokenCount``, per-modality ``promptTokensDetails`` / ``cacheTokensDetails`` /
#: ``candidatesTokensDetails`` / ``toolUsePromptTokensDetails`` (``[{modality, tokenCount}]``).
GEMINI_USAGE = UsageMap(
    input=("promptTokenCount",),
    output=("candidatesTokenCount",),
    cache_read=("cachedContentTokenCount",),
    reasoning=("thoughtsTokenCount",),
    total=("totalTokenCount",),
    modalities=(
        ("input", "promptTokensDetails"),
        ("cache_read", "cacheTokensDetails"),
        ("output", "candidatesTokensDetails"),
        ("tool_use_prompt", "toolUsePromptTokensDetails"),
    ),
    named=(("input", "tool_use_prompt", "toolUsePromptTokenCount"),),
)
#: The ``usageMetadata`` keys ``GEMINI_USAGE`` reads (a chunk with one of them leaves the fast lane).
_COUNT_KEYS = frozenset(
    {
        path.split(".")[0]
        for paths in (GEMINI_USAGE.input, GEMINI_USAGE.output, GEMINI_USAGE.cache_read, GEMINI_USAGE.reasoning)
        + (GEMINI_USAGE.total,)
        for path in paths
    }
    | {path for _, path in GEMINI_USAGE.modalities}
    | {path for _, _, path in GEMINI_USAGE.named}
)


def _usage(meta: Any, out: Out) -> None:
    """``usageMetadata`` running totals -> one ``UsageEvent`` (``GEMINI_USAGE``) when it has
    any count; a count present but not a non-negative integer is an ``invalid_event``. The
    output count is ``candidatesTokenCount`` plus ``thoughtsTokenCount`` (either alone when the
    other is absent): Gemini bills thinking as output and its candidates count leaves it out,
    while OpenAI's ``completion_tokens`` includes reasoning; ``reasoning_output_tokens`` is the
    thoughts count as sent."""
    if isinstance(meta, dict) and isinstance(meta.get("trafficType"), str) and meta["trafficType"]:
        out.append(ResponseIdentity(None, service_tier=meta["trafficType"]))
    found: Out = []
    event = read_usage(meta, GEMINI_USAGE, None, found, where="usageMetadata")
    if event is not None:
        candidates, thoughts = event.output_tokens, event.reasoning_output_tokens
        output = None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0)
        found = [replace(event, output_tokens=output) if item is event else item for item in found]
    out.extend(found)
