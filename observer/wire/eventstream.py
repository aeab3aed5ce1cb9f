"""Incremental, sans-IO decoder of the AWS event stream (``application/vnd.amazon.eventstream``).

The binary framing of Amazon Bedrock's ``ConverseStream`` and ``InvokeModelWithResponseStream``
(and of Transcribe, S3 Select, Kinesis ``SubscribeToShard``). It cuts frames and checks both CRCs;
it does **not** interpret the payload (JSON for Bedrock: the dialect's job).

Sources: AWS "Event stream encoding" (Amazon Transcribe developer guide, "Setting up a streaming
transcription" -> "Event stream encoding"); the smithy ``vnd.amazon.eventstream`` specification
(smithy.io "Event streams" -> "Event stream encoding"); botocore ``botocore/eventstream.py``
(``EventStreamBuffer``, ``_MAX_HEADERS_LENGTH``, ``_MAX_PAYLOAD_LENGTH``), used as the test oracle;
the project reference ``binary-formats.md`` §8.

Frame (all integers big-endian)
-------------------------------
``total_length u32 | headers_length u32 | prelude_crc u32 | headers | payload | message_crc u32``

- The 12-byte *prelude* is the two lengths and ``prelude_crc`` = CRC-32 (ISO-HDLC, ``zlib.crc32``)
  of its first 8 bytes. ``message_crc`` is the CRC-32 of every byte of the frame before it.
- ``payload`` length = ``total_length - headers_length - 16``; the smallest frame is 16 bytes.
- A header: ``name_len u8 | name (UTF-8) | type u8 | value``; value types: 0 true, 1 false,
  2 int8, 3 int16, 4 int32, 5 int64 (signed), 6 bytes (``u16`` length + bytes), 7 string
  (``u16`` length + UTF-8), 8 timestamp (int64 milliseconds since the Unix epoch), 9 uuid
  (16 bytes).
- Header keys Bedrock uses: ``:message-type`` (``event``; ``exception`` with ``:exception-type``;
  ``error`` with ``:error-code`` and ``:error-message``), ``:event-type``, ``:content-type``.

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object), split anywhere.
- Output of ``feed``/``close``: ``list[EventStreamMessage | Violation]`` in stream order; the
  concatenation of all lists is the same however the input was split.
- ``EventStreamMessage``: ``headers`` (``dict[str, bool | int | bytes | str | datetime]``: type 8
  as an aware UTC ``datetime``, or the int milliseconds when outside ``datetime``'s range (years
  1-9999); type 9 as its 16 raw bytes, as botocore returns it: the pure core may not import
  ``uuid``, ``uuid.UUID(bytes=...)`` is the caller's), ``payload`` (``bytes``), ``size_bytes`` (the
  frame's ``total_length``: bytes on the wire).
- Byte offsets in violation details count from the start of the stream.

Errors (all reported as ``Violation``; nothing raises but ``feed`` after ``close``)
-------------------------------------------------------------------------------
- **Bad prelude CRC** (``checksum_mismatch``): the lengths cannot be trusted, so the decoder
  *hunts*: it looks at every following byte offset for 12 bytes that form a prelude whose CRC
  matches, with ``total_length >= 16``, ``headers_length <= total_length - 16`` and within the
  bounds below, and resumes there. One violation per hunt, returned when the hunt ends, saying
  how many bytes were skipped. The hunt examines at most ``max_resync_bytes`` offsets; past that
  the decoder stops cleanly (the violation says so; later input is dropped unread). While
  hunting it holds at most 11 bytes.
- **Impossible lengths behind a good prelude CRC** (``malformed_frame``): ``total_length < 16``
  leaves no frame extent to skip, so the decoder hunts as above; ``headers_length >
  total_length - 16`` keeps the extent: the frame's ``total_length`` bytes are skipped.
- **Bad message CRC** (``checksum_mismatch``): the prelude was good, so the frame's extent is
  known: its ``total_length`` bytes are dropped and decoding goes on with the next frame.
- **Unreadable headers behind good CRCs** (``malformed_frame``): a header running past
  ``headers_length``, an unknown value type, a name or string that is not UTF-8, a duplicate
  name (botocore raises ``DuplicateHeader``): the frame is dropped, decoding goes on.
- **Oversize** (``oversize_event``): ``headers_length > max_headers_bytes`` (botocore: 128 KiB),
  payload ``> max_payload_bytes`` (24 MiB), or ``total_length > max_frame_bytes``: reported as
  soon as the prelude is read, then the frame's bytes are dropped as they arrive (never held).
- **End of stream inside a frame** (``unterminated_final_event``) at ``close``: the held partial
  frame is discarded. A frame being skipped (already reported) gives nothing more.

Why these resynchronisation rules: the only trustworthy length is one covered by a matching
prelude CRC (a random 12 bytes pass with probability 2^-32, before the length checks), so a good
prelude means the frame's extent is known and skipping exactly that many bytes keeps the next
frame aligned; a bad prelude leaves nothing to skip by, and the next frame starts somewhere after
it, which only a byte-by-byte search for a valid prelude can find. botocore instead stays stuck
and re-raises on every later ``next()``.

Bounds: between calls at most one frame (``< total_length <= max_frame_bytes``) or 11 bytes (while
hunting) is held (``buffered_bytes``). A hunt costs one Python step per byte offset examined,
at most ``max_resync_bytes``.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from observer.records import Violation, ViolationKind
from observer.wire.frames import nbytes, positive_size

__all__ = [
    "MAX_HEADERS_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_FRAME_BYTES",
    "EventStreamDecoder",
    "EventStreamMessage",
    "HeaderValue",
]

PRELUDE_BYTES = 12  # total_length, headers_length, prelude_crc
MIN_FRAME_BYTES = 16  # prelude + message_crc, no headers, no payload
MAX_HEADERS_BYTES = 128 * 1024  # botocore _MAX_HEADERS_LENGTH
MAX_PAYLOAD_BYTES = 24 * 1024 * 1024  # botocore _MAX_PAYLOAD_LENGTH
MAX_FRAME_BYTES = MIN_FRAME_BYTES + MAX_HEADERS_BYTES + MAX_PAYLOAD_BYTES
DEFAULT_MAX_RESYNC_BYTES = 1 << 20

HeaderValue = bool | int | bytes | str | datetime

_PRELUDE = struct.Struct(">III")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_INT = {2: struct.Struct(">b"), 3: struct.Struct(">h"), 4: struct.Struct(">i"), 5: struct.Struct(">q")}
_I64 = struct.Struct(">q")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True, slots=True)
class EventStreamMessage:
    """One frame whose CRCs matched: its ``headers`` (in wire order), ``payload`` (undecoded) and
    ``size_bytes`` (its ``total_length``)."""

    headers: dict[str, HeaderValue]
    payload: bytes
    size_bytes: int

    def _str(self, name: str) -> str | None:
        value = self.headers.get(name)
        return value if isinstance(value, str) else None

    @property
    def message_type(self) -> str | None:
        """``:message-type``: ``"event"``, ``"exception"`` (modelled), ``"error"`` (unmodelled)."""
        return self._str(":message-type")

    @property
    def event_type(self) -> str | None:
        """``:event-type`` (e.g. ``"contentBlockDelta"``, ``"chunk"``)."""
        return self._str(":event-type")

    @property
    def exception_type(self) -> str | None:
        """``:exception-type`` of an ``exception`` message (e.g. ``"throttlingException"``)."""
        return self._str(":exception-type")

    @property
    def content_type(self) -> str | None:
        """``:content-type`` of the payload (``"application/json"`` for Bedrock)."""
        return self._str(":content-type")

    @property
    def error_code(self) -> str | None:
        """``:error-code`` of an ``error`` message."""
        return self._str(":error-code")

    @property
    def error_message(self) -> str | None:
        """``:error-message`` of an ``error`` message."""
        return self._str(":error-message")


class _BadHeaders(Exception):
    """Internal: why a frame's header block cannot be read (never leaves this module)."""


def _parse_headers(mv: memoryview, start: int, end: int) -> dict[str, HeaderValue]:
    """The headers in ``mv[start:end]``; raises ``_BadHeaders``."""
    headers: dict[str, HeaderValue] = {}
    i = start
    while i < end:
        nlen = mv[i]
        i += 1
        if i + nlen > end:
            raise _BadHeaders(f"a header name of {nbytes(nlen)} runs past the header block")
        try:
            name = bytes(mv[i : i + nlen]).decode("utf-8")
        except UnicodeDecodeError:
            raise _BadHeaders("a header name is not UTF-8") from None
        i += nlen
        if i >= end:
            raise _BadHeaders(f"header {name!r} has no value type")
        kind = mv[i]
        i += 1
        value: HeaderValue
        if kind == 0:
            value = True
        elif kind == 1:
            value = False
        elif kind in _INT:
            s = _INT[kind]
            if i + s.size > end:
                raise _BadHeaders(f"header {name!r}: its value runs past the header block")
            value = s.unpack_from(mv, i)[0]
            i += s.size
        elif kind == 6 or kind == 7:
            if i + 2 > end:
                raise _BadHeaders(f"header {name!r}: its value runs past the header block")
            vlen = _U16.unpack_from(mv, i)[0]
            i += 2
            if i + vlen > end:
                raise _BadHeaders(f"header {name!r}: its value runs past the header block")
            raw = bytes(mv[i : i + vlen])
            i += vlen
            if kind == 6:
                value = raw
            else:
                try:
                    value = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _BadHeaders(f"header {name!r}: string value is not UTF-8") from None
        elif kind == 8:
            if i + 8 > end:
                raise _BadHeaders(f"header {name!r}: its value runs past the header block")
            ms = _I64.unpack_from(mv, i)[0]
            i += 8
            try:
                value = _EPOCH + timedelta(milliseconds=ms)
            except OverflowError:
                value = ms  # outside datetime's range: kept as milliseconds
        elif kind == 9:
            if i + 16 > end:
                raise _BadHeaders(f"header {name!r}: its value runs past the header block")
            value = bytes(mv[i : i + 16])
            i += 16
        else:
            raise _BadHeaders(f"header {name!r} has unknown value type {kind}")
        if name in headers:
            raise _BadHeaders(f"duplicate header {name!r}")
        headers[name] = value
    return headers


class EventStreamDecoder:
    """Incremental AWS event-stream decoder (rules in the module docstring).

    ``max_frame_bytes`` bounds ``total_length``; ``max_headers_bytes`` and ``max_payload_bytes``
    the two parts (botocore's 128 KiB and 24 MiB by default); ``max_resync_bytes`` the byte
    offsets one hunt for a valid prelude may examine. All are positive ints (``ValueError``
    otherwise). ``buffered_bytes`` says how many input bytes are held.
    """

    __slots__ = (
        "_max_frame",
        "_max_headers",
        "_max_payload",
        "_max_resync",
        "_b0",
        "_buf",
        "_offset",
        "_skip",
        "_hunt",
        "_hunted",
        "_dead",
        "_closed",
    )

    def __init__(
        self,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        *,
        max_headers_bytes: int = MAX_HEADERS_BYTES,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        max_resync_bytes: int = DEFAULT_MAX_RESYNC_BYTES,
    ) -> None:
        self._max_frame = positive_size(max_frame_bytes, "max_frame_bytes")
        self._max_headers = positive_size(max_headers_bytes, "max_headers_bytes")
        self._max_payload = positive_size(max_payload_bytes, "max_payload_bytes")
        self._max_resync = positive_size(max_resync_bytes, "max_resync_bytes")
        # While hunting, a first byte above this cannot start an acceptable total_length.
        self._b0 = min(self._max_frame, 0xFFFFFFFF) >> 24
        self._buf = bytearray()
        self._offset = 0  # stream offset of _buf[0] (bytes consumed before it)
        self._skip = 0  # bytes of a reported frame still to drop
        self._hunt: tuple[str, str, int] | None = None  # (kind, reason, offset of the bad prelude)
        self._hunted = 0  # offsets examined by the current hunt
        self._dead = False  # gave up resynchronising: input is dropped
        self._closed = False

    @property
    def buffered_bytes(self) -> int:
        """Bytes of input currently held (a partial frame, or up to 11 bytes while hunting)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[EventStreamMessage | Violation]:
        """Consumes the next chunk; returns the messages and violations it completed (often
        ``[]``). Raises ``ValueError`` if called after :meth:`close`."""
        if self._closed:
            raise ValueError("EventStreamDecoder.feed() called after close()")
        out: list[EventStreamMessage | Violation] = []
        if not data or self._dead:
            return out
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data if isinstance(data, bytes | bytearray) else bytes(data)
        with memoryview(src) as mv:
            pos = self._run(mv, out)
            if src is buf:
                rest = b""
            else:
                rest = bytes(mv[pos:]) if pos < len(mv) else b""
        if src is buf:
            del buf[:pos]
        elif rest:
            buf += rest
        self._offset += pos
        return out

    def close(self) -> list[EventStreamMessage | Violation]:
        """Signals the end of the stream; returns what the end completed. Idempotent."""
        if self._closed:
            return []
        self._closed = True
        out: list[EventStreamMessage | Violation] = []
        buf, self._buf = self._buf, bytearray()
        held = len(buf)
        if self._dead or self._skip:
            return out
        if self._hunt is not None:
            kind, reason, start = self._hunt
            self._hunt = None
            end = self._offset + held
            out.append(
                Violation(
                    kind,
                    None,
                    f"{reason}; the stream ended {nbytes(end - start)} later without another valid prelude",
                )
            )
            return out
        if held:
            if held < PRELUDE_BYTES:
                detail = f"stream ended inside the prelude of the frame at byte {self._offset} ({nbytes(held)} of 12)"
            else:
                # The prelude was checked when it arrived (a bad one would have started a hunt).
                total = _U32.unpack_from(buf, 0)[0]
                detail = f"stream ended inside the frame at byte {self._offset} ({nbytes(held)} of {total})"
            out.append(Violation(ViolationKind.UNTERMINATED_FINAL_EVENT, None, detail))
        return out

    # -- internals ---------------------------------------------------------------------------

    def _run(self, mv: memoryview, out: list[EventStreamMessage | Violation]) -> int:
        """Decodes what ``mv`` (held bytes + the new chunk) completes; returns how many of its
        bytes were consumed (the rest is held)."""
        n = len(mv)
        pos = 0
        base = self._offset
        while True:
            if self._skip:
                take = min(self._skip, n - pos)
                pos += take
                self._skip -= take
                if self._skip:
                    return pos
            if self._hunt is not None:
                pos = self._scan(mv, pos, out)
                if self._hunt is not None or self._dead:
                    return n if self._dead else pos
            if n - pos < PRELUDE_BYTES:
                return pos
            total, hlen, pcrc = _PRELUDE.unpack_from(mv, pos)
            at = base + pos
            if zlib.crc32(mv[pos : pos + 8]) != pcrc:
                self._start_hunt(
                    ViolationKind.CHECKSUM_MISMATCH,
                    f"prelude CRC mismatch at byte {at}: expected 0x{pcrc:08x},"
                    f" calculated 0x{zlib.crc32(mv[pos : pos + 8]):08x}",
                    at,
                )
                pos += 1
                continue
            if total < MIN_FRAME_BYTES:
                self._start_hunt(
                    ViolationKind.MALFORMED_FRAME,
                    f"frame at byte {at}: total_length {total} is below the {MIN_FRAME_BYTES}-byte minimum",
                    at,
                )
                pos += 1
                continue
            if hlen > total - MIN_FRAME_BYTES:
                out.append(
                    Violation(
                        ViolationKind.MALFORMED_FRAME,
                        None,
                        f"frame at byte {at}: headers_length {hlen} does not fit in total_length {total};"
                        f" {nbytes(total)} skipped",
                    )
                )
                self._skip = total
                continue
            plen = total - hlen - MIN_FRAME_BYTES
            if total > self._max_frame or hlen > self._max_headers or plen > self._max_payload:
                out.append(
                    Violation(
                        ViolationKind.OVERSIZE_EVENT,
                        None,
                        f"frame at byte {at} of {nbytes(total)} (headers {hlen}, payload {plen}) exceeds"
                        f" the bounds (frame {self._max_frame}, headers {self._max_headers},"
                        f" payload {self._max_payload}); skipped",
                    )
                )
                self._skip = total
                continue
            if n - pos < total:
                return pos
            end = pos + total - 4
            mcrc = _U32.unpack_from(mv, end)[0]
            calc = zlib.crc32(mv[pos + 8 : end], pcrc)  # = crc32(frame[:-4]): the prelude CRC matched
            if calc != mcrc:
                out.append(
                    Violation(
                        ViolationKind.CHECKSUM_MISMATCH,
                        None,
                        f"message CRC mismatch in the frame at byte {at} ({nbytes(total)}): expected"
                        f" 0x{mcrc:08x}, calculated 0x{calc:08x}; frame skipped",
                    )
                )
                pos += total
                continue
            hend = pos + PRELUDE_BYTES + hlen
            try:
                headers = _parse_headers(mv, pos + PRELUDE_BYTES, hend)
            except _BadHeaders as exc:
                out.append(Violation(ViolationKind.MALFORMED_FRAME, None, f"frame at byte {at}: {exc}; frame skipped"))
                pos += total
                continue
            out.append(EventStreamMessage(headers, bytes(mv[hend:end]), total))
            pos += total

    def _start_hunt(self, kind: str, reason: str, at: int) -> None:
        self._hunt = (kind, reason, at)
        self._hunted = 0

    def _scan(self, mv: memoryview, pos: int, out: list[EventStreamMessage | Violation]) -> int:
        """Hunts for a valid prelude from ``pos``; returns its position (hunt over), or the
        position from which the unexamined tail (< 12 bytes) is held, or ends the hunt for good
        when the budget is spent."""
        n = len(mv)
        last = n - PRELUDE_BYTES  # last offset with a whole prelude available
        limit = min(last + 1, pos + self._max_resync - self._hunted)
        b0 = self._b0
        max_frame, max_headers, max_payload = self._max_frame, self._max_headers, self._max_payload
        crc32 = zlib.crc32
        unpack = _PRELUDE.unpack_from
        i = pos
        while i < limit:
            if mv[i] <= b0:
                total, hlen, pcrc = unpack(mv, i)
                if (
                    MIN_FRAME_BYTES <= total <= max_frame
                    and hlen <= total - MIN_FRAME_BYTES
                    and hlen <= max_headers
                    and total - hlen - MIN_FRAME_BYTES <= max_payload
                    and crc32(mv[i : i + 8]) == pcrc
                ):
                    kind, reason, start = self._hunt  # type: ignore[misc]
                    at = self._offset + i
                    out.append(
                        Violation(
                            kind,
                            None,
                            f"{reason}; {nbytes(at - start)} skipped to the next valid prelude at byte {at}",
                        )
                    )
                    self._hunt = None
                    return i
            i += 1
        self._hunted += i - pos
        if self._hunted >= self._max_resync:
            kind, reason, _ = self._hunt  # type: ignore[misc]
            out.append(
                Violation(
                    kind,
                    None,
                    f"{reason}; no valid prelude in the next {nbytes(self._max_resync)}: decoding stopped",
                )
            )
            self._hunt = None
            self._dead = True
            return n
        return i
