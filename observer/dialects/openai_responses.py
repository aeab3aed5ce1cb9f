"""OpenAI Responses (``POST …/responses``): OpenAI ``/v1/responses``, Azure
``/openai/v1/responses`` and Responses-compatible servers.

Sources: OpenAI API reference "Responses" (create request: ``input``, ``instructions``, flat
``{type:"function", name}`` tools; the ``response`` object: ``status``, ``output`` items
``message``/``reasoning``/``function_call``/``custom_tool_call``, ``usage``,
``incomplete_details``, ``error``) and "Streaming events" (``response.created`` …
``response.completed``/``incomplete``/``failed``, ``error``, ``sequence_number``);
vendor-wire-formats §1 and §3 (recorded order, ``call_id`` vs item ``id``, terminal events).

Stop reasons (no vendor field; derived from the terminal status, draft §5.3 names where exact):

=============================================  ===================  ==============================
terminal                                        canonical            ``stop_reason_raw``
=============================================  ===================  ==============================
``completed``, no function/custom tool call     ``end_turn``         ``completed``
``completed`` with a tool call                  ``tool_use``         ``completed``
``incomplete``, reason ``max_output_tokens``    ``max_tokens``       ``incomplete:max_output_tokens``
``incomplete``, reason ``content_filter``       ``content_filter``   ``incomplete:content_filter``
``incomplete``, other reason ``r``              ``r``                ``incomplete:r``
``cancelled`` (non-streaming object)            ``cancelled``        ``cancelled``
``failed``                                      (none: ``ErrorEvent`` from ``response.error``)
=============================================  ===================  ==============================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from observer.conversation import CanonicalMessage, call, content_parts, result
from observer.dialects._openai_common import (
    RESPONSES_USAGE,
    SequenceCheck,
    arguments,
    call_id,
    error_event,
    identity,
    read_envelope,
    reduce_binary,
    text,
)
from observer.dialects.base import AdapterBase, DeltaSink, DialectBase, Message, RequestView
from observer.dialects.toolkit import INT64_MAX, is_int, load_object, not_llm_request, read_tools
from observer.dialects.usage import read_usage
from observer.events import (
    CanonicalEvent,
    ContentDelta,
    ModelEvent,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
)
from observer.records import RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import JSONFrame

V = ViolationKind
INCOMPLETE_REASONS = {"max_output_tokens": "max_tokens", "content_filter": "content_filter"}
_OWN_FIELDS = ("input",)
# Tool-call item types recorded as tool calls: item type -> field holding the arguments.
_CALL_ITEMS = {"function_call": "arguments", "custom_tool_call": "input"}
# Text-bearing delta events: event type -> (block family, sub-index field, block type).
_DELTAS = {
    "response.output_text.delta": ("text", "content_index", "text"),
    "response.refusal.delta": ("refusal", "content_index", "refusal"),
    "response.reasoning_summary_text.delta": ("summary", "summary_index", "reasoning"),
    "response.reasoning_text.delta": ("reasoning", "content_index", "reasoning"),
}
# Their ``.done`` events: event type -> (block family, sub-index field, block type, text field).
_DONES = {
    "response.output_text.done": ("text", "content_index", "text", "text"),
    "response.refusal.done": ("refusal", "content_index", "refusal", "refusal"),
    "response.reasoning_summary_text.done": ("summary", "summary_index", "reasoning", "text"),
    "response.reasoning_text.done": ("reasoning", "content_index", "reasoning", "text"),
}
# Content parts of output items: (item type, parts field) -> part type -> (family, block type, text field).
_PARTS = {
    ("message", "content"): {"output_text": ("text", "text", "text"), "refusal": ("refusal", "refusal", "refusal")},
    ("reasoning", "summary"): {"summary_text": ("summary", "reasoning", "text")},
    ("reasoning", "content"): {"reasoning_text": ("reasoning", "reasoning", "text")},
}


class OpenAIResponsesDialect(DialectBase):
    """OpenAI Responses: any ``POST`` whose path (query excluded) ends in ``/responses``
    (``/v1/responses``, Azure ``/openai/v1/responses``); not by host. Responses: SSE
    (``text/event-stream``) or one ``response`` object (``application/json``)."""

    name = "openai.responses"

    def matches(self, request: RequestView) -> bool:
        return request.method.upper() == "POST" and request.path_only.rstrip("/").endswith("/responses")

    def parse_request(self, body: bytes, request: RequestView | None = None) -> tuple[RequestFacts, list[Violation]]:
        """Reads a Responses request body.

        - ``messages``: ``input`` — a string becomes ``[{"role": "user", "content": input}]``;
          an item list is kept as sent (messages, ``function_call_output``, ``reasoning``, …)
          with inline binary payloads reduced to ``data_bytes``.
        - ``instructions`` stays in ``parameters`` under its own name (not turned into a system
          message: Responses keeps it apart from ``input`` and does not carry it over with
          ``previous_response_id``), like every other top-level key not recorded elsewhere
          (temperature, top_p, max_output_tokens, reasoning, text, tool_choice,
          parallel_tool_calls, store, previous_response_id, include, truncation, …).
        - ``tools`` as sent; ``tool_names`` from the flat ``name`` of ``function`` and
          ``custom`` tools (built-in tools such as ``web_search`` have no name).
        - ``stream`` absent means ``False``; ``metadata``; ``end_user``: ``safety_identifier``
          else ``user``.
        Shape (else ``not_llm_request``, metadata only): a JSON object with a string ``model``
        (or a stored ``prompt`` object) whose ``input``, when present, is a string or an array.
        Other problems are ``invalid_request`` violations. Never raises.
        """
        doc, facts, violations = read_envelope(body, _OWN_FIELDS)
        if doc is None:
            return facts, violations
        if facts.model is None and not isinstance(doc.get("prompt"), dict):
            return not_llm_request(body, "no model string")
        given = doc.get("input")
        if isinstance(given, str):
            facts.messages = [{"role": "user", "content": given}]
        elif isinstance(given, list):
            facts.messages = [reduce_binary(item) for item in given]
        elif given is not None:
            return not_llm_request(body, "input is neither a string nor an array")
        facts.tools = read_tools(doc, "tools", violations)
        facts.tool_names = [
            t["name"] for t in facts.tools if t.get("type") in ("function", "custom") and text(t.get("name"))
        ]
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> OpenAIResponsesAdapter:
        return OpenAIResponsesAdapter()

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        """The input items in canonical form (``observer.conversation``), after ``instructions``
        (from ``parameters``) as a leading system message: message items by role (text of
        ``input_text``/``output_text`` parts, image and file parts as attachments); a
        ``function_call``/``custom_tool_call`` item is an assistant message with that call
        (``call_id`` kept: the API makes clients echo it; consecutive assistant items merge into
        one), a ``*_call_output`` item a tool message with its result. ``reasoning``,
        ``item_reference`` and built-in tool items are left out (what a client resends of them
        is encrypted or a reference; the record holds no such answer part)."""
        out: list[CanonicalMessage] = []
        instructions = request.parameters.get("instructions")
        if isinstance(instructions, str) and instructions.strip():
            out.append(CanonicalMessage("system", instructions))
        for item in request.messages:
            message = _history_item(item)
            if message is not None:
                out.append(message)
        return out


@dataclass(slots=True)
class _Call:
    key: str
    index: int | None
    has_arguments: bool = False


class OpenAIResponsesAdapter(AdapterBase):
    """Maps Responses streaming events (SSE, ``event:`` = JSON ``type``) or one ``response``
    object (whole-body JSON) onto canonical events. ``seq`` = the event's ``sequence_number``.

    - Checks: ``sequence_number`` gaps and repeats (``_openai_common.SequenceCheck``); an
      ``event:`` field differing from the JSON ``type`` is ``type_mismatch``. Unknown event
      types and item types (web_search_call, mcp_call, code_interpreter, image_generation, …)
      are ignored; a ``[DONE]`` sentinel (some compatible servers) too.
    - ``response.created`` / ``in_progress`` / ``queued``: ``StreamStart`` (model,
      ``request_id`` = response id) once, later ``ModelEvent`` when the model changes.
    - Text: ``output_text`` / ``refusal`` / ``reasoning_summary_text`` / ``reasoning_text``
      deltas; one block per (kind, ``output_index``, ``content_index`` or ``summary_index``),
      numbered 0, 1, 2, … in order of first appearance; types ``text`` / ``refusal`` /
      ``reasoning``.
    - Tool calls: a ``function_call`` (or ``custom_tool_call``) item opened by
      ``response.output_item.added`` is one ``ToolCallDelta`` key (the item id): id = ``call_id``
      (what follow-up requests use, not the item id), name, index = ``output_index``; argument
      deltas (``function_call_arguments.delta``, ``custom_tool_call_input.delta``) keyed by
      ``item_id``. Custom tool input is free text, recorded as sent.
    - ``.done`` events, ``response.output_item.done`` and the terminal ``response.output`` only
      fill what no delta carried (a block or call with no deltas at all). An
      ``output_item.done`` for an item that nothing before named (no ``output_item.added``, no
      text or argument event at its ``output_index``, else item ``id``) is
      ``block_not_started``; its content is still filled in.
    - Terminal events ``response.completed`` / ``incomplete`` / ``failed``: ``StopEvent``
      (module table) or ``ErrorEvent`` (``response.error``), ``UsageEvent`` from
      ``response.usage`` (``_openai_common.RESPONSES_USAGE``: input, output, cached, reasoning,
      total, details), then ``StreamEnd``. Every ``response`` snapshot's ``id`` (``resp_…``),
      ``service_tier`` and ``system_fingerprint`` -> ``ResponseIdentity`` (the final one's tier
      is the tier that served).
    - ``error`` event: ``ErrorEvent`` (code = ``code`` else ``type``; top-level or nested under
      ``error``); not terminal: without a terminal event the stream lacks its end.
    """

    def __init__(self) -> None:
        self._seq = SequenceCheck()
        self._started = False
        self._model: str | None = None
        self._blocks: dict[tuple[str, Any, Any], int] = {}
        self._filled: set[tuple[str, Any, Any]] = set()
        self._calls: dict[str, _Call] = {}
        self._call_at: dict[int, str] = {}  # output_index -> call key
        self._added: set[Any] = set()  # output_index (else item id) of each output_item.added
        self._tool_use = False
        # The fast lane's memory of the last text delta's block: its ``output_index`` (a valid
        # int) and ``content_index`` as sent, and the block index they map to (a delta with
        # equal values has an equal key, already in ``_filled``); and of the last argument
        # delta's ``item_id`` (a str found in ``_calls``) with its call.
        self._fast_where: int | None = None
        self._fast_ci: Any = None
        self._fast_block = -1
        self._fast_item: str | None = None
        self._fast_call: _Call | None = None

    def on_lost(self) -> None:
        self._seq.lost()

    def on_message(self, message: Message) -> list[CanonicalEvent | Violation]:
        data = message.data.strip()
        if not data or data == "[DONE]":
            return []
        out: list[CanonicalEvent | Violation] = []
        obj = load_object(data, out, f"event {message.event or 'message'!r}")
        if obj is None:
            self._seq.lost()
            return out
        return self._object(message, obj, out)

    def on_object(self, message: Message, obj: Any) -> list[CanonicalEvent | Violation]:
        """``on_message(message)`` for a message whose data already parsed as JSON to ``obj``
        (any JSON value): the same events and violations, without parsing again."""
        out: list[CanonicalEvent | Violation] = []
        if obj.__class__ is not dict:
            out.append(
                Violation(V.INVALID_EVENT, None, f"event {message.event or 'message'!r}: data is not a JSON object")
            )
            self._seq.lost()
            return out
        return self._object(message, obj, out)

    def fast(self, event: bytes | None, obj: Any, sink: DeltaSink, now_s: float) -> bool:
        """The fast lane (``StreamAdapter.fast``): a ``response.output_text.delta`` (no SSE
        ``event`` or the same name) with an acceptable ``sequence_number`` and a string
        ``delta`` is ``sink.text(block, "text", delta)``, or nothing when the delta is empty (no
        event); an argument delta (``function_call_arguments``/``custom_tool_call_input``) of
        an open call is ``sink.fragment`` with the ``ToolCallDelta`` fields; each after the same
        state update as :meth:`on_message`, returning True. Anything else returns False
        (nothing changed: the general mapping runs)."""
        if obj.__class__ is not dict:
            return False
        get = obj.get
        etype = get("type")
        if etype.__class__ is not str:
            return False
        if etype == "response.output_text.delta":
            if event and event != b"response.output_text.delta":
                return False
            delta = get("delta")
            if delta.__class__ is not str or not self._seq.advance(get("sequence_number")):
                return False
            where = get("output_index")
            if where.__class__ is int and 0 <= where <= INT64_MAX:
                if where == self._fast_where and get("content_index") == self._fast_ci:
                    # The block of the last delta cached below: an equal key, already filled.
                    if delta:
                        sink.text(self._fast_block, "text", delta, now_s)
                    return True
                cache = True
            else:
                where = get("item_id")  # what _where gives
                cache = False
            ci = get("content_index")
            if not (_scalar(where) and _scalar(ci)):
                return False  # the general path reports it
            key = ("text", where, ci)
            self._filled.add(key)
            if not delta:
                return True
            index = self._blocks.get(key)
            if index is None:
                index = self._block(key)
            if cache:
                self._fast_where, self._fast_ci, self._fast_block = where, ci, index
            sink.text(index, "text", delta, now_s)
            return True
        if etype in _CALL_DELTAS:
            # An argument fragment of a call already open (else the general path opens it).
            if event and event != _CALL_DELTAS[etype]:
                return False
            delta = obj.get("delta")
            if delta.__class__ is not str:
                return False
            item_id = get("item_id")
            if item_id.__class__ is str and item_id == self._fast_item:
                call = self._fast_call  # found by this item_id last time: calls are never replaced
            else:
                call = self._find_call(text(item_id), _index(get("output_index")))
                if call is None:
                    return False
                if item_id.__class__ is str and item_id in self._calls:
                    self._fast_item, self._fast_call = item_id, call
            seq = get("sequence_number")
            if not self._seq.advance(seq):
                return False
            call.has_arguments = True
            sink.fragment(seq, call.key, call.index, None, None, delta)
            return True
        return False

    def _object(
        self, message: Message, obj: dict[str, Any], out: list[CanonicalEvent | Violation]
    ) -> list[CanonicalEvent | Violation]:
        if isinstance(message, JSONFrame):
            self._whole(obj, out)
            return out
        seq = self._seq.check(obj.get("sequence_number"), out)
        etype = obj.get("type")
        if not isinstance(etype, str):
            out.append(Violation(V.INVALID_EVENT, seq, "missing or non-string type"))
            return out
        if message.event and message.event != etype:
            out.append(Violation(V.TYPE_MISMATCH, seq, f"SSE event {message.event!r} but JSON type {etype!r}"))
        handler = _HANDLERS.get(etype)
        if handler is not None:
            handler(self, obj, seq, out)
        elif etype in _DELTAS:
            self._delta(obj, seq, _DELTAS[etype], out)
        elif etype in _DONES:
            family, sub, block_type, field = _DONES[etype]
            key = _block_key(obj, family, sub, seq, out)
            if key is not None:
                self._fill(key, seq, block_type, obj.get(field), out)
        return out

    # -- whole-body answers -------------------------------------------------------------------

    def _whole(self, obj: dict[str, Any], out: list[Any]) -> None:
        if "output" in obj or obj.get("object") == "response":
            status = obj.get("status")
            self._terminal(obj, None, status if isinstance(status, str) else "completed", out)
            return
        if obj.get("error") is not None:
            out.append(error_event(None, obj["error"]))
        else:
            out.append(Violation(V.INVALID_EVENT, None, "JSON body is neither a response object nor an error"))
        out.append(StreamEnd(None))

    # -- stream events ------------------------------------------------------------------------

    def _on_snapshot(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        self._identity(obj.get("response"), seq, out)

    def _identity(self, response: Any, seq: int | None, out: list[Any]) -> None:
        if not isinstance(response, dict):
            return
        rid, model = text(response.get("id")), text(response.get("model"))
        if not self._started:
            if rid is not None or model is not None:
                self._started = True
                self._model = model
                out.append(StreamStart(seq, model, rid))
        elif model is not None and model != self._model:
            self._model = model
            out.append(ModelEvent(seq, model))
        identity(response, seq, out)

    def _delta(self, obj: dict[str, Any], seq: int | None, spec: tuple[str, str, str], out: list[Any]) -> None:
        family, sub, block_type = spec
        delta = obj.get("delta")
        if not isinstance(delta, str):
            out.append(Violation(V.INVALID_EVENT, seq, f"{obj['type']}: delta is not a string"))
            return
        key = _block_key(obj, family, sub, seq, out)
        if key is None:
            return
        self._filled.add(key)
        if delta:
            out.append(ContentDelta(seq, self._block(key), delta, block_type))

    def _fill(self, key: tuple[str, Any, Any], seq: int | None, block_type: str, value: Any, out: list[Any]) -> None:
        """Emits ``value`` as the whole text of block ``key`` if no delta filled it."""
        if key in self._filled or not isinstance(value, str):
            return
        self._filled.add(key)
        if value:
            out.append(ContentDelta(seq, self._block(key), value, block_type))

    def _block(self, key: tuple[str, Any, Any]) -> int:
        index = self._blocks.get(key)
        if index is None:
            index = self._blocks[key] = len(self._blocks)
        return index

    def _on_item_added(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        item = obj.get("item")
        self._added.add(_item_key(obj, item))
        if isinstance(item, dict) and text(item.get("type")) in _CALL_ITEMS:
            self._open_call(item, _index(obj.get("output_index")), seq, out)

    def _on_item_done(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        item = obj.get("item")
        key = _item_key(obj, item)
        if key not in self._added and not self._named(key):
            what = f"output_index {key}" if isinstance(key, int) else f"item {key!r:.80}"
            detail = f"response.output_item.done for {what}, which no output_item.added or earlier event named"
            out.append(Violation(V.BLOCK_NOT_STARTED, seq, detail))
        if isinstance(item, dict):
            self._item(item, _index(obj.get("output_index")), seq, out)

    def _named(self, key: Any) -> bool:
        """True when an earlier event named output item ``key`` (an ``output_index``, else an
        item id): a call opened there, or a block of its text (O(blocks): ``output_item.done``
        only)."""
        if key in self._call_at or key in self._calls:
            return True
        return any(block[1] == key for block in self._blocks)

    def _item(self, item: dict[str, Any], index: int | None, seq: int | None, out: list[Any]) -> None:
        """Fills whatever of a complete output item no delta carried."""
        kind = text(item.get("type"))
        field = _CALL_ITEMS.get(kind)  # type: ignore[arg-type]
        if field is not None:
            call = self._open_call(item, index, seq, out)
            if not call.has_arguments:
                call.has_arguments = True
                out.append(ToolCallDelta(seq, call.key, call.index, None, None, arguments(item.get(field))))
            return
        where = item.get("id") if index is None else index
        if not _scalar(where):
            where = None  # an id that is an array or object keys nothing
        for (item_type, parts_field), part_types in _PARTS.items():
            parts = item.get(parts_field)
            if kind != item_type or not isinstance(parts, list):
                continue
            for sub, part in enumerate(parts):
                spec = part_types.get(text(part.get("type"))) if isinstance(part, dict) else None  # type: ignore[arg-type]
                if spec is not None:
                    family, block_type, text_field = spec
                    self._fill((family, where, sub), seq, block_type, part.get(text_field), out)

    def _open_call(self, item: dict[str, Any], index: int | None, seq: int | None, out: list[Any]) -> _Call:
        """The call of a tool-call item, opened (one ``ToolCallDelta`` with id and name) if new."""
        self._tool_use = True
        item_id = text(item.get("id"))
        call = self._find_call(item_id, index)
        if call is None:
            key = item_id or f"output:{index}"
            call = self._calls[key] = _Call(key, index)
            if index is not None:
                self._call_at[index] = key
            out.append(ToolCallDelta(seq, key, index, call_id(item.get("call_id")), text(item.get("name")), ""))
        return call

    def _find_call(self, item_id: str | None, index: int | None) -> _Call | None:
        if item_id is not None and item_id in self._calls:
            return self._calls[item_id]
        key = self._call_at.get(index) if index is not None else None
        return self._calls.get(key) if key is not None else None

    def _on_call_delta(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, str):
            out.append(Violation(V.INVALID_EVENT, seq, f"{obj['type']}: delta is not a string"))
            return
        call = self._call_for(obj, seq, out)
        call.has_arguments = True
        out.append(ToolCallDelta(seq, call.key, call.index, None, None, delta))

    def _on_call_done(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        call = self._call_for(obj, seq, out)
        if not call.has_arguments:
            call.has_arguments = True
            value = obj.get("arguments", obj.get("input"))
            out.append(ToolCallDelta(seq, call.key, call.index, None, text(obj.get("name")), arguments(value)))

    def _call_for(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> _Call:
        """The call an argument event belongs to (by ``item_id``, else ``output_index``),
        opened without id and name if its ``output_item.added`` never came."""
        item_id, index = text(obj.get("item_id")), _index(obj.get("output_index"))
        call = self._find_call(item_id, index)
        if call is None:
            call = self._open_call({"id": item_id}, index, seq, out)
        return call

    def _on_completed(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        self._terminal(obj.get("response"), seq, "completed", out)

    def _on_incomplete(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        self._terminal(obj.get("response"), seq, "incomplete", out)

    def _on_failed(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        self._terminal(obj.get("response"), seq, "failed", out)

    def _on_error(self, obj: dict[str, Any], seq: int | None, out: list[Any]) -> None:
        nested = obj.get("error")
        out.append(error_event(seq, nested if isinstance(nested, dict) else obj))

    def _terminal(self, response: Any, seq: int | None, status: str, out: list[Any]) -> None:
        """A final ``response`` object (terminal event or whole-body answer): identity, any output
        no delta carried, stop reason or error, usage, ``StreamEnd``."""
        response = response if isinstance(response, dict) else {}
        self._identity(response, seq, out)
        items = response.get("output")
        if isinstance(items, list):
            for index, item in enumerate(items):
                if isinstance(item, dict):
                    self._item(item, index, seq, out)
        if status == "failed":
            out.append(error_event(seq, response.get("error")))
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = text(details.get("reason")) if isinstance(details, dict) else None
            raw = f"incomplete:{reason}" if reason else "incomplete"
            out.append(StopEvent(seq, INCOMPLETE_REASONS.get(reason, reason) if reason else None, raw))
        elif status == "completed":
            out.append(StopEvent(seq, "tool_use" if self._tool_use else "end_turn", "completed"))
        elif status == "cancelled":
            out.append(StopEvent(seq, status, status))
        read_usage(response.get("usage"), RESPONSES_USAGE, seq, out)
        out.append(StreamEnd(seq))


def _history_item(item: Any) -> CanonicalMessage | None:
    if not isinstance(item, dict):
        return None
    kind = item.get("type")
    if kind in (None, "message") and isinstance(item.get("role"), str):
        text, attachments = content_parts(item.get("content"))
        return CanonicalMessage(item["role"], text, attachments=attachments)
    if kind in _CALL_ITEMS:
        return CanonicalMessage(
            "assistant", tool_calls=(call(item.get("call_id"), item.get("name"), item.get(_CALL_ITEMS[kind])),)
        )
    if kind in ("function_call_output", "custom_tool_call_output"):
        return CanonicalMessage("tool", tool_results=(result(item.get("call_id"), item.get("output")),))
    return None


def _index(v: Any) -> int | None:
    return v if is_int(v) and v >= 0 else None


def _item_key(obj: dict[str, Any], item: Any) -> Any:
    """What names an output item in ``output_item.added``/``.done``: its ``output_index``, else
    its string ``id``, else ``None`` (an item that names itself nowhere)."""
    index = _index(obj.get("output_index"))
    if index is not None:
        return index
    return text(item.get("id")) if isinstance(item, dict) else None


def _scalar(v: Any) -> bool:
    """True for a JSON value that can key a block: a string, number, boolean or null (arrays
    and objects cannot: they are not hashable)."""
    return v is None or v.__class__ in (str, int, float, bool)


def _block_key(
    obj: dict[str, Any], family: str, sub: str, seq: int | None, out: list[Any]
) -> tuple[str, Any, Any] | None:
    """The block key of a text event: (``family``, its output item (``_where``), its part
    ``obj[sub]``); ``None`` with an ``invalid_event`` naming the field when the item or part is
    an array or object (not hashable: the event is not applied)."""
    where, part = _where(obj), obj.get(sub)
    if _scalar(where) and _scalar(part):
        return (family, where, part)
    field = sub if not _scalar(part) else "item_id"
    out.append(Violation(V.INVALID_EVENT, seq, f"{obj.get('type')}: {field} is an array or object"))
    return None


def _where(obj: dict[str, Any]) -> Any:
    """Which output item a delta event belongs to: ``output_index``, else ``item_id``."""
    index = _index(obj.get("output_index"))
    return index if index is not None else obj.get("item_id")


# Argument-fragment event types -> their SSE event name as bytes (the fast lane compares bytes).
_CALL_DELTAS = {
    "response.function_call_arguments.delta": b"response.function_call_arguments.delta",
    "response.custom_tool_call_input.delta": b"response.custom_tool_call_input.delta",
}

_Handler = Callable[[OpenAIResponsesAdapter, dict[str, Any], int | None, list[Any]], None]
_HANDLERS: dict[str, _Handler] = {
    "response.created": OpenAIResponsesAdapter._on_snapshot,
    "response.in_progress": OpenAIResponsesAdapter._on_snapshot,
    "response.queued": OpenAIResponsesAdapter._on_snapshot,
    "response.output_item.added": OpenAIResponsesAdapter._on_item_added,
    "response.output_item.done": OpenAIResponsesAdapter._on_item_done,
    "response.function_call_arguments.delta": OpenAIResponsesAdapter._on_call_delta,
    "response.custom_tool_call_input.delta": OpenAIResponsesAdapter._on_call_delta,
    "response.function_call_arguments.done": OpenAIResponsesAdapter._on_call_done,
    "response.custom_tool_call_input.done": OpenAIResponsesAdapter._on_call_done,
    "response.completed": OpenAIResponsesAdapter._on_completed,
    "response.incomplete": OpenAIResponsesAdapter._on_incomplete,
    "response.failed": OpenAIResponsesAdapter._on_failed,
    "error": OpenAIResponsesAdapter._on_error,
}
