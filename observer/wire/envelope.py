"""Incremental, sans-IO decoder of the 5-byte message envelope of Connect, gRPC and gRPC-Web.

Cuts a streaming RPC body into its messages and undoes per-message compression; it does **not**
decode protobuf (``observer.wire.protobuf``) or JSON (the dialect's job).

Sources: connectrpc ``docs/protocol.md`` ("Streaming-RPC", "Envelope", "Error end-of-stream");
grpc/grpc ``doc/PROTOCOL-HTTP2.md`` ("Length-Prefixed-Message", "Status-Message"
percent-encoding), ``doc/PROTOCOL-WEB.md`` (trailer frames, ``application/grpc-web-text``),
``doc/compression.md``; the project reference ``binary-formats.md`` §4.

Envelope
--------
``flags u8 | length u32 (big-endian) | message (length bytes)``

- ``0x01`` (all three protocols): the message is compressed with the stream's encoding
  (Connect ``connect-content-encoding``, gRPC ``grpc-encoding``); each message is compressed on its
  own (no context carries across messages), so each gets a fresh decoder
  (``observer.wire.content.make_decoder``, bounded: ``max_message_bytes`` of output and
  ``max_decode_ratio`` x the compressed size plus a 1 MiB allowance).
- ``0x02`` (Connect, responses only): the *EndStreamResponse*, a JSON object (``{}``, or
  ``{"error": {"code", "message", "details"}, "metadata": {...}}``) even in a proto stream; it
  must be the last envelope. Its payload is returned as bytes; :func:`end_stream_error` reads it.
- ``0x80`` (gRPC-Web): a trailer frame (``0x81`` compressed), HTTP/1-style ``key: value\\r\\n``
  lines; parsed into ``Envelope.trailers`` (keys lower-cased, repeated keys joined with ``,``,
  ``grpc-message`` percent-decoded). Also the last envelope.
- Every other bit is reserved: Connect ``0x01``/``0x02`` only (``0x02`` not on requests), gRPC
  the values 0 and 1 only, gRPC-Web 0, 1, ``0x80``, ``0x81`` only.

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object), split anywhere; output of ``feed``/``close``:
  ``list[Envelope | Violation]`` in stream order, the same however the input was split.
- ``Envelope``: ``flags`` (the wire byte), ``payload`` (``bytes``, decompressed),
  ``size_bytes`` (``5 + length``: bytes on the wire, compressed), ``end_stream`` (Connect
  ``0x02`` or gRPC-Web ``0x80``), ``trailers`` (``dict[str, str]`` of a gRPC-Web trailer frame,
  else ``None``).
- ``max_message_bytes`` bounds both the wire length and the decompressed size of one message.
  Byte offsets in violation details count from the start of the (binary) stream.

Errors (all reported as ``Violation``; nothing raises but ``feed`` after ``close``)
-------------------------------------------------------------------------------
- Reserved flags (``malformed_frame``): the prefix cannot be trusted (most likely the stream is
  not enveloped at all, or is out of step), and there is no checksum to resynchronise on: the
  decoder **stops**; later input is dropped unread.
- ``length > max_message_bytes`` (``oversize_event``): the length is all an envelope has to go
  by, so its bytes are dropped as they arrive (never held) and decoding goes on after them (an
  end-stream envelope dropped so still ends the stream).
- Compressed flag without a usable encoding (none, ``identity``, or one ``make_decoder`` does not
  know, e.g. ``snappy``), corrupt compressed data, a compressed message that stops before its
  end marker, or output past the bounds (a decompression bomb: ``decompression_limit``):
  ``content_decoding_error``; the message is dropped and decoding goes on with the next one.
  An end envelope whose payload cannot be decompressed is still returned (``payload`` ``b""``,
  ``trailers`` ``{}`` for gRPC-Web), after the violation, so that the end is seen.
- A gRPC-Web trailer line without a colon (``malformed_frame``): ignored, reported once per frame.
- Bytes after the end envelope (``malformed_frame``): reported once, dropped.
- End of stream inside an envelope (``unterminated_final_event``) at ``close``. A body with no end
  envelope at all is not a framing error (gRPC ends with HTTP/2 trailers; Cursor keeps the
  stream open): ``end_stream_seen`` tells the caller.

Bounds: between calls at most one envelope (``5 + max_message_bytes``) is held
(``buffered_bytes``); :class:`GrpcWebTextDecoder` adds at most 3 base64 characters.
"""

from __future__ import annotations

import binascii
import enum
import json
import struct
from collections.abc import Iterable, Mapping
from typing import NamedTuple
from urllib.parse import unquote

from observer.errors import ContentDecodingError, UnsupportedEncoding
from observer.records import Violation, ViolationKind
from observer.wire.content import make_decoder
from observer.wire.frames import nbytes, positive_size

__all__ = [
    "CONNECT",
    "GRPC",
    "GRPC_WEB",
    "Envelope",
    "EnvelopeDecoder",
    "EnvelopeProtocol",
    "GrpcWebTextDecoder",
    "end_stream_error",
    "grpc_status",
    "parse_trailers",
    "protocol_for",
]

PREFIX_BYTES = 5
FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02  # Connect
FLAG_TRAILERS = 0x80  # gRPC-Web
DEFAULT_MAX_MESSAGE_BYTES = 16 << 20  # a public Windsurf client's bound (reference §4.4)
DEFAULT_MAX_DECODE_RATIO = 100

_LEN = struct.Struct(">I")


class EnvelopeProtocol(enum.StrEnum):
    """Which protocol's flag rules apply."""

    CONNECT = "connect"
    GRPC = "grpc"
    GRPC_WEB = "grpc-web"


CONNECT = EnvelopeProtocol.CONNECT
GRPC = EnvelopeProtocol.GRPC
GRPC_WEB = EnvelopeProtocol.GRPC_WEB


def protocol_for(content_type: str | None) -> tuple[EnvelopeProtocol, bool] | None:
    """``(protocol, text)`` for an enveloped streaming media type, else ``None`` (a Connect
    unary ``application/proto``/``json`` body has no envelope). ``text`` is true for
    ``application/grpc-web-text`` (base64: :class:`GrpcWebTextDecoder`)."""
    mt = (content_type or "").split(";", 1)[0].strip().lower()
    if mt.startswith("application/connect+"):
        return CONNECT, False
    if mt.startswith("application/grpc-web-text"):
        return GRPC_WEB, True
    if mt.startswith("application/grpc-web"):
        return GRPC_WEB, False
    if mt == "application/grpc" or mt.startswith("application/grpc+"):
        return GRPC, False
    return None


class Envelope(NamedTuple):
    """One enveloped message (module docstring: shapes). Immutable; a ``NamedTuple`` rather than
    a dataclass because one is made per message (a tuple is made several times faster)."""

    flags: int
    payload: bytes
    size_bytes: int
    end_stream: bool = False
    trailers: dict[str, str] | None = None

    @property
    def compressed(self) -> bool:
        """The ``0x01`` flag (``payload`` is already decompressed)."""
        return bool(self.flags & FLAG_COMPRESSED)

    def grpc_status(self) -> tuple[int | None, str | None]:
        """``(grpc-status, grpc-message)`` of a gRPC-Web trailer frame (``(None, None)``
        otherwise); the message was percent-decoded with the trailers."""
        if self.trailers is None:
            return None, None
        return grpc_status(self.trailers, percent_encoded=False)


def _allowed_flags(protocol: EnvelopeProtocol, request: bool) -> frozenset[int]:
    if protocol is EnvelopeProtocol.CONNECT:
        return frozenset({0, 1}) if request else frozenset({0, 1, 2, 3})
    if protocol is EnvelopeProtocol.GRPC:
        return frozenset({0, 1})
    return frozenset({0, 1, 0x80, 0x81})


class EnvelopeDecoder:
    """Incremental envelope decoder (rules in the module docstring).

    ``protocol``: an ``EnvelopeProtocol`` (or its value); ``encoding``: the stream's message
    encoding (``connect-content-encoding`` / ``grpc-encoding``: ``gzip``, ``br``, ``zstd``,
    ``deflate``, ``identity`` or ``None``; any other name makes compressed messages a
    violation); ``request``: decoding a request stream (Connect forbids ``0x02`` there);
    ``max_message_bytes`` (> 0) and ``max_decode_ratio`` (>= 1) bound one message.
    Raises ``ValueError`` for a bad bound or protocol.
    """

    __slots__ = (
        "_protocol",
        "_allowed",
        "_encoding",
        "_codec_error",
        "_max",
        "_ratio",
        "_buf",
        "_offset",
        "_skip",
        "_skip_end",
        "_ended",
        "_after_end",
        "_stopped",
        "_closed",
        "_idle",
    )

    def __init__(
        self,
        protocol: EnvelopeProtocol | str = CONNECT,
        encoding: str | None = None,
        *,
        request: bool = False,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_decode_ratio: int = DEFAULT_MAX_DECODE_RATIO,
    ) -> None:
        self._protocol = EnvelopeProtocol(protocol)
        self._allowed = _allowed_flags(self._protocol, request)
        self._max = positive_size(max_message_bytes, "max_message_bytes")
        self._ratio = positive_size(max_decode_ratio, "max_decode_ratio")
        name = (encoding or "").strip().lower()
        self._encoding = None if name in ("", "identity") else name
        self._codec_error: str | None = None
        if self._encoding is None:
            self._codec_error = "no message encoding was declared"
        else:
            try:
                make_decoder(self._encoding)
            except UnsupportedEncoding:
                self._codec_error = f"unsupported message encoding {self._encoding!r}"
        self._buf = bytearray()
        self._offset = 0  # stream offset of _buf[0]
        self._skip = 0  # bytes of an oversize envelope still to drop
        self._skip_end = False  # the envelope being skipped is an end envelope
        self._ended = False  # the end envelope was seen
        self._after_end = False  # bytes after it were reported
        self._stopped = False  # reserved flags: decoding stopped
        self._closed = False
        self._idle = True  # nothing held or skipped, not ended, stopped or closed

    @property
    def buffered_bytes(self) -> int:
        """Bytes of input currently held (one partial envelope at most)."""
        return len(self._buf)

    @property
    def end_stream_seen(self) -> bool:
        """True once the protocol's end envelope (Connect ``0x02``, gRPC-Web ``0x80``) was read."""
        return self._ended

    def feed(self, data: bytes) -> list[Envelope | Violation]:
        """Consumes the next chunk; returns the envelopes and violations it completed. Raises
        ``ValueError`` if called after :meth:`close`.

        The commonest chunk, exactly one whole uncompressed data envelope (servers flush one
        message per write) arriving while nothing is held, is handled first, in few steps."""
        if self._idle and data.__class__ is bytes and len(data) >= PREFIX_BYTES and data[0] == 0:
            size = len(data)
            if size == PREFIX_BYTES + _LEN.unpack_from(data, 1)[0] and size - PREFIX_BYTES <= self._max:
                self._offset += size
                return [Envelope(0, data[PREFIX_BYTES:], size)]
        out = self._feed(data)
        self._idle = not (self._buf or self._skip or self._ended or self._stopped or self._closed)
        return out

    def _feed(self, data: bytes) -> list[Envelope | Violation]:
        """``feed`` for any chunk."""
        if self._closed:
            raise ValueError("EnvelopeDecoder.feed() called after close()")
        out: list[Envelope | Violation] = []
        if not data or self._stopped:
            return out
        if self._ended:
            self._trailing(0, out)
            return out
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data if isinstance(data, bytes | bytearray) else bytes(data)
        with memoryview(src) as mv:
            pos = self._run(mv, out)
            rest = bytes(mv[pos:]) if src is not buf and pos < len(mv) else b""
        if src is buf:
            del buf[:pos]
        elif rest:
            buf += rest
        self._offset += pos
        return out

    def close(self) -> list[Envelope | Violation]:
        """Signals the end of the stream; returns what the end completed. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        self._idle = False
        buf, self._buf = self._buf, bytearray()
        if not buf or self._skip or self._stopped or self._ended:
            return []
        if len(buf) < PREFIX_BYTES:
            detail = f"stream ended inside the prefix of the envelope at byte {self._offset} ({nbytes(len(buf))} of 5)"
        else:
            total = PREFIX_BYTES + _LEN.unpack_from(buf, 1)[0]
            detail = f"stream ended inside the envelope at byte {self._offset} ({nbytes(len(buf))} of {total})"
        return [Violation(ViolationKind.UNTERMINATED_FINAL_EVENT, None, detail)]

    # -- internals ---------------------------------------------------------------------------

    def _trailing(self, at: int, out: list[Envelope | Violation]) -> None:
        if not self._after_end:
            self._after_end = True
            out.append(
                Violation(
                    ViolationKind.MALFORMED_FRAME,
                    None,
                    f"data after the end envelope (from byte {self._offset + at}) ignored",
                )
            )

    def _is_end(self, flags: int) -> bool:
        if self._protocol is EnvelopeProtocol.CONNECT:
            return bool(flags & FLAG_END_STREAM)
        return bool(flags & FLAG_TRAILERS)

    def _run(self, mv: memoryview, out: list[Envelope | Violation]) -> int:
        """Decodes what ``mv`` (held bytes + the new chunk) completes; returns how many of its
        bytes were consumed (the rest is held)."""
        n = len(mv)
        pos = 0
        base = self._offset
        limit = self._max
        unpack = _LEN.unpack_from
        append = out.append
        while True:
            if self._skip:
                take = min(self._skip, n - pos)
                pos += take
                self._skip -= take
                if self._skip:
                    return pos
                if self._skip_end:
                    self._skip_end = False
                    self._ended = True
                    if pos < n:
                        self._trailing(pos, out)
                    return n
            if n - pos < PREFIX_BYTES:
                return pos
            flags = mv[pos]
            length = unpack(mv, pos + 1)[0]
            if flags == 0 and length <= limit:
                # A plain data envelope (allowed by every protocol, never an end): the common case.
                size = PREFIX_BYTES + length
                if n - pos < size:
                    return pos
                append(Envelope(0, bytes(mv[pos + PREFIX_BYTES : pos + size]), size))
                pos += size
                continue
            at = base + pos
            if flags not in self._allowed:
                out.append(
                    Violation(
                        ViolationKind.MALFORMED_FRAME,
                        None,
                        f"envelope at byte {at}: reserved flags 0x{flags:02x} for {self._protocol.value};"
                        " decoding stopped",
                    )
                )
                self._stopped = True
                return n
            size = PREFIX_BYTES + length
            if length > self._max:
                out.append(
                    Violation(
                        ViolationKind.OVERSIZE_EVENT,
                        None,
                        f"envelope at byte {at}: length {length} exceeds {self._max} bytes; skipped",
                    )
                )
                self._skip = size
                self._skip_end = self._is_end(flags)
                continue
            if n - pos < size:
                return pos
            raw = bytes(mv[pos + PREFIX_BYTES : pos + size])
            pos += size
            end = self._is_end(flags)
            payload: bytes | None = raw
            if flags & FLAG_COMPRESSED:
                payload = self._decompress(raw, at, out)
            if payload is not None or end:
                trailers = None
                if self._protocol is EnvelopeProtocol.GRPC_WEB and end:
                    trailers, bad = parse_trailers(payload or b"")
                    if bad:
                        out.append(
                            Violation(
                                ViolationKind.MALFORMED_FRAME,
                                None,
                                f"trailer frame at byte {at}: {bad} line{'s' if bad > 1 else ''} without a colon ignored",
                            )
                        )
                out.append(Envelope(flags, payload or b"", size, end, trailers))
            if end:
                self._ended = True
                if pos < n:
                    self._trailing(pos, out)
                return n

    def _decompress(self, raw: bytes, at: int, out: list[Envelope | Violation]) -> bytes | None:
        """The decompressed message, or ``None`` after a ``content_decoding_error``."""
        if self._codec_error is not None:
            out.append(
                Violation(
                    ViolationKind.CONTENT_DECODING_ERROR,
                    None,
                    f"envelope at byte {at} is flagged compressed but {self._codec_error}; message dropped",
                )
            )
            return None
        if not raw:
            return b""  # nothing to decompress (an empty message flagged compressed)
        assert self._encoding is not None
        d = make_decoder(self._encoding, max_ratio=self._ratio, max_output_bytes=self._max)
        try:
            payload = d.feed(raw)
            payload += d.close()
        except ContentDecodingError as exc:
            out.append(
                Violation(ViolationKind.CONTENT_DECODING_ERROR, None, f"envelope at byte {at}: {exc}; message dropped")
            )
            return None
        if not d.complete:
            out.append(
                Violation(
                    ViolationKind.CONTENT_DECODING_ERROR,
                    None,
                    f"envelope at byte {at}: its {self._encoding} data ends before the end of the"
                    " compressed stream; message dropped",
                )
            )
            return None
        return payload


def parse_trailers(payload: bytes) -> tuple[dict[str, str], int]:
    """A gRPC-Web trailer frame's ``key: value`` lines (CRLF or LF ended) as a dict, and the
    number of non-blank lines without a colon (ignored). Keys are lower-cased and stripped,
    values stripped of spaces and tabs; a repeated key's values are joined with ``,`` (RFC 9110
    §5.3); ``grpc-message`` is percent-decoded (PROTOCOL-HTTP2 "Status-Message"). Bytes that are
    not UTF-8 are replaced with U+FFFD."""
    text = payload.decode("utf-8", "replace")
    fields: dict[str, str] = {}
    bad = 0
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            bad += 1
            continue
        key = key.strip().lower()
        value = value.strip(" \t")
        fields[key] = f"{fields[key]},{value}" if key in fields else value
    if "grpc-message" in fields:
        fields["grpc-message"] = _percent_decode(fields["grpc-message"])
    return fields, bad


def _percent_decode(value: str) -> str:
    """PROTOCOL-HTTP2 "Status-Message": percent-encoded UTF-8; a broken ``%`` sequence is left
    as it is and invalid UTF-8 becomes U+FFFD (the spec: never an error, never drop the message)."""
    return unquote(value, encoding="utf-8", errors="replace") if "%" in value else value


def grpc_status(
    fields: Mapping[str, str] | Iterable[tuple[str, str]], *, percent_encoded: bool = True
) -> tuple[int | None, str | None]:
    """``(status, message)`` from gRPC response headers (a trailers-only response) or trailers:
    ``grpc-status`` as an int (``None`` when absent or not a decimal number) and ``grpc-message``
    percent-decoded (``None`` when absent). ``fields``: a mapping or ``(name, value)`` pairs, names
    matched case-insensitively (str or bytes; bytes are read as Latin-1); the first occurrence
    counts. ``percent_encoded=False`` for a message already decoded (``Envelope.trailers``)."""
    pairs = fields.items() if isinstance(fields, Mapping) or hasattr(fields, "items") else fields
    status: int | None = None
    message: str | None = None
    seen_status = seen_message = False
    for name, value in pairs:  # type: ignore[union-attr]
        key = (name.decode("latin-1") if isinstance(name, bytes | bytearray) else str(name)).strip().lower()
        if key not in ("grpc-status", "grpc-message"):
            continue
        text = value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)
        if key == "grpc-status" and not seen_status:
            seen_status = True
            digits = text.strip()
            status = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 10 else None
        elif key == "grpc-message" and not seen_message:
            seen_message = True
            message = _percent_decode(text) if percent_encoded else text
    return status, message


def end_stream_error(payload: bytes) -> tuple[str, str | None] | None:
    """The error of a Connect EndStreamResponse (``Envelope.payload`` of an end envelope):
    ``None`` for success (no ``error``, or ``null``), else ``(code, message)``: ``code`` as sent
    (``"unknown"`` when missing or not a string), ``message`` or ``None``. A payload that is not
    a JSON object gives ``("unknown", "end-stream message is not a JSON object")``: the status is
    then unknown (connectrpc protocol.md: the end-stream message is always JSON)."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return "unknown", "end-stream message is not a JSON object"
    error = doc.get("error")
    if error is None:
        return None
    if not isinstance(error, dict):
        return "unknown", None
    code = error.get("code")
    message = error.get("message")
    return (code if isinstance(code, str) and code else "unknown"), (message if isinstance(message, str) else None)


_B64_WS = b" \t\r\n"


class GrpcWebTextDecoder:
    """``application/grpc-web-text``: base64 of the binary gRPC-Web stream, each server flush
    encoded (and ``=``-padded) on its own, so padding may occur mid-stream. Decoded in 4-character
    groups (a group that holds padding ends one encoded run; the next group starts the next one);
    ASCII whitespace is ignored; the bytes go to an :class:`EnvelopeDecoder` (``GRPC_WEB``;
    keyword arguments are its own). A character outside the base64 alphabet, or padding anywhere
    but at the end of a group, is a ``content_decoding_error`` and stops decoding (what came
    before is kept). At ``close`` a final group of 2 or 3 characters without padding is decoded
    as if padded; a single one is a violation. Offsets in details: envelope offsets count decoded
    bytes, base64 offsets count characters (whitespace excluded)."""

    __slots__ = ("_inner", "_held", "_chars", "_failed", "_closed")

    def __init__(self, **kwargs: object) -> None:
        self._inner = EnvelopeDecoder(GRPC_WEB, **kwargs)  # type: ignore[arg-type]
        self._held = b""  # an incomplete group: up to 3 characters
        self._chars = 0  # base64 characters consumed before _held
        self._failed = False
        self._closed = False

    @property
    def buffered_bytes(self) -> int:
        return len(self._held) + self._inner.buffered_bytes

    @property
    def end_stream_seen(self) -> bool:
        return self._inner.end_stream_seen

    def feed(self, data: bytes) -> list[Envelope | Violation]:
        if self._closed:
            raise ValueError("GrpcWebTextDecoder.feed() called after close()")
        if self._failed or not data:
            return []
        text = self._held + bytes(data).translate(None, _B64_WS)
        whole = len(text) - len(text) % 4
        self._held = text[whole:]
        decoded, bad = _b64_groups(text[:whole])
        out = self._inner.feed(decoded) if decoded else []
        if bad is not None:
            out.append(self._bad(bad, text[bad : bad + 4]))
        self._chars += whole
        return out

    def close(self) -> list[Envelope | Violation]:
        if self._closed:
            return []
        self._closed = True
        out: list[Envelope | Violation] = []
        held, self._held = self._held, b""
        if held and not self._failed:
            if len(held) == 1:
                out.append(
                    Violation(
                        ViolationKind.CONTENT_DECODING_ERROR,
                        None,
                        f"grpc-web-text ends with a lone base64 character at character {self._chars}",
                    )
                )
            else:
                decoded, bad = _b64_groups(held + b"=" * (4 - len(held)))
                if decoded:
                    out += self._inner.feed(decoded)
                if bad is not None:
                    out.append(self._bad(0, held))
        out += self._inner.close()
        return out

    def _bad(self, index: int, group: bytes) -> Violation:
        self._failed = True
        return Violation(
            ViolationKind.CONTENT_DECODING_ERROR,
            None,
            f"grpc-web-text: invalid base64 group {group!r} at character {self._chars + index}; decoding stopped",
        )


def _b64_groups(text: bytes) -> tuple[bytes, int | None]:
    """Decodes ``text`` (a multiple of 4 characters) run by run: each run ends with the first
    group holding ``=``. Returns the bytes decoded before the first invalid group and that
    group's index (``None`` if all were valid)."""
    out = []
    start = 0
    n = len(text)
    while start < n:
        eq = text.find(b"=", start)
        stop = n if eq < 0 else (eq // 4 + 1) * 4
        run = text[start:stop]
        try:
            out.append(binascii.a2b_base64(run, strict_mode=True))
        except binascii.Error:
            # Find the first bad group of the run, keep what precedes it.
            for g in range(0, len(run), 4):
                try:
                    out.append(binascii.a2b_base64(run[g : g + 4], strict_mode=True))
                except binascii.Error:
                    return b"".join(out), start + g
            return b"".join(out), start  # pragma: no cover - a run fails only in one of its groups
        start = stop
    return b"".join(out), None
