"""Microsoft Copilot over WebSocket, SignalR hub protocol (``signalr.copilot``): the Bing /
Copilot "Sydney" ChatHub (``sydney.bing.com/sydney/ChatHub``) and the M365 Copilot ChatHub
(``substrate.office.com/m365Copilot/Chathub/{oid}@{tid}``).

Sources: dotnet/aspnetcore ``src/SignalR/docs/specs/HubProtocol.md`` (message types, streaming
semantics: a ``StreamInvocation`` answered by ``StreamItem``s and a ``Completion``; ``Close``);
the shared reference binary-formats §2.3 ("What the observer does"), §3.1 (Sydney: the request
``type:4 target:"chat"`` with ``arguments[0].message.text``; ``update`` invocations carrying the
cumulative ``messages[].text``; the final ``type:2`` item with ``result.value``; ``type:3``),
§3.2 (M365: ``writeAtCursor`` deltas, ``tone`` as the model selector); archived clients
acheong08/EdgeGPT ``chathub.py`` and vsakkas/sydney.py (diffing the cumulative snapshots).

A ``CopilotSession`` follows one socket: the client's and the server's WebSocket messages, in
order, framed by ``observer.wire.signalr``; it says when a turn opens (with its request facts),
what canonical events each server message adds to the open turn, and when the turn closes. One
turn is one record. Pure: no I/O, no clock (times are passed in), nothing raises on bad input.

Decisions:

- A turn opens at a client ``StreamInvocation`` (type 4), or an ``Invocation`` (type 1) with an
  ``invocationId``, whose target is ``chat``; its key is the invocation id. The prompt is
  ``arguments[0].message.text`` (a ``{"role": "user", "content": ...}`` message); ``tone`` (M365:
  ``Chat``, ``Reasoning``, ``Gpt_5_5_*``...) is the request's model; ``tone``, ``optionsSets``,
  ``source``, ``streamingMode`` and the ``plugins`` asked for are its parameters; the conversation
  id is metadata. Other client invocations (``Metrics`` telemetry, pings) are not turns.
- Server ``update`` invocations carry no invocation id: they go to the one open turn (the newest
  when several are open; Sydney allows one in flight per socket). Their text: M365's
  ``writeAtCursor`` delta when present, else the bot's cumulative ``messages[].text`` (the last
  message with ``author`` ``bot`` and no ``messageType``), of which only what extends the text
  so far is new (a hub that sends ``{"text": ...}`` alone is read the same way). Messages with a ``messageType`` (``InternalSearchQuery``, ``Progress``, ...)
  are the service's own steps: not the answer.
- An answer replaced by an apology (``contentOrigin`` ``Apology``, the service retracting what it
  wrote) stops the turn as ``content_filter`` (raw ``Apology``); the apology is a ``refusal``
  block (index 1), the text streamed before stays in block 0: the record shows what was shown.
- ``StreamItem`` (type 2): the final bot message completes the text (what extends it); a
  ``result.value`` other than ``Success`` (``Throttled``, ``InvalidRequest``, ...) is an error
  (code the value, message ``result.message``). ``Completion`` (type 3) ends the turn: cleanly,
  or as an error with its ``error`` (code ``completion_error``; the stream still ended: no
  ``missing_stream_end``). ``CancelInvocation`` (type 5) or a ``Close`` (type 7, the JS client's ``stop()``)
  from the client ends it as aborted by the client; a ``Close`` (type 7) with an error ends every open turn with that error.
- No usage: the hub reports none (``throttling`` counts messages, not tokens). No tool calls:
  the service's searches and plugins run on its side (recorded neither as calls nor as
  undeclared tools).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from observer.dialects.base import DialectBase, RequestView
from observer.events import ContentDelta, ErrorEvent, StopEvent, StreamEnd, StreamStart
from observer.reassembly import EndCause
from observer.records import RequestFacts, Violation, ViolationKind
from observer.wire.jsonseq import JsonSequenceDecoder
from observer.wire.signalr import HubMessage, HubMessageType, HubProtocol, decoder_for, parse_handshake

V = ViolationKind
T = HubMessageType
PARAMETER_KEYS = ("tone", "optionsSets", "source", "streamingMode", "plugins")
MAX_RECORD_BYTES = 1 << 20
#: Characters of an answer a session keeps to diff snapshots (the record's default cap).
MAX_TEXT_CHARS = 8 << 20
#: Turns a session keeps open; a client opening more without ending any loses its oldest.
MAX_OPEN_TURNS = 16
#: Bytes of a handshake held while it arrives split over several messages.
MAX_HANDSHAKE_BYTES = 4096


@dataclass(slots=True)
class TurnOpened:
    """A turn began (its record's request): ``key`` (the invocation id), the request ``facts``
    and their ``violations``, ``at_s`` the client message's time (epoch seconds)."""

    key: str
    facts: RequestFacts
    violations: list[Violation]
    at_s: float


@dataclass(slots=True)
class TurnEvents:
    """Canonical events and violations for the open turn ``key``, in wire order; ``at_s`` the
    server message's time."""

    key: str
    items: list[Any]
    at_s: float


@dataclass(slots=True)
class TurnClosed:
    """Turn ``key`` ended: ``cause`` ``EOF`` for its protocol's own end (a ``Completion``, or a
    ``Close``), ``CLIENT_ABORTED`` / ``UPSTREAM_FAILED`` / ``SHUTDOWN`` when the socket went."""

    key: str
    cause: EndCause
    at_s: float


SessionOut = list[TurnOpened | TurnEvents | TurnClosed | Violation]


@dataclass(slots=True)
class _Turn:
    """An open turn: the answer so far as ``parts`` (deltas appended, joined only when a
    cumulative snapshot must be compared: appending to one string would copy it per message),
    ``length`` its characters; past ``MAX_TEXT_CHARS`` nothing more is kept (``capped``: the
    record's own cap, ``max_stream_text_chars``, has cut it already)."""

    key: str
    parts: list[str] = field(default_factory=list)
    length: int = 0
    capped: bool = False
    started: bool = False
    refused: bool = False

    @property
    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def add(self, text: str) -> None:
        self.length += len(text)
        if self.length > MAX_TEXT_CHARS:
            self.capped, self.parts = True, []
        elif not self.capped:
            self.parts.append(text)


@dataclass(slots=True)
class _Side:
    """One direction of the socket: before its handshake, then its hub decoder."""

    decoder: Any = None
    handshake_done: bool = False
    pending: bytes = b""  # a handshake split over messages, so far (at most MAX_HANDSHAKE_BYTES)


class CopilotDialect(DialectBase):
    """``signalr.copilot``: a WebSocket on an LLM host whose path holds ``chathub`` (any case).
    A socket dialect (``matches_websocket``, ``new_session``): no HTTP request is its own."""

    name = "signalr.copilot"
    #: The negotiated connection token rides in the socket's URL (``?id=``): a secret.
    secret_query_params = ("id",)

    def matches(self, request: RequestView) -> bool:
        return False

    def matches_websocket(self, request: RequestView) -> bool:
        return "chathub" in request.path_only.lower()

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        return RequestFacts(body_bytes=len(body)), []

    def new_adapter(self, spec: Any) -> Any:
        raise TypeError("signalr.copilot reads WebSocket messages (new_session), not HTTP responses")

    def new_session(self) -> CopilotSession:
        return CopilotSession()


class CopilotSession:
    """The turns of one Copilot ChatHub socket (module docstring). ``feed`` one WebSocket
    message at a time, in the order mitmproxy relays them; ``close`` when the socket ends.
    Socket-level problems (a bad handshake, an unknown protocol) are returned as violations
    outside any turn (the caller logs or counts them)."""

    def __init__(self) -> None:
        self._client = _Side()
        self._server = _Side()
        self._protocol: HubProtocol | None = None
        self._turns: dict[str, _Turn] = {}
        self._dead = False  # a protocol this module cannot read: the socket is not observed

    @property
    def open_turns(self) -> int:
        return len(self._turns)

    @property
    def dead(self) -> bool:
        """The socket cannot be read (its handshake failed or names a protocol not read here)."""
        return self._dead

    def feed(self, from_client: bool, content: bytes, now_s: float) -> SessionOut:
        """The effects of one WebSocket message (its ``content``: text messages UTF-8 encoded)."""
        if self._dead:
            return []
        side = self._client if from_client else self._server
        out: SessionOut = []
        if not side.handshake_done:
            content = self._handshake(side, from_client, content, out)
            if content is None:
                return out
        for item in side.decoder.feed(content) if content else ():
            if isinstance(item, Violation):
                out.append(self._violation(item, now_s))
            elif from_client:
                self._client_message(item, now_s, out)
            else:
                self._server_message(item, now_s, out)
        return out

    def close(self, by_client: bool | None, now_s: float, shutdown: bool = False) -> SessionOut:
        """The socket ended (``websocket_end``; ``by_client``: who closed it, ``None`` unknown;
        ``shutdown``: the observer stops): every open turn closes with that cause."""
        if shutdown:
            cause = EndCause.SHUTDOWN
        else:
            cause = EndCause.CLIENT_ABORTED if by_client else EndCause.UPSTREAM_FAILED
        out: SessionOut = [TurnClosed(key, cause, now_s) for key in self._turns]
        self._turns.clear()
        return out

    # ----- handshake -----

    def _handshake(self, side: _Side, from_client: bool, content: bytes, out: SessionOut) -> bytes | None:
        """Reads a direction's first message; returns the records after the handshake (to feed),
        or ``None`` when nothing more is to be read from it now. A handshake split over messages
        (the transport promises no boundaries: trial finding) is joined, up to
        ``MAX_HANDSHAKE_BYTES``."""
        content = side.pending + content
        side.pending = b""
        if b"\x1e" not in content and len(content) < MAX_HANDSHAKE_BYTES:
            side.pending = content
            return None
        found = parse_handshake(content)
        if isinstance(found, Violation):
            out.append(found)
            self._dead = True
            return None
        side.handshake_done = True
        if from_client:
            if found.protocol is None:
                detail = f"SignalR protocol {found.protocol_name!r} is not read: the socket is not observed"
                out.append(Violation(V.MALFORMED_FRAME, None, detail))
                self._dead = True
                return None
            self._protocol = found.protocol
            self._client.decoder = decoder_for(found.protocol, MAX_RECORD_BYTES)
            self._server.decoder = decoder_for(found.protocol, MAX_RECORD_BYTES)
        elif found.error is not None:
            out.append(Violation(V.MALFORMED_FRAME, None, f"the hub refused the handshake: {found.error}"))
            self._dead = True
            return None
        if side.decoder is None:  # the server answered before the client asked
            self._dead = True
            out.append(Violation(V.MALFORMED_FRAME, None, "a hub handshake response before its request"))
            return None
        return found.rest

    def _violation(self, item: Violation, now_s: float) -> Violation | TurnEvents:
        """A framing violation: the open turn's, if there is one."""
        turn = self._open_turn()
        return TurnEvents(turn.key, [item], now_s) if turn is not None else item

    # ----- client -----

    def _client_message(self, msg: HubMessage, now_s: float, out: SessionOut) -> None:
        if msg.type in (T.STREAM_INVOCATION, T.INVOCATION) and msg.invocation_id and msg.target == "chat":
            facts, violations = _request(msg)
            if msg.invocation_id not in self._turns and len(self._turns) >= MAX_OPEN_TURNS:
                oldest = next(iter(self._turns))
                del self._turns[oldest]
                detail = f"more than {MAX_OPEN_TURNS} turns open on one socket: no longer followed"
                out.append(TurnEvents(oldest, [Violation(V.OVERSIZE_RECORD, None, detail)], now_s))
                out.append(TurnClosed(oldest, EndCause.SHUTDOWN, now_s))
            self._turns[msg.invocation_id] = _Turn(msg.invocation_id)
            out.append(TurnOpened(msg.invocation_id, facts, violations, now_s))
        elif msg.type == T.CANCEL_INVOCATION and msg.invocation_id in self._turns:
            del self._turns[msg.invocation_id]
            out.append(TurnClosed(msg.invocation_id, EndCause.CLIENT_ABORTED, now_s))
        elif msg.type == T.CLOSE:  # the client's Close (the JS client's stop()): its open turns end here
            out.extend(TurnClosed(key, EndCause.CLIENT_ABORTED, now_s) for key in self._turns)
            self._turns.clear()

    # ----- server -----

    def _open_turn(self) -> _Turn | None:
        return next(reversed(self._turns.values()), None)

    def _server_message(self, msg: HubMessage, now_s: float, out: SessionOut) -> None:
        if msg.type == T.INVOCATION and msg.target == "update":
            turn = self._open_turn()
            if turn is not None:
                out.append(TurnEvents(turn.key, self._update(turn, msg.arguments), now_s))
        elif msg.type == T.STREAM_ITEM and msg.invocation_id in self._turns:
            turn = self._turns[msg.invocation_id]
            out.append(TurnEvents(turn.key, self._item(turn, msg.item), now_s))
        elif msg.type == T.COMPLETION and msg.invocation_id in self._turns:
            turn = self._turns.pop(msg.invocation_id)
            items = self._start(turn)
            if msg.error:  # the invocation ended, with an error: the protocol's own end all the same
                items.append(ErrorEvent(None, "completion_error", msg.error))
            items.append(StreamEnd(None))
            out.append(TurnEvents(turn.key, items, now_s))
            out.append(TurnClosed(turn.key, EndCause.EOF, now_s))
        elif msg.type == T.CLOSE:  # with an error: each open turn ends with it; without: cut off
            for key, turn in list(self._turns.items()):
                if msg.error:
                    out.append(
                        TurnEvents(
                            key, [*self._start(turn), ErrorEvent(None, "close", msg.error), StreamEnd(None)], now_s
                        )
                    )
                out.append(TurnClosed(key, EndCause.EOF if msg.error else EndCause.UPSTREAM_FAILED, now_s))
            self._turns.clear()

    def _start(self, turn: _Turn) -> list[Any]:
        if turn.started:
            return []
        turn.started = True
        return [StreamStart(None, None, None)]

    def _update(self, turn: _Turn, arguments: Any) -> list[Any]:
        items = self._start(turn)
        arg = arguments[0] if isinstance(arguments, list) and arguments else None
        if not isinstance(arg, Mapping):
            items.append(Violation(V.INVALID_EVENT, None, "update: arguments[0] is not an object"))
            return items
        delta = arg.get("writeAtCursor")
        if isinstance(delta, str):
            if delta and not turn.refused:
                turn.add(delta)
                items.append(ContentDelta(None, 0, delta, "text"))
            return items
        bot = _bot_message(arg.get("messages"))
        if bot is None and isinstance(arg.get("text"), str):  # a plain hub's {"text": cumulative}
            bot = arg
        if bot is not None:
            self._snapshot(turn, bot, items)
        return items

    def _item(self, turn: _Turn, item: Any) -> list[Any]:
        items = self._start(turn)
        if not isinstance(item, Mapping):
            items.append(Violation(V.INVALID_EVENT, None, "the stream item is not an object"))
            return items
        bot = _bot_message(item.get("messages"))
        if bot is not None:
            self._snapshot(turn, bot, items)
        result = item.get("result")
        if isinstance(result, Mapping):
            value, message = result.get("value"), result.get("message")
            if isinstance(value, str) and value != "Success":
                items.append(ErrorEvent(None, value, message if isinstance(message, str) else None))
        return items

    def _snapshot(self, turn: _Turn, bot: Mapping[str, Any], items: list[Any]) -> None:
        """A cumulative bot message: what extends the answer so far is new text; an apology
        that replaces it stops the turn (module docstring)."""
        text = bot.get("text")
        if not isinstance(text, str) or turn.refused or turn.capped:
            return
        if bot.get("contentOrigin") == "Apology":
            turn.refused = True
            items.append(ContentDelta(None, 1, text, "refusal"))
            items.append(StopEvent(None, "content_filter", "Apology"))
            return
        so_far = turn.text
        if text.startswith(so_far):
            new = text[len(so_far) :]
            if new:
                turn.add(new)
                items.append(ContentDelta(None, 0, new, "text"))
        elif not so_far.startswith(text):  # rewritten, not only behind: said, not guessed at
            items.append(
                Violation(V.INVALID_EVENT, None, "an update rewrote the answer so far; the rest is not recorded")
            )
            turn.refused = True


def _bot_message(messages: Any) -> Mapping[str, Any] | None:
    """The last message of ``author`` ``bot`` without a ``messageType`` (the answer itself)."""
    if not isinstance(messages, list):
        return None
    for m in reversed(messages):
        if isinstance(m, Mapping) and m.get("author") == "bot" and m.get("messageType") is None:
            return m
    return None


def _request(msg: HubMessage) -> tuple[RequestFacts, list[Violation]]:
    """The request facts of a ``chat`` invocation (module docstring)."""
    violations: list[Violation] = []
    facts = RequestFacts(stream=True, body_bytes=msg.size_bytes)
    arg = msg.arguments[0] if msg.arguments else None
    if not isinstance(arg, Mapping):
        violations.append(Violation(V.INVALID_REQUEST, None, "chat: arguments[0] is not an object"))
        return facts, violations
    message = arg.get("message")
    text = message.get("text") if isinstance(message, Mapping) else None
    if isinstance(text, str):
        facts.messages = [{"role": "user", "content": text}]
    else:
        violations.append(Violation(V.INVALID_REQUEST, None, "chat: no message.text"))
    tone = arg.get("tone")
    facts.model = tone if isinstance(tone, str) else None
    facts.parameters = {k: arg[k] for k in PARAMETER_KEYS if k in arg}
    conversation = arg.get("conversationId")
    if isinstance(conversation, str):
        facts.metadata = {"conversationId": conversation}
    return facts, violations


class CopilotChatDialect(DialectBase):
    """``websocket.copilot``: consumer Copilot's chat socket (``copilot.microsoft.com/c/api/chat``),
    which is not SignalR: JSON events, several concatenated in one message without a separator.

    Source: shared reference binary-formats §3.3 (HusnainRKI/ms-copilot-gateway's client and the
    frame list of its CDP client; a public HAR write-up): the client's ``send``
    (``content[].text``, ``mode``: ``chat``, ``smart``, ``deep-research``), the server's
    ``startMessage``, ``appendText`` deltas, ``partCompleted``, ``done``; ``challenge``,
    ``received``, ``titleUpdate``, ``suggestedFollowups`` and pings carry no answer. One ``send``
    opens a turn (``mode`` its request model; the conversation id metadata), ``done`` ends it; an
    ``error`` event (its shape is not documented: ``code``/``message`` read where present) ends it
    with that error. No usage, no tool calls."""

    name = "websocket.copilot"

    def matches(self, request: RequestView) -> bool:
        return False

    def matches_websocket(self, request: RequestView) -> bool:
        return request.path_only.rstrip("/").lower().endswith("/c/api/chat")

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        return RequestFacts(body_bytes=len(body)), []

    def new_adapter(self, spec: Any) -> Any:
        raise TypeError("websocket.copilot reads WebSocket messages (new_session), not HTTP responses")

    def new_session(self) -> CopilotChatSession:
        return CopilotChatSession()


class CopilotChatSession:
    """The turns of one consumer Copilot chat socket (``CopilotChatDialect``); the same effects
    as ``CopilotSession``."""

    def __init__(self) -> None:
        self._client = JsonSequenceDecoder(MAX_RECORD_BYTES)
        self._server = JsonSequenceDecoder(MAX_RECORD_BYTES)
        self._open: _Turn | None = None
        self._count = 0

    @property
    def open_turns(self) -> int:
        return 0 if self._open is None else 1

    def feed(self, from_client: bool, content: bytes, now_s: float) -> SessionOut:
        out: SessionOut = []
        for item in (self._client if from_client else self._server).feed(content):
            if isinstance(item, Violation):
                out.append(TurnEvents(self._open.key, [item], now_s) if self._open is not None else item)
                continue
            try:
                event = orjson.loads(item[1])
            except orjson.JSONDecodeError as exc:
                out.append(Violation(V.INVALID_JSON, None, f"a chat socket event: {exc}"))
                continue
            if isinstance(event, dict):
                (self._client_event if from_client else self._server_event)(event, now_s, out)
        return out

    def close(self, by_client: bool | None, now_s: float, shutdown: bool = False) -> SessionOut:
        if self._open is None:
            return []
        cause = EndCause.SHUTDOWN if shutdown else EndCause.CLIENT_ABORTED if by_client else EndCause.UPSTREAM_FAILED
        key, self._open = self._open.key, None
        return [TurnClosed(key, cause, now_s)]

    def _client_event(self, event: dict[str, Any], now_s: float, out: SessionOut) -> None:
        if event.get("event") != "send":
            return
        if self._open is not None:  # a new message before the answer ended: the earlier one is cut off
            out.append(TurnClosed(self._open.key, EndCause.CLIENT_ABORTED, now_s))
        self._count += 1
        self._open = _Turn(f"send-{self._count}")
        facts = RequestFacts(stream=True)
        violations: list[Violation] = []
        content = event.get("content")
        texts = (
            [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if isinstance(content, list)
            else []
        )
        if texts:
            facts.messages = [{"role": "user", "content": "".join(texts)}]
        else:
            violations.append(Violation(V.INVALID_REQUEST, None, "send: no text content"))
        mode = event.get("mode")
        facts.model = mode if isinstance(mode, str) else None
        if isinstance(event.get("conversationId"), str):
            facts.metadata = {"conversationId": event["conversationId"]}
        out.append(TurnOpened(self._open.key, facts, violations, now_s))

    def _server_event(self, event: dict[str, Any], now_s: float, out: SessionOut) -> None:
        turn = self._open
        if turn is None:
            return
        name = event.get("event")
        items: list[Any] = []
        if not turn.started and name in ("startMessage", "appendText", "done", "error"):
            turn.started = True
            items.append(StreamStart(None, None, None))
        if name == "appendText" and isinstance(event.get("text"), str):
            items.append(ContentDelta(None, 0, event["text"], "text"))
        elif name == "done":
            items.append(StreamEnd(None))
        elif name == "error":
            code, message = event.get("code"), event.get("message")
            items.append(
                ErrorEvent(
                    None, code if isinstance(code, str) else "error", message if isinstance(message, str) else None
                )
            )
            items.append(StreamEnd(None))
        if items:
            out.append(TurnEvents(turn.key, items, now_s))
        if name in ("done", "error"):
            self._open = None
            out.append(TurnClosed(turn.key, EndCause.EOF, now_s))


__all__ = [
    "CopilotChatDialect",
    "CopilotChatSession",
    "CopilotDialect",
    "CopilotSession",
    "TurnClosed",
    "TurnEvents",
    "TurnOpened",
]
