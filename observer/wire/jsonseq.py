"""Incremental, sans-IO framer for a sequence of JSON values written one after another, with or
without whitespace between them ("concatenated JSON").

Consumer Copilot's chat socket (``wss://copilot.microsoft.com/c/api/chat?api-version=2``;
``../shared/reference/binary-formats.md`` §3.3, from HusnainRKI/ms-copilot-gateway) is not SignalR:
each WebSocket message holds plain JSON event objects, and one message may hold several with no
separator at all, e.g. ``{"event":"appendText","text":"-OK"}{"event":"done"}`` -- one
``json.loads`` of the message fails. Other writers separate values by newlines or spaces; both
come out the same here. This decoder is an incremental, string- and escape-aware bracket-depth
scanner over the grammar of RFC 8259 (§2 structural characters and insignificant whitespace, §7
strings and escapes): each complete top-level value comes out as soon as its last byte arrives, as
a message (``observer.wire.frames.Message``: ``(None, value bytes, None, None, size_bytes)``, as
the NDJSON framer gives its lines) whose data is the value's exact bytes, for the consumer's one
JSON parse. The value is not parsed here; only its extent is found.

Bytes go in through :meth:`JsonSequenceDecoder.feed` (one WebSocket message's content, or any
piece of a byte stream); frames and :class:`~observer.records.Violation` values come out in stream
order; no I/O, no clock, no module-level mutable state; malformed input never raises, it is
reported.

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object is accepted and copied once), split anywhere: inside a
  string, between a backslash and the byte it escapes, inside a multi-byte UTF-8 character (no
  byte of one is ASCII, so none is taken for a bracket or quote), across messages.
- Output: ``list[Message | Violation]``. Concatenating the lists returned by every ``feed`` and the
  final ``close`` gives the same sequence however the input was split.
- Values: top-level **objects and arrays** only. Concatenated scalars have no boundary (``12``
  could be ``1`` then ``2``) and no writer of this framing sends them; a byte that cannot begin an
  object or array where a value is expected is junk (below).
- The message's ``size_bytes`` (bytes on the wire): the value plus everything since the previous
  value ended (whitespace, skipped junk). Bytes after the last value belong to no frame, so the
  sizes add up to the input's length minus what follows the last value.
- ``max_value_bytes`` (bytes, > 0) bounds one value's own bytes (``len(data)``), the only bytes
  ever held between calls.
- Offsets in details: bytes from the start of what this decoder was fed ("byte N").

Violations (``kind``) and resynchronisation
-------------------------------------------
- ``invalid_json``: junk where a value was expected (anything but JSON whitespace, ``{`` or ``[``,
  e.g. a stray ``}``, a scalar, a ``0x1E``, a BOM): reported once per run of junk, with its offset
  and first byte; input is skipped up to the next ``{`` or ``[``, taken as the start of a value.
  That is the only place a new value can be recognised without a separator; junk that itself
  holds a ``{`` resynchronises there, and the value framed from it may be invalid JSON, which the
  consumer's parse reports.
- ``oversize_event``: a value longer than ``max_value_bytes``; reported once, its bytes are dropped
  as they arrive while its end is still tracked (depth, strings, escapes), then framing resumes.
- ``unterminated_final_event`` at ``close``: the stream ended inside a value (not framed: a cut
  value cannot be valid JSON).

Depth counts ``{``/``[`` against ``}``/``]`` without matching their kinds (a mismatch is malformed
JSON that the consumer's parser reports), as ``observer.wire.jsonarray`` does.
"""

from __future__ import annotations

import re

from observer.records import Violation, ViolationKind
from observer.wire.frames import Message, nbytes, positive_size

__all__ = ["JsonSequenceDecoder"]

_QUOTE = 0x22  # "
_BACKSLASH = 0x5C
_LBRACE = 0x7B  # {
_LBRACKET = 0x5B  # [

# Matchers (compiled once; immutable). Possessive quantifiers make every scan linear.
#
# Insignificant whitespace (RFC 8259 §2: space, HTAB, LF, CR).
_WS = re.compile(rb"[ \t\r\n]*+").match
# Inside a value, outside strings: skip to the next bracket or the opening quote of a string that
# does not close in this chunk; complete strings are consumed whole (RFC 8259 §7: a string ends at
# the first '"' not escaped by a backslash), so brackets inside them are never counted.
_RUN = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+")*+').match
# Inside a string: skip to the closing quote, or to a backslash that is the chunk's last byte.
_STRING = re.compile(rb'[^"\\]*+(?:\\[\s\S][^"\\]*+)*+').match
# Junk recovery: the next '{' or '[' (the start of a value).
_RESYNC = re.compile(rb"[{\[]").search

# Scanner states.
_BETWEEN = 0  # between values: whitespace, then '{' or '['
_VALUE = 1  # inside a value, outside strings (depth >= 1)
_STR = 2  # inside a string of a value
_JUNK = 3  # skipping junk up to the next '{' or '['


def _show(c: int) -> str:
    """A byte for a violation detail: the character if printable ASCII, else its hex value."""
    return repr(chr(c)) if 0x20 <= c < 0x7F else f"0x{c:02x}"


class JsonSequenceDecoder:
    """Incremental framer of concatenated top-level JSON objects/arrays (see the module docstring).

    ``max_value_bytes`` (bytes, > 0) bounds one value's bytes; a larger value gives one
    ``oversize_event`` violation and no frame. At most ``max_value_bytes`` bytes of an unfinished
    value are held between calls.

    Cost: the scan state (grammar position, depth, inside-string and pending-escape flags) is kept
    between calls, so every byte is scanned when its chunk arrives and never again (at most twice,
    when a string opened in a chunk does not close in it); a value split over chunks is appended to
    a buffer piece by piece, never rescanned. The scanning is done by compiled ``re`` matchers;
    Python work is per bracket and per value, not per byte.
    """

    __slots__ = ("_max", "_closed", "_state", "_depth", "_esc", "_value", "_value_at", "_skip", "_base", "_frame_from")

    def __init__(self, max_value_bytes: int = 1 << 20) -> None:
        """Raises ``ValueError`` if ``max_value_bytes`` is not a positive int."""
        self._max = positive_size(max_value_bytes, "max_value_bytes")
        self._closed = False
        self._state = _BETWEEN
        self._depth = 0  # bracket depth inside the current value
        self._esc = False  # inside a string, the previous chunk ended with a backslash
        self._value = bytearray()  # the current value's bytes from earlier chunks
        self._value_at = 0  # offset of the current value's first byte
        self._skip = False  # the current value is oversize (reported): track its end, keep nothing
        self._base = 0  # offset of the next byte to scan (bytes consumed so far)
        self._frame_from = 0  # where the next frame's size_bytes starts counting

    @property
    def buffered_bytes(self) -> int:
        """Bytes of an unfinished value currently held. Diagnostic."""
        return len(self._value)

    def feed(self, data: bytes) -> list[Message | Violation]:
        """Consumes the next bytes and returns the frames and violations they completed, in order
        (often ``[]``). Raises ``ValueError`` if called after :meth:`close` (a caller's mistake,
        not an input's)."""
        if self._closed:
            raise ValueError("JsonSequenceDecoder.feed() called after close()")
        if not isinstance(data, bytes):
            data = bytes(data)
        out: list[Message | Violation] = []
        if data:
            self._consume(data, out)
        return out

    def close(self) -> list[Message | Violation]:
        """Signals the end of the stream. Idempotent (then ``[]``).

        Inside a value: ``unterminated_final_event`` (the value is not framed; the detail says how
        many bytes were pending); between values or inside junk (already reported): ``[]``."""
        if self._closed:
            return []
        self._closed = True
        out: list[Message | Violation] = []
        if self._state in (_VALUE, _STR):
            if self._skip:
                detail = "stream ended inside a JSON value already reported as oversize"
            else:
                pending = nbytes(self._base - self._value_at)
                detail = f"stream ended inside a JSON value ({pending} pending, not framed)"
            out.append(Violation(kind=ViolationKind.UNTERMINATED_FINAL_EVENT, seq=None, detail=detail))
        self._value = bytearray()
        self._skip = False
        self._state = _BETWEEN
        return out

    # -- internals ---------------------------------------------------------------------------

    def _consume(self, data: bytes, out: list[Message | Violation]) -> None:
        """Scans one non-empty chunk, resuming from the saved state."""
        n = len(data)
        base = self._base
        state = self._state
        depth = self._depth
        i = 0
        while i < n:
            if state == _VALUE:
                j = _RUN(data, i).end()
                if j == n:
                    i = n
                    break
                c = data[j]
                i = j + 1
                if c == _QUOTE:
                    state = _STR  # a string that does not close in this chunk
                elif c == _LBRACE or c == _LBRACKET:
                    depth += 1
                else:  # '}' or ']'
                    depth -= 1
                    if not depth:
                        self._finish(data, i, out)
                        state = _BETWEEN
            elif state == _BETWEEN:
                i = _WS(data, i).end()
                if i == n:
                    break
                c = data[i]
                if c == _LBRACE or c == _LBRACKET:
                    self._value_at = base + i
                    state, depth = _VALUE, 1
                    i += 1
                else:
                    detail = (
                        f"expected '{{' or '[' at byte {base + i}, found {_show(c)}; skipping to the next '{{' or '['"
                    )
                    out.append(Violation(kind=ViolationKind.INVALID_JSON, seq=None, detail=detail))
                    state = _JUNK
            elif state == _STR:
                if self._esc:
                    # The previous chunk ended with a backslash: this byte is the escaped one.
                    self._esc = False
                    i += 1
                    continue
                j = _STRING(data, i).end()
                if j == n:
                    i = n
                    break
                if data[j] == _BACKSLASH:
                    # Only possible as the chunk's last byte: the escaped byte comes next chunk.
                    self._esc = True
                    i = n
                    break
                i = j + 1  # past the closing quote
                state = _VALUE
            else:  # _JUNK (reported once): resume at the next '{' or '['
                m = _RESYNC(data, i)
                if m is None:
                    i = n
                    break
                i = m.start()
                self._value_at = base + i
                state, depth = _VALUE, 1
                i += 1
        if (state == _VALUE or state == _STR) and not self._skip:
            # The value continues in the next chunk: keep its bytes of this chunk, within bound.
            start = self._value_at - base
            if start < 0:
                start = 0
            if base + n - self._value_at > self._max:
                out.append(self._oversize_violation())
                self._value = bytearray()
                self._skip = True
            else:
                self._value += data[start:] if start else data
        self._state = state
        self._depth = depth
        self._base = base + n

    def _finish(self, data: bytes, end: int, out: list[Message | Violation]) -> None:
        """Ends the current value at ``data[end - 1]``: frames it unless it is oversize."""
        base = self._base
        end_at = base + end
        if self._skip:
            self._skip = False  # oversize value already reported: drop it, resume after it
        else:
            start = self._value_at - base
            if start >= 0:
                raw = data[start:end]  # the whole value is in this chunk
            else:
                self._value += data[:end]
                raw = bytes(self._value)
                self._value = bytearray()
            if len(raw) > self._max:
                out.append(self._oversize_violation())
            else:
                out.append((None, raw, None, None, end_at - self._frame_from))
        self._frame_from = end_at

    def _oversize_violation(self) -> Violation:
        # The same detail wherever the overflow was noticed (independent of the split).
        return Violation(kind=ViolationKind.OVERSIZE_EVENT, seq=None, detail=f"JSON value exceeded {self._max} bytes")
