"""Framers other than SSE, and the one factory that picks a framer for a response.

A framer turns response bytes (content-decoding already removed) into messages, incrementally:
``feed(bytes) -> list[Message | Violation]``, ``close() -> list[Message | Violation]``, the
concatenation of all its lists independent of how the input was split. A ``Message`` is the
tuple ``(event, data, id, retry, size_bytes)``, all undecoded:

- ``event`` (``bytes | None``): the SSE ``event`` field (``b""`` when a block had none);
  ``None`` for a framing that has no event names.
- ``data`` (``bytes``): the message's data as on the wire, not UTF-8 decoded (SSE ``data``
  lines joined with LF; one NDJSON line without its line end; one array element; the body).
- ``id`` (``str | None``), ``retry`` (``int | None``): SSE's last event ID and ``retry`` (ms);
  ``None`` elsewhere.
- ``size_bytes`` (``int``): the bytes the message took on the wire (separators included).

Whatever shortcut a framer takes stays inside it: its consumer (``observer.tap``) parses each
message's data as JSON once, straight from the bytes (orjson validates UTF-8), and only a message
that does not parse is decoded to text (:func:`text_message`, U+FFFD for invalid UTF-8 with an
``invalid_utf8`` violation), which is what dialect adapters' ``on_message`` reads. A new framing
is a module here that returns these tuples plus a ``Framing`` name in :func:`make_framer`.

- ``sse``: ``observer.wire.sse.SSEDecoder`` (WHATWG event stream).
- ``ndjson``: one message per line (``observer.wire.ndjson``): Ollama, AI SDK v4 data stream.
- ``json_array``: the elements of one streamed top-level JSON array (``observer.wire.jsonarray``):
  Gemini ``streamGenerateContent`` without ``alt=sse``.
- ``json``: the whole body as one message, at the end (``WholeBodyFramer``): non-streaming answers.
- ``event_stream``: one message per AWS event-stream frame (``EventStreamFramer`` over
  ``observer.wire.eventstream``): Amazon Bedrock's streams.
- ``connect``, ``grpc``, ``grpc_web``, ``grpc_web_text``: one message per 5-byte envelope
  (``EnvelopeFramer`` over ``observer.wire.envelope``): Connect streaming, gRPC, gRPC-Web (and its
  base64 text form). These are *binary* framings (``Framing.binary``): their messages' data is a
  protobuf payload, never parsed as JSON nor decoded to text by the tap; it goes to the adapter's
  ``on_binary`` (or ``on_message`` with a ``BinaryFrame``).

Also what the line and array framers share: ``positive_size`` (their bound's check) and
``nbytes`` (sizes in violation details); and the consumer's recoveries for data that did not
parse (issue 16): :func:`split_documents` (several JSON documents in one message,
``nonconformant_framing``) and, inside :func:`text_message`, :func:`without_lone_surrogates`
(``lone_surrogate``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import orjson

from observer import jsontext
from observer.records import Violation, ViolationKind


def positive_size(value: object, name: str) -> int:
    """``value`` if it is a positive int (not a bool); else ``ValueError`` naming ``name``."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def nbytes(n: int) -> str:
    """A size for a violation detail: ``"1 byte"``, ``"N bytes"``."""
    return "1 byte" if n == 1 else f"{n} bytes"


class Framing(enum.StrEnum):
    """How a response body is cut into messages."""

    SSE = "sse"
    NDJSON = "ndjson"
    JSON_ARRAY = "json_array"
    JSON = "json"
    EVENT_STREAM = "event_stream"
    CONNECT = "connect"
    GRPC = "grpc"
    GRPC_WEB = "grpc_web"
    GRPC_WEB_TEXT = "grpc_web_text"

    @property
    def whole_body(self) -> bool:
        """True when the framing's one message is the whole body (a non-streaming answer)."""
        return self is Framing.JSON

    @property
    def binary(self) -> bool:
        """True when the messages' data is binary (protobuf): the tap hands each message tuple to
        the adapter's ``on_binary`` instead of parsing it as JSON (``observer.tap``)."""
        return self in _BINARY


_BINARY = frozenset({Framing.CONNECT, Framing.GRPC, Framing.GRPC_WEB, Framing.GRPC_WEB_TEXT})


Message = tuple  # (event: bytes | None, data: bytes, id: str | None, retry: int | None, size_bytes: int)


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """The text form of an SSE message (WHATWG "dispatch the event"), as dialect adapters read
    it: ``event`` (``""`` when the block had none: WHATWG's default ``"message"`` is the
    consumer's), ``data``, ``id``, ``retry``, ``size_bytes`` as in ``Message``, the strings
    decoded (with replacement)."""

    event: str
    data: str
    id: str | None
    retry: int | None
    size_bytes: int


@dataclass(frozen=True, slots=True)
class JSONFrame:
    """One message of a non-SSE framing: ``data`` is its text (not parsed here), ``size_bytes``
    its bytes on the wire (separators included); ``event`` is always ``""``."""

    data: str
    size_bytes: int
    event: str = ""


_INVALID_UTF8 = "invalid UTF-8 replaced by U+FFFD"


def without_lone_surrogates(text: str) -> tuple[str, Violation] | None:
    """(``text`` rewritten as the same JSON value with each lone UTF-16 surrogate in its strings
    replaced by U+FFFD, one ``lone_surrogate`` violation), or ``None`` when ``text`` is not JSON
    that only lone surrogates kept orjson from reading (``observer.jsontext.without_lone_surrogates``).

    The violation's ``seq`` is the value's top-level integer ``seq`` when it has one (the draft's
    event envelope, §5.1), else ``None``; its detail names the places (JSON path and character
    index). The rewritten text is compact JSON (orjson), key order and values kept; only text a
    JSON parser refused is ever rewritten, so a conformant message is never touched."""
    recovered = jsontext.without_lone_surrogates(text)
    if recovered is None:
        return None
    value, n, places = recovered
    seq = value.get("seq") if isinstance(value, dict) else None
    if not isinstance(seq, int) or isinstance(seq, bool) or not -(2**63) <= seq < 2**63:
        seq = None
    what = "a lone UTF-16 surrogate" if n == 1 else f"{n} lone UTF-16 surrogates"
    more = f" and {n - len(places)} more" if n > len(places) else ""
    detail = f"{what} replaced by U+FFFD at {', '.join(places)}{more}"
    return jsontext.dumps(value).decode("utf-8"), Violation(ViolationKind.LONE_SURROGATE, seq, detail)


def split_documents(message: Message) -> tuple[Violation, list[Message]] | None:
    """For a message whose data did not parse as JSON: (one ``nonconformant_framing`` violation,
    one message per JSON document) when its data is two or more valid JSON objects/arrays
    written one after another (``data: {...}{...}``: ``observer.wire.recovery.documents``), else
    ``None``. Each message has the original's ``event`` and ``id``, ``retry`` on the first only,
    and sizes shared as ``observer.wire.sse`` shares a block's (each later one its document's
    length, the first the rest).

    Meant for the consumer's failure path (``observer.tap``'s general path, before
    :func:`text_message`), so a conformant message never reaches it; the SSE decoder itself
    splits the documents of several ``data`` lines (``observer.wire.recovery.json_documents``)."""
    from observer.wire.recovery import documents  # here: recovery -> jsonseq -> frames is a cycle

    event, raw, id, retry, size = message
    docs = documents(raw)
    if docs is None:
        return None
    where, each = ("one event's data", "an event") if event is not None else ("one message", "a message")
    detail = f"{len(docs)} JSON documents in {where}, one after another: each read as {each} of its own"
    first = size - sum(len(doc) for doc in docs[1:])
    parts: list[Message] = [(event, docs[0], id, retry, first)]
    parts.extend((event, doc, id, None, len(doc)) for doc in docs[1:])
    return Violation(ViolationKind.NONCONFORMANT_FRAMING, None, detail), parts


def text_message(message: Message) -> tuple[SSEEvent | JSONFrame, Violation | None]:
    """The text form of ``message``: an ``SSEEvent`` when it has an event field, else a
    ``JSONFrame``; with ``data`` and ``event`` UTF-8 decoded, invalid bytes replaced by U+FFFD
    (WHATWG §9.2.5 decodes event streams so; RFC 8259 §8.1 requires UTF-8 of JSON), and then
    the ``invalid_utf8`` violation that goes on record after the message's own events (the
    text on record is not exactly what was sent), else ``None``.

    Its consumer (``observer.tap``) calls it only for data that did not parse as JSON: data that
    is JSON but for lone UTF-16 surrogates (``"\\ud83d"`` without its pair, RFC 8259 §8.2) is
    given as that JSON with U+FFFD in their place (:func:`without_lone_surrogates`), with the
    ``lone_surrogate`` violation instead (its detail then also says when invalid UTF-8 was
    replaced: one violation per message)."""
    event, raw, id, retry, size = message
    bad = None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", "replace")
        bad = Violation(ViolationKind.INVALID_UTF8, None, _INVALID_UTF8)
    if "\\u" in text:
        recovered = without_lone_surrogates(text)
        if recovered is not None:
            text, lone = recovered
            if bad is not None:
                lone = Violation(lone.kind, lone.seq, f"{lone.detail}; {_INVALID_UTF8}")
            bad = lone
    if event is None:
        return JSONFrame(text, size), bad
    try:
        name = event.decode("utf-8")
    except UnicodeDecodeError:
        name = event.decode("utf-8", "replace")
        bad = Violation(ViolationKind.INVALID_UTF8, None, _INVALID_UTF8)
    return SSEEvent(name, text, id, retry, size), bad


class WholeBodyFramer:
    """The whole body as one message at ``close`` (a non-streaming JSON answer), held up to
    ``max_bytes``; a larger body gives one ``oversize_event`` violation and no message."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._buf = bytearray()
        self._over = False

    def feed(self, data: bytes) -> list[Message | Violation]:
        if self._over:
            return []
        if len(self._buf) + len(data) > self._max:
            self._over = True
            self._buf = bytearray()
            return [Violation(ViolationKind.OVERSIZE_EVENT, None, f"JSON body exceeded {self._max} bytes")]
        self._buf += data
        return []

    def close(self) -> list[Message | Violation]:
        if self._over or not self._buf:
            return []
        raw = bytes(self._buf)
        self._buf = bytearray()
        return [(None, raw, None, None, len(raw))]


class EventStreamFramer:
    """AWS event-stream frames (``observer.wire.eventstream``) as messages: one per frame whose
    CRCs matched, ``event`` its name, ``data`` its payload (undecoded), ``size_bytes`` the frame's
    length. The name is the ``:event-type`` header for an ``event`` frame,
    ``exception:<:exception-type>`` for a modelled exception, ``error:<:error-code>`` for an
    unmodelled error, whose ``data`` is then ``{"message": <:error-message>}`` (its payload is
    usually empty). An ``event`` frame without ``:event-type``, or of another message type, is a
    ``malformed_frame`` violation instead of a message; the decoder's own violations pass on.
    Frames are capped at ``max_event_bytes``."""

    def __init__(self, max_event_bytes: int) -> None:
        from observer.wire.eventstream import EventStreamDecoder

        self._decoder = EventStreamDecoder(max_frame_bytes=max_event_bytes)

    def feed(self, data: bytes) -> list[Message | Violation]:
        return self._messages(self._decoder.feed(data))

    def close(self) -> list[Message | Violation]:
        return self._messages(self._decoder.close())

    @property
    def buffered_bytes(self) -> int:
        return self._decoder.buffered_bytes

    @staticmethod
    def _messages(items: list) -> list[Message | Violation]:
        out: list[Message | Violation] = []
        for item in items:
            if isinstance(item, Violation):
                out.append(item)
                continue
            kind, payload = item.message_type or "event", item.payload
            if kind == "event" and item.event_type:
                name = item.event_type
            elif kind == "exception":
                name = f"exception:{item.exception_type or ''}"
            elif kind == "error":
                name = f"error:{item.error_code or ''}"
                payload = orjson.dumps({"message": item.error_message})
            else:
                detail = f"an event-stream frame of :message-type {kind!r} without :event-type: not read"
                if kind != "event":
                    detail = f"an event-stream frame of unknown :message-type {kind!r}: not read"
                out.append(Violation(ViolationKind.MALFORMED_FRAME, None, detail))
                continue
            out.append((name.encode(), payload, None, None, item.size_bytes))
        return out


END_STREAM_EVENT = b"end-stream"
TRAILERS_EVENT = b"trailers"


@dataclass(frozen=True, slots=True)
class BinaryFrame:
    """The message of a binary framing as ``on_message`` gets it when an adapter has no
    ``on_binary``: ``event`` ``""`` for a data message, ``"end-stream"`` (Connect end-stream
    envelope: ``data`` its JSON) or ``"trailers"`` (gRPC-Web trailer frame: ``data`` the JSON of
    its trailer dict); ``data`` the (decompressed) payload, as bytes; ``size_bytes`` on the wire."""

    event: str
    data: bytes
    size_bytes: int


def binary_frame(message: Message) -> BinaryFrame:
    """The ``BinaryFrame`` of a binary framing's message tuple."""
    event, data, _id, _retry, size = message
    return BinaryFrame((event or b"").decode("ascii"), data, size)


class EnvelopeFramer:
    """Connect / gRPC / gRPC-Web envelopes (``observer.wire.envelope``) as messages: one per
    envelope, ``data`` its payload decompressed; ``event`` ``None`` for a data message,
    ``b"end-stream"`` for a Connect end-stream envelope (``data``: its JSON as sent),
    ``b"trailers"`` for a gRPC-Web trailer frame (``data``: the JSON of its trailer dict, keys
    lower-cased, ``grpc-message`` percent-decoded); ``size_bytes`` the envelope's bytes on the
    wire. ``encoding`` is the stream's message encoding (``connect-content-encoding`` /
    ``grpc-encoding``); when the response did not say (``None``), a compressed envelope is read as
    gzip, the encoding every Connect and gRPC implementation sends by default (binary-formats
    §1.2: connectrpc compresses every envelope so). The decoder's violations pass on; envelopes
    are capped at ``max_event_bytes`` (also their decompressed size)."""

    def __init__(self, framing: Framing, max_event_bytes: int, encoding: str | None = None) -> None:
        from observer.wire.envelope import CONNECT, GRPC, GRPC_WEB, EnvelopeDecoder, GrpcWebTextDecoder

        codec = encoding if encoding and encoding.strip() else "gzip"
        if framing is Framing.GRPC_WEB_TEXT:
            self._decoder = GrpcWebTextDecoder(encoding=codec, max_message_bytes=max_event_bytes)
        else:
            protocol = {Framing.CONNECT: CONNECT, Framing.GRPC: GRPC, Framing.GRPC_WEB: GRPC_WEB}[framing]
            self._decoder = EnvelopeDecoder(protocol, codec, max_message_bytes=max_event_bytes)

    def feed(self, data: bytes) -> list[Message | Violation]:
        return self._messages(self._decoder.feed(data))

    def close(self) -> list[Message | Violation]:
        return self._messages(self._decoder.close())

    @property
    def buffered_bytes(self) -> int:
        return self._decoder.buffered_bytes

    @property
    def end_stream_seen(self) -> bool:
        return self._decoder.end_stream_seen

    @staticmethod
    def _messages(items: list) -> list[Message | Violation]:
        out: list[Message | Violation] = []
        for item in items:
            if isinstance(item, Violation):
                out.append(item)
            elif item.trailers is not None:
                out.append((TRAILERS_EVENT, orjson.dumps(item.trailers), None, None, item.size_bytes))
            elif item.end_stream:
                out.append((END_STREAM_EVENT, item.payload, None, None, item.size_bytes))
            else:
                out.append((None, item.payload, None, None, item.size_bytes))
        return out


def make_framer(framing: Framing, *, max_event_bytes: int, max_json_body_bytes: int, encoding: str | None = None):
    """A fresh framer for ``framing``; ``max_event_bytes`` caps one streamed message and
    ``max_json_body_bytes`` a whole non-streaming body (bytes); ``encoding`` is the message
    encoding of an enveloped framing (``EnvelopeFramer``), unused by the others."""
    if framing in _BINARY:
        return EnvelopeFramer(framing, max_event_bytes, encoding)
    if framing is Framing.SSE:
        from observer.wire.sse import SSEDecoder

        return SSEDecoder(max_event_bytes=max_event_bytes)
    if framing is Framing.NDJSON:
        from observer.wire.ndjson import NDJSONDecoder

        return NDJSONDecoder(max_line_bytes=max_event_bytes)
    if framing is Framing.JSON_ARRAY:
        from observer.wire.jsonarray import JSONArrayDecoder

        return JSONArrayDecoder(max_element_bytes=max_event_bytes)
    if framing is Framing.EVENT_STREAM:
        return EventStreamFramer(max_event_bytes)
    return WholeBodyFramer(max_json_body_bytes)
