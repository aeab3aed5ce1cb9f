"""Incremental, sans-IO framing of the SignalR hub protocol: the handshake, JSON records and
MessagePack frames, each record parsed to a :class:`HubMessage`.

Sources:

- dotnet/aspnetcore ``src/SignalR/docs/specs/HubProtocol.md``: "Overview" (the handshake, always
  JSON ending in ``0x1E``), "JSON Encoding" (every message a JSON object terminated by the record
  separator ``0x1E``; the properties of each message type), "MessagePack (MsgPack) encoding" (each
  message one MsgPack array; the layouts below), "Binary encoding" / "VarInt" (``[Length][Body]``
  repeated; Length a VarInt of 1-5 bytes, 7 bits per byte, least significant group first, the high
  bit set on every byte but the last; at most ``0x7fffffff``: ``0xFF 0xFF 0xFF 0xFF 0x07``).
- ``src/SignalR/docs/specs/TransportProtocols.md`` "WebSockets (Full Duplex)": the records travel
  in WebSocket messages (TEXT or BINARY frames); one message may hold several records. The
  transport promises nothing about where a record ends, so a record split over messages is joined
  here (ASP.NET's server reads the transport as a byte pipe; the JS client rejects such a message:
  "Incomplete message.").
- The MessagePack specification (msgpack/msgpack ``spec.md``), read by the ``msgpack`` library.
- ``../shared/reference/binary-formats.md`` §2 (verified peers: pysignalr, ``@microsoft/signalr``).

The observer's WebSocket hook gets whole messages (``websocket_message``); each message's
``content`` of one direction goes into that direction's decoder's :meth:`feed` in order, after the
first one, which is the handshake (:func:`parse_handshake`; its ``rest`` -- records that followed
the ``0x1E`` in the same message -- is fed to the decoder). No I/O, no clock, no module-level
mutable state; no input raises: what cannot be read is a :class:`~observer.records.Violation`.

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object is accepted and copied), split anywhere.
- Output: ``list[HubMessage | Violation]`` in stream order. Concatenating the lists of every
  ``feed`` and the final ``close`` gives the same sequence however the input was split into
  messages or chunks (offsets in details are bytes from the start of what this decoder was fed).
- ``HubMessage.size_bytes``: the record's bytes on the wire: the JSON text and its ``0x1E``; the
  VarInt prefix and the MessagePack body.
- ``max_record_bytes`` (bytes, > 0): bounds one record's body (the JSON text without its ``0x1E``;
  the MessagePack body without its prefix) -- the most a decoder holds between calls (an
  unfinished MessagePack prefix is kept as the number read so far).
- Values inside ``arguments``, ``item``, ``result``: JSON values as orjson gives them (dict, list,
  str, int, float, bool, None); from MessagePack also ``bytes`` (bin), ``msgpack.Timestamp``
  (ext -1, e.g. .NET ``DateTime``) and ``msgpack.ExtType`` (other ext types).

``HubMessage`` fields per type (the table of HubProtocol.md; empty ``headers``/``streamIds`` are
``None`` like absent ones, so a message reads the same from either encoding):

====  ================  ====================================================================
type  name              JSON properties / MessagePack array
====  ================  ====================================================================
1     Invocation        ``invocationId?``, ``target``, ``arguments``, ``streamIds?``, ``headers?`` /
                        ``[1, Headers, InvocationId|nil, Target, [Arguments], [StreamIds]?]``
2     StreamItem        ``invocationId``, ``item`` / ``[2, Headers, InvocationId, Item]``
3     Completion        ``invocationId``, ``result?`` | ``error?`` / ``[3, Headers, InvocationId,
                        ResultKind, Result?]``: ResultKind 1 = error (Result the message), 2 = void,
                        3 = result (``has_result`` tells a ``null`` result from none)
4     StreamInvocation  ``invocationId``, ``target``, ``arguments``, ``streamIds?`` /
                        ``[4, Headers, InvocationId, Target, [Arguments], [StreamIds]?]``
5     CancelInvocation  ``invocationId`` / ``[5, Headers, InvocationId]``
6     Ping              -- / ``[6]`` (the bytes ``0x91 0x06``)
7     Close             ``error?``, ``allowReconnect?`` / ``[7, Error|nil, AllowReconnect?]``
8     Ack               ``sequenceId`` / ``[8, SequenceId]``
9     Sequence          ``sequenceId`` / ``[9, SequenceId]``
====  ================  ====================================================================

Leniency follows the reference implementations (ASP.NET ``JsonHubProtocol`` skips unknown
properties; the JS ``MessagePackHubProtocol`` checks minimum array lengths "to allow protocol to
add items to the end"): unknown JSON properties and extra trailing array elements are ignored;
missing optional trailing elements (StreamIds, AllowReconnect) are absent. Both ignore unknown
message types ("Future protocol changes can add message types"); here an unknown integer type is
kept as ``HubMessage(type=N, raw=<the parsed object>)`` followed by a ``malformed_frame`` violation
saying so, so the record shows it.

Violations (``kind``) and how decoding goes on
----------------------------------------------
- ``invalid_json``: a JSON record (or handshake) that is not JSON (orjson's message; also invalid
  UTF-8, an integer beyond 64 bits, nesting deeper than 1024).
- ``malformed_frame``: a record that is not a hub message (not an object/array, no integer
  ``type``, a required field missing or of the wrong type, both ``result`` and ``error``); a
  MessagePack body that ``msgpack`` rejects (truncated, extra bytes after the array, invalid
  UTF-8, nesting too deep) or that is empty; a bad VarInt prefix (a fifth byte with its high bit
  set -- a 6-byte VarInt -- or above 7: a length of 2 GB or more); an unknown type (kept, above).
- ``oversize_event``: a record body longer than ``max_record_bytes``.
- ``unterminated_final_event`` at ``close``: the stream ended inside a record (JSON text without
  its ``0x1E``; a MessagePack prefix or body cut short). The partial record is not parsed: a
  record is accepted only whole.

Resynchronisation. A bad *record* never costs the next one: in JSON the ``0x1E`` ends every record
(RS is a control character, which RFC 8259 §7 forbids unescaped in strings and does not count as
whitespace, so valid JSON never contains it), and decoding resumes after it; an oversize JSON
record is dropped as it arrives (nothing held) up to its ``0x1E``. In MessagePack a frame's length
is known from its prefix, so a body that does not decode, or an oversize one (skipped by count,
nothing held), is passed over and the next frame read. Only a bad *prefix* loses the framing: the
MessagePack framing has no marker to find the next frame by (``0x1E`` means nothing there, and any
byte pattern can occur inside bodies -- a guess could invent messages out of a payload's bytes, a
text containing ``0x91 0x06`` would become a Ping), so the decoder **stops cleanly**: one
``malformed_frame`` violation, everything after it ignored (counted in ``ignored_bytes``), and the
consumer records the stream as unreadable from there. ASP.NET and the JS client close the
connection on such a prefix (``FormatException("Messages over 2GB in size are not supported.")``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from observer.records import Violation, ViolationKind
from observer.wire.frames import nbytes, positive_size

__all__ = [
    "Handshake",
    "HubMessage",
    "HubMessageType",
    "HubProtocol",
    "JsonRecordDecoder",
    "MessagePackDecoder",
    "RECORD_SEPARATOR",
    "decoder_for",
    "parse_handshake",
]

RECORD_SEPARATOR = b"\x1e"  # ASCII RS: ends every JSON record and the handshake
_MAX_PREFIX_BYTES = 5  # VarInt length prefix: 1-5 bytes
_MAX_HANDSHAKE_BYTES = 4096  # a handshake record is ~40 bytes


class HubProtocol(enum.StrEnum):
    """The hub protocol named in the handshake request (``protocol``)."""

    JSON = "json"
    MESSAGEPACK = "messagepack"


class HubMessageType(enum.IntEnum):
    """The ``type`` of a hub message (HubProtocol.md, "Overview" table)."""

    INVOCATION = 1
    STREAM_ITEM = 2
    COMPLETION = 3
    STREAM_INVOCATION = 4
    CANCEL_INVOCATION = 5
    PING = 6
    CLOSE = 7
    ACK = 8
    SEQUENCE = 9


_TYPE_NAMES = ("", *(t.name.title().replace("_", "") for t in HubMessageType))  # index = type


@dataclass(frozen=True, slots=True)
class Handshake:
    """A handshake record (HubProtocol.md "Overview").

    - ``request``: True for the client's ``{"protocol": NAME, "version": N}``, False for the
      server's ``{}`` / ``{"error": TEXT}``.
    - ``protocol``: the requested protocol, or ``None`` for a name this module does not decode
      (``protocol_name`` then says which, e.g. ``"blazorpack"``); ``None`` in a response.
    - ``version``: the requested version (1; 2 from clients that offer stateful reconnect, e.g.
      ``@microsoft/signalr`` 10 with ``withStatefulReconnect``); ``None`` in a response.
    - ``error``: the server's refusal, e.g. ``"Requested protocol 'messagepack' is not available."``;
      ``None`` when it accepted (and in a request).
    - ``size_bytes``: the handshake's bytes, its ``0x1E`` included.
    - ``rest``: the bytes after the ``0x1E`` in the same message: hub records, to be fed to the
      decoder of the agreed protocol.
    """

    request: bool
    protocol: HubProtocol | None = None
    protocol_name: str | None = None
    version: int | None = None
    error: str | None = None
    size_bytes: int = 0
    rest: bytes = b""


@dataclass(slots=True)
class HubMessage:
    """One hub message (see the module docstring's table for which fields each type has); a
    value object: read it, do not change it (not frozen only because a frozen dataclass costs
    ~1.6 µs more per message to build, on the WebSocket relay path).

    ``invocation_id``, ``target``, ``error`` (Completion, Close): strings or ``None``;
    ``arguments``: the argument list (Invocation, StreamInvocation); ``item`` (StreamItem);
    ``result`` with ``has_result`` (Completion: ``result`` is meaningful only when ``has_result``);
    ``stream_ids`` (list of str), ``headers`` (dict str -> str): ``None`` when absent or empty;
    ``allow_reconnect`` (Close; ``None`` when absent); ``sequence_id`` (Ack, Sequence);
    ``size_bytes``: the record's bytes on the wire; ``raw``: the parsed JSON object or MessagePack
    array of a message of unknown type (``None`` for the known ones).
    """

    type: int
    invocation_id: str | None = None
    target: str | None = None
    arguments: list[Any] | None = None
    item: Any = None
    result: Any = None
    has_result: bool = False
    error: str | None = None
    stream_ids: list[str] | None = None
    headers: dict[str, str] | None = None
    allow_reconnect: bool | None = None
    sequence_id: int | None = None
    size_bytes: int = 0
    raw: Any = None


def _violation(kind: ViolationKind, detail: str) -> Violation:
    return Violation(kind=kind, seq=None, detail=detail)


def _malformed(detail: str) -> Violation:
    return Violation(kind=ViolationKind.MALFORMED_FRAME, seq=None, detail=detail)


def _type_name(t: int) -> str:
    return f"type {t} ({_TYPE_NAMES[t]})"


# -- the handshake ---------------------------------------------------------------------------------


def parse_handshake(content: bytes, *, max_bytes: int = _MAX_HANDSHAKE_BYTES) -> Handshake | Violation:
    """The handshake at the start of ``content`` (the first WebSocket message of one direction,
    TEXT or BINARY: pysignalr sends the messagepack request as BINARY, the JS client as TEXT).

    A request has a string ``protocol`` and an integer ``version``; anything else without
    ``protocol`` is a response (``error``: a string or absent/null). Unknown properties are ignored
    (``minorVersion`` of old servers). Returns a :class:`Violation` instead when the message has no
    ``0x1E`` within ``max_bytes`` bytes (``malformed_frame``; ``oversize_event`` when the message is
    longer and the RS comes later or never), is not JSON (``invalid_json``), is not an object, is a
    hub message (has ``type``: ASP.NET's client refuses it so) or has fields of the wrong type
    (``malformed_frame``). A handshake split over two messages (not seen from real peers) is not
    joined here: a caller may join them (bounded) and call again. Never raises."""
    if not isinstance(content, bytes):
        content = bytes(content)
    end = content.find(RECORD_SEPARATOR, 0, max_bytes + 1)
    if end < 0:
        if len(content) > max_bytes:
            return _violation(ViolationKind.OVERSIZE_EVENT, f"handshake exceeded {max_bytes} bytes without its 0x1E")
        return _malformed(f"no 0x1E in the message ({nbytes(len(content))}): not a whole SignalR handshake")
    try:
        obj = orjson.loads(content[:end])
    except orjson.JSONDecodeError as exc:
        return _violation(ViolationKind.INVALID_JSON, f"handshake is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return _malformed("handshake is not a JSON object")
    if "type" in obj:
        return _malformed("a hub message (it has 'type'), not a handshake")
    rest = content[end + 1 :]
    if "protocol" in obj:
        name = obj["protocol"]
        version = obj.get("version")
        if not isinstance(name, str):
            return _malformed("handshake request: 'protocol' must be a string")
        if version.__class__ is not int:
            return _malformed("handshake request: 'version' must be an integer")
        try:
            protocol: HubProtocol | None = HubProtocol(name)
        except ValueError:
            protocol = None
        return Handshake(True, protocol, name, version, None, end + 1, rest)
    error = obj.get("error")
    if error is not None and not isinstance(error, str):
        return _malformed("handshake response: 'error' must be a string")
    return Handshake(False, error=error, size_bytes=end + 1, rest=rest)


# -- validation shared by both encodings -----------------------------------------------------------


def _headers(value: Any, where: str) -> dict[str, str] | None | Violation:
    """``None`` for absent/empty headers, the dict when every key and value is a string."""
    if value is None or value == {}:
        return None
    if value.__class__ is not dict or not all(k.__class__ is str and v.__class__ is str for k, v in value.items()):
        return _malformed(f"{where}: headers must map strings to strings")
    return value


def _stream_ids(value: Any, where: str) -> list[str] | None | Violation:
    if value is None or value == []:
        return None
    if value.__class__ is not list or not all(s.__class__ is str for s in value):
        return _malformed(f"{where}: streamIds must be an array of strings")
    return value


def _build(
    t: int,
    invocation_id: Any,
    target: Any,
    arguments: Any,
    stream_ids: Any,
    headers: Any,
    size: int,
    where: str,
) -> HubMessage | Violation:
    """An Invocation (1) or StreamInvocation (4) from its fields, checked."""
    if invocation_id is not None and invocation_id.__class__ is not str:
        return _malformed(f"{where}: invocationId must be a string")
    if t == 4 and invocation_id is None:
        return _malformed(f"{where}: invocationId is required")
    if target.__class__ is not str:
        return _malformed(f"{where}: target must be a string")
    if arguments.__class__ is not list:
        return _malformed(f"{where}: arguments must be an array")
    ids = _stream_ids(stream_ids, where)
    if ids.__class__ is Violation:
        return ids  # type: ignore[return-value]
    hdrs = _headers(headers, where)
    if hdrs.__class__ is Violation:
        return hdrs  # type: ignore[return-value]
    return HubMessage(t, invocation_id, target, arguments, stream_ids=ids, headers=hdrs, size_bytes=size)  # type: ignore[arg-type]


def _sequence_id(value: Any, where: str) -> int | Violation:
    if value.__class__ is not int or value < 0:
        return _malformed(f"{where}: sequenceId must be a non-negative integer")
    return value


def _unknown(t: int, raw: Any, size: int, out: list) -> None:
    """A message of a type this module does not know: kept whole, then said so."""
    out.append(HubMessage(t, size_bytes=size, raw=raw))
    out.append(_malformed(f"unknown hub message type {t}: kept uninterpreted"))


# -- JSON ----------------------------------------------------------------------------------------


def _json_message(obj: Any, size: int, out: list) -> None:
    """Appends the HubMessage of one parsed JSON record (or a violation) to ``out``."""
    if obj.__class__ is not dict:
        out.append(_malformed("JSON hub record is not an object"))
        return
    t = obj.get("type")
    if t.__class__ is not int:
        out.append(_malformed("JSON hub record has no integer 'type'"))
        return
    if not 1 <= t <= 9:
        _unknown(t, obj, size, out)
        return
    where = f"JSON hub message {_type_name(t)}"
    get = obj.get
    msg: HubMessage | Violation
    if t == 1 or t == 4:
        msg = _build(
            t, get("invocationId"), get("target"), get("arguments"), get("streamIds"), get("headers"), size, where
        )
    elif t == 6:
        msg = HubMessage(6, size_bytes=size)
    elif t == 7:
        error = get("error")
        allow = get("allowReconnect")
        if error is not None and error.__class__ is not str:
            msg = _malformed(f"{where}: error must be a string")
        elif allow is not None and allow.__class__ is not bool:
            msg = _malformed(f"{where}: allowReconnect must be a boolean")
        else:
            msg = HubMessage(7, error=error, allow_reconnect=allow, size_bytes=size)
    elif t >= 8:
        sid = _sequence_id(get("sequenceId"), where)
        msg = sid if sid.__class__ is Violation else HubMessage(t, sequence_id=sid, size_bytes=size)  # type: ignore[assignment,arg-type]
    else:  # 2, 3, 5: an invocation id is required
        iid = get("invocationId")
        hdrs = _headers(get("headers"), where)
        if iid.__class__ is not str:
            msg = _malformed(f"{where}: invocationId must be a string")
        elif hdrs.__class__ is Violation:
            msg = hdrs  # type: ignore[assignment]
        elif t == 2:
            msg = (
                HubMessage(2, iid, item=obj["item"], headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
                if "item" in obj
                else _malformed(f"{where}: item is required")
            )
        elif t == 5:
            msg = HubMessage(5, iid, headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
        else:
            error = get("error")
            has_result = "result" in obj
            if error is not None and error.__class__ is not str:
                msg = _malformed(f"{where}: error must be a string")
            elif error is not None and has_result:
                msg = _malformed(f"{where}: both result and error (a protocol error)")
            else:
                msg = HubMessage(
                    3,
                    iid,
                    result=get("result"),
                    has_result=has_result,
                    error=error,
                    headers=hdrs,
                    size_bytes=size,  # type: ignore[arg-type]
                )
    out.append(msg)


class JsonRecordDecoder:
    """Incremental decoder of the JSON hub protocol: records ending in ``0x1E``, each parsed with
    orjson to a :class:`HubMessage` (see the module docstring for the rules).

    A record may span messages: its bytes are held (at most ``max_record_bytes``) until its
    ``0x1E`` arrives. Cost: each input byte is searched once by C code (``bytes.split``); each
    record is parsed once, when whole; Python work is per record.
    """

    __slots__ = ("_max", "_partial", "_skipping", "_closed")

    def __init__(self, max_record_bytes: int = 1 << 20) -> None:
        """Raises ``ValueError`` if ``max_record_bytes`` is not a positive int."""
        self._max = positive_size(max_record_bytes, "max_record_bytes")
        self._partial = bytearray()  # the current record's bytes from earlier calls (no RS yet)
        self._skipping = False  # dropping an oversize record up to its RS
        self._closed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished record currently held. Diagnostic."""
        return len(self._partial)

    def feed(self, data: bytes) -> list[HubMessage | Violation]:
        """Consumes the next bytes (normally one WebSocket message's content) and returns the
        messages and violations of the records they completed, in order. Raises ``ValueError``
        if called after :meth:`close` (a caller's mistake, not an input's)."""
        if self._closed:
            raise ValueError("JsonRecordDecoder.feed() called after close()")
        if not isinstance(data, bytes):
            data = bytes(data)
        out: list[HubMessage | Violation] = []
        partial = self._partial
        limit = self._max
        if RECORD_SEPARATOR not in data:
            if self._skipping:
                return out
            if len(partial) + len(data) > limit:
                out.append(self._oversize())
                partial.clear()
                self._skipping = True
            else:
                partial += data
            return out
        records = data.split(RECORD_SEPARATOR)
        tail = records.pop()  # after the last RS: the start of the next record (often b"")
        first = records[0]
        if self._skipping:
            records[0] = None  # type: ignore[call-overload]  # the end of an oversize record, already reported
            self._skipping = False
        elif partial:
            if len(partial) + len(first) > limit:
                records[0] = None  # type: ignore[call-overload]  # oversize: reported here
                out.append(self._oversize())
            else:
                partial += first
                records[0] = bytes(partial)
            partial.clear()
        loads = orjson.loads
        for raw in records:
            if raw is None:
                continue
            size = len(raw) + 1
            if size > limit + 1:
                out.append(self._oversize())
                continue
            try:
                obj = loads(raw)
            except orjson.JSONDecodeError as exc:
                out.append(_violation(ViolationKind.INVALID_JSON, f"JSON hub record is not valid JSON: {exc}"))
                continue
            _json_message(obj, size, out)
        if tail:
            if len(tail) > limit:
                out.append(self._oversize())
                self._skipping = True
            else:
                partial += tail
        return out

    def close(self) -> list[HubMessage | Violation]:
        """Signals the end of the stream (the socket closed). Idempotent (then ``[]``).

        Bytes of a record without its ``0x1E`` give ``unterminated_final_event`` (the record is
        not parsed); only JSON whitespace pending, or an oversize record being dropped (already
        reported), gives ``[]``."""
        if self._closed:
            return []
        self._closed = True
        pending = bytes(self._partial)
        self._partial.clear()
        self._skipping = False
        if pending.strip(b" \t\r\n"):
            return [
                _violation(
                    ViolationKind.UNTERMINATED_FINAL_EVENT,
                    f"stream ended inside a JSON hub record ({nbytes(len(pending))} pending without 0x1E, not parsed)",
                )
            ]
        return []

    def _oversize(self) -> Violation:
        # The same detail wherever the overflow was noticed (independent of the split).
        return _violation(ViolationKind.OVERSIZE_EVENT, f"JSON hub record exceeded {self._max} bytes")


# -- MessagePack -----------------------------------------------------------------------------------


def _msgpack_message(arr: Any, size: int, out: list) -> None:
    """Appends the HubMessage of one decoded MessagePack body (or a violation) to ``out``."""
    if arr.__class__ is not list or not arr:
        out.append(_malformed("MessagePack hub body is not a non-empty array"))
        return
    t = arr[0]
    if t.__class__ is not int:
        out.append(_malformed("MessagePack hub body: element 0 (the type) is not an integer"))
        return
    if not 1 <= t <= 9:
        _unknown(t, arr, size, out)
        return
    where = f"MessagePack hub message {_type_name(t)}"
    n = len(arr)
    msg: HubMessage | Violation
    # Minimum lengths as the JS client checks them (trailing optional elements may be absent).
    if n < (0, 5, 4, 4, 5, 3, 1, 2, 2, 2)[t]:
        msg = _malformed(f"{where}: {n} array element{'s' if n != 1 else ''}, too few")
    elif t == 1 or t == 4:
        msg = _build(t, arr[2], arr[3], arr[4], arr[5] if n > 5 else None, arr[1], size, where)
    elif t == 6:
        msg = HubMessage(6, size_bytes=size)
    elif t == 7:
        error = arr[1]
        allow = arr[2] if n > 2 else None
        if error is not None and error.__class__ is not str:
            msg = _malformed(f"{where}: error must be a string or nil")
        elif allow is not None and allow.__class__ is not bool:
            msg = _malformed(f"{where}: allowReconnect must be a boolean")
        else:
            msg = HubMessage(7, error=error, allow_reconnect=allow, size_bytes=size)
    elif t >= 8:
        sid = _sequence_id(arr[1], where)
        msg = sid if sid.__class__ is Violation else HubMessage(t, sequence_id=sid, size_bytes=size)  # type: ignore[assignment,arg-type]
    else:  # 2, 3, 5: [t, Headers, InvocationId, ...]
        hdrs = _headers(arr[1], where)
        iid = arr[2]
        if hdrs.__class__ is Violation:
            msg = hdrs  # type: ignore[assignment]
        elif iid.__class__ is not str:
            msg = _malformed(f"{where}: invocationId must be a string")
        elif t == 2:
            msg = HubMessage(2, iid, item=arr[3], headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
        elif t == 5:
            msg = HubMessage(5, iid, headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
        else:
            kind = arr[3]
            if kind == 2 and kind.__class__ is int:
                msg = HubMessage(3, iid, headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
            elif kind.__class__ is not int or kind not in (1, 3):
                msg = _malformed(f"{where}: ResultKind must be 1, 2 or 3")
            elif n < 5:
                msg = _malformed(f"{where}: ResultKind {kind} without its Result")
            elif kind == 3:
                msg = HubMessage(3, iid, result=arr[4], has_result=True, headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
            elif arr[4].__class__ is not str:
                msg = _malformed(f"{where}: the error (ResultKind 1) must be a string")
            else:
                msg = HubMessage(3, iid, error=arr[4], headers=hdrs, size_bytes=size)  # type: ignore[arg-type]
    out.append(msg)


def _unpack(body: bytes) -> Any:
    """``body`` as exactly one MessagePack object, every length bounded by the body's own size
    (no allocation beyond what the bytes can hold). Raises what ``msgpack`` raises."""
    n = len(body)
    return msgpack.unpackb(
        body,
        raw=False,  # str as UTF-8 (invalid UTF-8 raises), bin as bytes
        strict_map_key=False,  # .NET dictionaries may have integer keys
        max_str_len=n,
        max_bin_len=n,
        max_array_len=n,
        max_map_len=n // 2,
        max_ext_len=n,
    )


class MessagePackDecoder:
    """Incremental decoder of the MessagePack hub protocol: ``[VarInt length][body]`` frames,
    several per message or one spanning messages, each body decoded with ``msgpack`` to a
    :class:`HubMessage` (see the module docstring for the rules). It never looks for ``0x1E``.

    Holds at most ``max_record_bytes`` of an unfinished body (an unfinished prefix is kept as the
    number read so far).
    Cost: a body wholly inside one input is sliced out once (no copy into a buffer); a body
    spanning inputs is appended to a buffer as its pieces arrive (linear); Python work is per
    frame plus one step per prefix byte (1-5).
    """

    __slots__ = ("_max", "_pos", "_value", "_shift", "_prefix", "_length", "_at", "_body", "_skip", "_dead", "_closed")

    def __init__(self, max_record_bytes: int = 1 << 20) -> None:
        """Raises ``ValueError`` if ``max_record_bytes`` is not a positive int."""
        self._max = positive_size(max_record_bytes, "max_record_bytes")
        self._pos = 0  # bytes consumed so far (offsets in details)
        self._value = 0  # the prefix value read so far
        self._shift = 0
        self._prefix = 0  # prefix bytes read so far of the current frame (0 = between frames)
        self._length = -1  # the current frame's body length once its prefix is complete, else -1
        self._at = 0  # offset of the current frame's first byte
        self._body = bytearray()  # the current body's bytes from earlier calls
        self._skip = 0  # bytes still to drop of an oversize body
        self._dead = 0  # > 0 after a bad prefix: bytes ignored since (the framing is lost)
        self._closed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished frame currently held (its body; the prefix is kept as a
        number). Diagnostic."""
        return len(self._body)

    @property
    def ignored_bytes(self) -> int:
        """Bytes not decoded after a bad length prefix stopped the decoder (0 while it runs)."""
        return max(self._dead - 1, 0)

    def feed(self, data: bytes) -> list[HubMessage | Violation]:
        """Consumes the next bytes (normally one WebSocket BINARY message's content) and returns
        the messages and violations of the frames they completed, in order. Raises
        ``ValueError`` if called after :meth:`close` (a caller's mistake, not an input's)."""
        if self._closed:
            raise ValueError("MessagePackDecoder.feed() called after close()")
        if not isinstance(data, bytes):
            data = bytes(data)
        out: list[HubMessage | Violation] = []
        n = len(data)
        if self._dead:
            self._dead += n
            return out
        i = 0
        base = self._pos
        while i < n:
            length = self._length
            if self._skip:
                # An oversize body (reported): drop it by count, hold nothing.
                take = min(self._skip, n - i)
                self._skip -= take
                i += take
            elif length < 0:
                # The VarInt prefix: 7 bits per byte, least significant first, high bit = more.
                if not self._prefix:
                    self._at = base + i
                byte = data[i]
                i += 1
                self._prefix += 1
                if self._prefix == _MAX_PREFIX_BYTES and byte > 7:
                    # A fifth byte with its high bit set (a 6-byte VarInt) or a length >= 2 GB.
                    what = "a 6-byte VarInt" if byte & 0x80 else "a length of 2 GB or more"
                    out.append(
                        _malformed(
                            f"MessagePack frame at byte {self._at}: bad length prefix ({what}); "
                            "the framing is lost, the rest of the stream is not decoded"
                        )
                    )
                    self._dead = 1 + n - i
                    self._body.clear()
                    break
                self._value |= (byte & 0x7F) << self._shift
                self._shift += 7
                if byte & 0x80:
                    continue
                length = self._value
                self._value = self._shift = 0
                if length > self._max:
                    out.append(
                        _violation(ViolationKind.OVERSIZE_EVENT, f"MessagePack hub body exceeded {self._max} bytes")
                    )
                    self._skip = length
                    self._prefix = 0
                elif not length:
                    out.append(_malformed(f"MessagePack frame at byte {self._at}: empty body"))
                    self._prefix = 0
                else:
                    self._length = length
            else:
                body = self._body
                if not body and n - i >= length:
                    raw = data[i : i + length]  # the whole body is here: one slice
                    i += length
                else:
                    take = min(length - len(body), n - i)
                    body += data[i : i + take]
                    i += take
                    if len(body) < length:
                        break
                    raw = bytes(body)
                    body.clear()
                size = self._prefix + length
                self._length = -1
                self._prefix = 0
                try:
                    obj = _unpack(raw)
                except Exception as exc:  # any msgpack failure is the input's: reported, never raised
                    reason = str(exc) or type(exc).__name__
                    out.append(_malformed(f"MessagePack frame at byte {self._at}: body does not decode ({reason})"))
                    continue
                _msgpack_message(obj, size, out)
        self._pos = base + n
        return out

    def close(self) -> list[HubMessage | Violation]:
        """Signals the end of the stream (the socket closed). Idempotent (then ``[]``).

        A frame cut short (inside its prefix or body) gives ``unterminated_final_event`` (not
        decoded); between frames, inside an oversize body (already reported) or after a bad
        prefix (already reported) it gives ``[]``."""
        if self._closed:
            return []
        self._closed = True
        out: list[HubMessage | Violation] = []
        if not self._dead and not self._skip:
            if self._length >= 0:
                got = len(self._body)
                detail = f"stream ended inside a MessagePack frame at byte {self._at} ({got} of {nbytes(self._length)} of its body, not decoded)"
                out.append(_violation(ViolationKind.UNTERMINATED_FINAL_EVENT, detail))
            elif self._prefix:
                detail = f"stream ended inside the length prefix of a MessagePack frame at byte {self._at}"
                out.append(_violation(ViolationKind.UNTERMINATED_FINAL_EVENT, detail))
        self._body.clear()
        return out


def decoder_for(protocol: HubProtocol, max_record_bytes: int = 1 << 20) -> JsonRecordDecoder | MessagePackDecoder:
    """A fresh decoder for the protocol a handshake agreed on."""
    if protocol is HubProtocol.MESSAGEPACK:
        return MessagePackDecoder(max_record_bytes)
    return JsonRecordDecoder(max_record_bytes)
