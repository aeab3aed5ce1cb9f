"""The dialect contract: how a wire dialect is recognised, how its request is read, how its
response is framed, and how its messages map onto canonical events (DESIGN "observer/dialects")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from observer.conversation import CanonicalMessage, default_messages, recorded_answer
from observer.events import CanonicalEvent
from observer.records import Exchange, RequestFacts, Violation
from observer.response import ResponseSpec
from observer.wire.frames import Framing


@dataclass(frozen=True, slots=True)
class RequestView:
    """What is known of a request when its headers arrive (no body yet).

    ``headers`` has lower-case names; ``path`` includes the query string.
    """

    method: str
    host: str
    path: str
    headers: Mapping[str, str]

    @property
    def media_type(self) -> str:
        """The ``Content-Type`` without parameters, lower-cased ("" when absent), RFC 9110 §8.3.1."""
        return media_type(self.headers.get("content-type"))

    @property
    def media_types(self) -> list[str]:
        """Every media type a (possibly repeated) ``Content-Type`` names: proxies join repeated
        header lines with ``", "``, so ``a/b, c/d`` gives both (a second header must not hide
        the first from detection)."""
        value = self.headers.get("content-type") or ""
        return [media_type(part) for part in value.split(",") if part.strip()]

    @property
    def path_only(self) -> str:
        """The path without the query string."""
        return self.path.split("?", 1)[0]

    @property
    def query(self) -> str:
        """The query string without ``?`` ("" when absent)."""
        return self.path.partition("?")[2]


def media_type(content_type: str | None) -> str:
    """``type/subtype`` of a ``Content-Type`` value, lower-cased, parameters dropped."""
    return (content_type or "").split(";", 1)[0].strip().lower()


class Message(Protocol):
    """One framed message in its text form, as ``on_message`` reads it:
    ``observer.wire.frames.SSEEvent`` for SSE, ``observer.wire.frames.JSONFrame`` for the other
    framings (``observer.wire.frames.text_message`` makes them from the framers' tuples)."""

    event: str
    data: str


class DeltaSink(Protocol):
    """Where a fast lane puts what it found (``observer.reassembly.Reassembler`` is one): the
    two canonical events of the bulk of every stream, applied without being built."""

    def text(self, index: int, block_type: str, text: str, now_s: float) -> None:
        """``ContentDelta(seq, index, text, block_type)`` observed at ``now_s`` (epoch seconds)."""
        ...

    def fragment(
        self, seq: int | None, key: str, index: int | None, id: str | None, name: str | None, arguments: str
    ) -> None:
        """``ToolCallDelta(seq, key, index, id, name, arguments)``."""
        ...


class StreamAdapter(Protocol):
    """Maps one response's messages onto canonical events (one instance per response).

    Two optional methods (looked up with ``getattr`` by ``observer.tap``; absent = not used)
    let the tap skip work on the bulk of a stream; both must give the same record as
    ``on_message``:

    - ``on_object(message, obj) -> list[CanonicalEvent | Violation]``: ``on_message(message)``
      for a message whose data the tap already parsed (orjson, from the undecoded bytes, so
      valid UTF-8) to the JSON value ``obj`` (any JSON type). ``message.data`` may be decoded
      lazily; the message is an SSE event or a ``JSONFrame`` as for ``on_message``.
    - ``fast(event, obj, sink, now_s) -> bool``: the fast lane for the dialect's dominant
      messages, text deltas and tool-call argument fragments. ``event`` is the SSE ``event``
      field as undecoded bytes, ASCII (``b""`` when absent; ``None`` for a framing without event
      names; the tap sends any other event type to ``on_object``, whose caller reports what is
      not UTF-8), ``obj`` as for ``on_object``, ``now_s`` the message's clock reading (epoch
      seconds). When ``on_message`` would have returned exactly ``[ContentDelta(seq, index,
      text, block_type)]`` it calls ``sink.text(index, block_type, text, now_s)``; exactly
      ``[ToolCallDelta(seq, key, index, id, name, arguments)]``: ``sink.fragment(seq, key,
      index, id, name, arguments)``; ``[]``: nothing; in each case after the same adapter state
      update, returning True. Else it returns False, with nothing called and no state changed.
      The tap calls it only while the stream has not ended.
    """

    def on_message(self, message: Message) -> list[CanonicalEvent | Violation]:
        """Maps one message; returns canonical events and violations in wire order."""
        ...

    def on_lost(self) -> None:
        """A message was dropped below the dialect (e.g. ``oversize_event``): its absence
        is already recorded and must not count again (e.g. as a ``seq`` gap)."""
        ...

    def on_close(self) -> list[CanonicalEvent | Violation]:
        """The body ended (cleanly or not); events implied by the end (e.g. a dialect whose
        end marker is its last chunk), or ``[]``."""
        ...


class Dialect(Protocol):
    """One wire dialect. Implementations are stateless; per-response state lives in the adapter.

    Two optional methods (looked up with ``getattr`` by ``observer.conversation``; absent = its
    defaults, which ``DialectBase`` also gives) map records onto canonical conversation messages:

    - ``conversation_messages(request: RequestFacts) -> list[CanonicalMessage]``: the recorded
      request (``messages`` as this dialect recorded them, plus whatever else of the request is
      part of the conversation, e.g. a system prompt kept in ``parameters``) in canonical form.
    - ``answer_message(exchange: Exchange) -> CanonicalMessage | None``: the record's answer as
      this dialect's clients resend it, ``None`` when it cannot be continued (e.g. ``n > 1``).

    And, for a dialect claimed by its response (``matches_response``), looked up the same way:

    - ``may_match_response(request: RequestView) -> bool``: the requests no dialect claimed by
      their headers whose body is held, bounded, until the response headers decide
      (``observer.capture.held``; absent: none is held, and such a request is recorded without
      its body).
    - ``response_id_header: str`` (absent: none): the lower-case name of a response header whose
      value is the response's id when the body carries none (Bedrock's ``x-amzn-requestid``:
      ConverseStream names no id in its events); ``ResponseSpec.response_id``.
    - ``declares_tools: bool`` (absent: True): False when this dialect's requests never declare
      the tools the model may call (the AI SDK UI: the app's server does), so each tool call is
      ``declared: None`` and no ``undeclared_tool`` is recorded; or a method
      ``declares_tools(request: RequestFacts) -> bool`` deciding it per request (the draft
      standard's ``llm-stream-observer:tools_declared_elsewhere`` extension).
    """

    name: str

    def matches(self, request: RequestView) -> bool:
        """True when this dialect speaks for the request (cheap: headers and path only)."""
        ...

    def matches_response(self, request: RequestView, response_headers: Mapping[str, str]) -> bool:
        """True when the response headers (lower-case names) show this dialect, whatever the
        request looked like (e.g. the AI SDK's ``x-vercel-ai-ui-message-stream``)."""
        ...

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        """Reads the request into ``RequestFacts``; never raises on bad input (violations instead)."""
        ...

    def framing(self, spec: ResponseSpec) -> Framing | None:
        """How a 2xx response body is framed, from the response's spec (media type, whether the
        request asked for a stream); ``None`` when this dialect cannot read that media type
        (``unexpected_content_type``)."""
        ...

    def new_adapter(self, spec: ResponseSpec) -> StreamAdapter:
        """A fresh adapter for the response ``spec`` describes."""
        ...


class DialectBase:
    """Defaults for dialects: no response-header recognition; SSE for ``text/event-stream``, the
    whole body as one JSON message for JSON media types (``application/json``, ``*+json``),
    unreadable otherwise; the conversation mapping of ``observer.conversation``'s defaults
    (``{"role", "content"}`` messages with OpenAI-style ``tool_calls``/``tool_call_id``; the
    answer's text and tool calls, ids kept)."""

    name = "base"

    def matches_response(self, request: RequestView, response_headers: Mapping[str, str]) -> bool:
        return False

    def conversation_messages(self, request: RequestFacts) -> list[CanonicalMessage]:
        return default_messages(request.messages)

    def answer_message(self, exchange: Exchange) -> CanonicalMessage | None:
        return recorded_answer(exchange)

    def framing(self, spec: ResponseSpec) -> Framing | None:
        response_media_type = spec.media_type
        if response_media_type == "text/event-stream":
            return Framing.SSE
        if response_media_type == "application/json" or response_media_type.endswith("+json"):
            return Framing.JSON
        return None


class AdapterBase:
    """Defaults for adapters: nothing to do for lost messages or at the end."""

    def on_lost(self) -> None:
        return None

    def on_close(self) -> list[CanonicalEvent | Violation]:
        return []
