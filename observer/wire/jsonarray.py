"""Incremental, sans-IO framer for the elements of one streamed top-level JSON array.

Google Gemini ``models/*:streamGenerateContent`` without ``alt=sse`` (Gemini REST reference,
``streamGenerateContent``; the default ``alt=json``) answers ``Content-Type: application/json``
with ONE JSON array written incrementally: ``[`` then each ``GenerateContentResponse`` as it is
generated, separated by ``,`` (``,\\r\\n`` is reported; unverified), then ``]``. Elements are
pretty-printed over many lines, so a line-based reader cannot frame them. This decoder is an
incremental, string- and escape-aware bracket-depth tokenizer over the JSON grammar of RFC 8259
(§2 structural characters and whitespace, §7 strings and escapes): every complete top-level
element comes out as soon as its last byte arrives, as a message
(``observer.wire.frames.Message``: ``(None, element bytes, None, None, size_bytes)``) whose
data is the element's exact bytes. The
element is not parsed here (the dialect parses it); only its extent is found.

Bytes go in through :meth:`JSONArrayDecoder.feed`; frames and
:class:`~observer.records.Violation` values come out in stream order; no I/O, no clock, no
globals; malformed input never raises, it is reported.

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object is accepted and copied once), split anywhere: inside
  a string, between a backslash and the character it escapes, inside a multi-byte UTF-8
  character, inside the leading BOM.
- Output: ``list[Message | Violation]``. Concatenating the lists returned by every ``feed`` and
  the final ``close`` gives the same sequence however the input was split.
- The message's data: the element's bytes, from its first byte (``{``, ``[``, ``"``, or the
  first byte of a number/literal) to its last, undecoded (the consumer decodes). ``json.loads``
  of it gives the element when it is valid.
- The message's ``size_bytes`` (bytes on the wire): the element plus everything since the previous
  frame's element ended -- for the first element the ``[`` and whitespace before it, later the
  ``,`` and whitespace (or skipped junk) before it. The leading BOM is excluded; the bytes after
  the last element (whitespace, ``]``) belong to no frame. So, for a well-formed body, the sizes
  add up to the body's length minus the BOM and minus what follows the last element.
- ``max_element_bytes``: bounds the element's own bytes (``len(data)``), the only bytes ever
  stored.

Violations (``kind``):

- ``invalid_json``: the body does not start with ``[`` after an optional BOM and whitespace
  (reported once; the rest of the body is ignored); a missing ``,`` between elements (the next
  element is framed anyway); other junk where an element, ``,`` or ``]`` was expected (reported
  once, then input is skipped up to the next ``{`` -- taken as the start of an element -- or
  ``]`` -- taken as the end of the array); a trailing ``,`` before ``]``; anything but
  whitespace after the closing ``]`` (reported once, the rest ignored). Details give offsets as
  "byte N", counted from the first byte of the body (BOM included).
- ``unterminated_final_event`` at ``close``: the stream ended inside an element (its bytes are
  not framed: a truncated element cannot be valid JSON) or before the array's ``]``.
- ``oversize_event``: an element longer than ``max_element_bytes``; reported once, its bytes are
  dropped while its end is still tracked (depth, strings, escapes), then framing resumes.

A completely empty (or whitespace-only) body gives nothing at ``close``.

Top-level elements may be objects, arrays, strings, numbers or the literals ``true``/``false``/
``null`` (RFC 8259 §3). A number or literal ends at the first whitespace or structural byte
(``,`` ``]`` ``}`` ``[`` ``{`` ``"`` ``:``); its spelling is left to the dialect's parser, but
an element must begin with a byte that can begin a JSON value (``{ [ " - 0-9 t f n``). Depth
counts ``{``/``[`` against ``}``/``]`` without matching their kinds (a mismatch is malformed
JSON the dialect's parser reports).
"""

from __future__ import annotations

import re

from observer.records import Violation, ViolationKind
from observer.wire.bom import LeadingBOM
from observer.wire.frames import Message, nbytes, positive_size

__all__ = ["JSONArrayDecoder"]

_QUOTE = 0x22  # "
_BACKSLASH = 0x5C
_LBRACE = 0x7B  # {
_LBRACKET = 0x5B  # [
_RBRACKET = 0x5D  # ]
_COMMA = 0x2C
# RFC 8259 §3: a value begins with one of these bytes (object, array, string, number, literal).
_VALUE_START = b'{["-0123456789tfn'

# Matchers (compiled once; immutable). Possessive quantifiers (Python >= 3.11) make every scan
# linear: the engine never backtracks into what it consumed.
#
# Insignificant whitespace (RFC 8259 §2: space, HTAB, LF, CR).
_WS = re.compile(rb"[ \t\r\n]*+").match
# Inside an object/array element, outside strings: skip everything up to the next bracket or
# the opening quote of a string that does not close within this chunk. Complete strings are
# consumed whole (RFC 8259 §7: a string ends at the first '"' not escaped by a backslash; an
# escape is a backslash and the next byte), so brackets inside them are never counted. Python
# work is then per bracket, not per byte.
_RUN = re.compile(rb'(?:[^"\[\]{}]++|"[^"\\]*+(?:\\[\s\S][^"\\]*+)*+")*+').match
# Inside a string: skip to the closing quote, or to a backslash that is the chunk's last byte.
_STRING = re.compile(rb'[^"\\]*+(?:\\[\s\S][^"\\]*+)*+').match
# A number or literal: up to the first whitespace or structural byte.
_SCALAR = re.compile(rb'[^ \t\r\n,\[\]{}":]*+').match
# Junk recovery: the next '{' (start of an element) or ']' (end of the array).
_RESYNC = re.compile(rb"[{\]]").search

# Scanner states.
_START = 0  # before the array's '[' (BOM and whitespace allowed)
_FIRST = 1  # after '[': an element or ']' expected
_NEXT = 2  # after ',': an element expected (']' here is a trailing comma)
_AFTER = 3  # after an element: ',' or ']' expected
_ELEM = 4  # inside an object/array element, outside strings (depth >= 1)
_STR = 5  # inside a string (of an element at depth >= 1, or a top-level string element)
_SCAL = 6  # inside a top-level number/literal element
_RESYNC_ST = 7  # skipping junk up to the next '{' or ']'
_END = 8  # after the array's ']': only whitespace allowed
_DEAD = 9  # not a JSON array, or junk after ']': everything else is ignored

_IN_ELEMENT = (_ELEM, _STR, _SCAL)


def _show(c: int) -> str:
    """A byte for a violation detail: the character if printable ASCII, else its hex value."""
    return repr(chr(c)) if 0x20 <= c < 0x7F else f"0x{c:02x}"


class JSONArrayDecoder:
    """Incremental framer of the top-level elements of one streamed JSON array (RFC 8259).

    ``max_element_bytes`` (bytes, > 0) bounds one element's own bytes; a larger element gives
    one ``oversize_event`` violation and no frame. The decoder holds at most
    ``max_element_bytes`` bytes of an incomplete element (plus up to 2 bytes of a possible split
    BOM) between calls.

    Cost: scan state (position in the grammar, bracket depth, inside-string and pending-escape
    flags) is kept between calls, so every byte is scanned when its chunk arrives and never
    again (at most twice, when a string opened in a chunk does not close in it). The scanning is
    done by C code (compiled ``re`` matchers above); Python work is per bracket, per element and
    per separator, not per byte.
    """

    __slots__ = (
        "_max",
        "_closed",
        "_bom",
        "_state",
        "_depth",
        "_esc",
        "_elem",
        "_elem_at",
        "_skip",
        "_base",
        "_frame_from",
    )

    def __init__(self, max_element_bytes: int = 1 << 20) -> None:
        """Raises ``ValueError`` if ``max_element_bytes`` is not a positive int."""
        self._max = positive_size(max_element_bytes, "max_element_bytes")
        self._closed = False
        # Bytes seen at the very start while they may still be a split BOM; None once settled.
        self._bom = LeadingBOM()
        self._state = _START
        # Bracket depth inside the current element (0 for a top-level string element).
        self._depth = 0
        # Inside a string, the previous chunk ended with a backslash: the next byte is escaped.
        self._esc = False
        # Bytes of the current element from earlier chunks (empty while it is being skipped).
        self._elem = bytearray()
        # Absolute offset (in the body, BOM included) of the current element's first byte.
        self._elem_at = 0
        # The current element is oversize (already reported): track its end, store nothing.
        self._skip = False
        # Absolute offset of the next byte to be scanned (bytes consumed so far, BOM included).
        self._base = 0
        # Absolute offset where the next frame's size_bytes starts counting.
        self._frame_from = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes of input currently held (incomplete element, possible BOM prefix). Diagnostic."""
        return len(self._elem) + self._bom.held_bytes

    def feed(self, data: bytes) -> list[Message | Violation]:
        """Consumes the next chunk of the response body and returns what it completed.

        Returns the frames of the elements this chunk completed and the violations found, in
        stream order (often ``[]``). Raises ``ValueError`` if called after :meth:`close`.
        """
        if self._closed:
            raise ValueError("JSONArrayDecoder.feed() called after close()")
        if not isinstance(data, bytes):
            data = bytes(data)
        out: list[Message | Violation] = []
        # RFC 8259 §8.1: a parser MAY ignore a leading BOM; it counts in no frame.
        was_stripped = self._bom.stripped
        data = self._bom.feed(data)
        if self._bom.stripped and not was_stripped:
            self._base = self._frame_from = 3
        if data and self._state != _DEAD:
            self._consume(data, out)
        else:
            self._base += len(data)
        return out

    def close(self) -> list[Message | Violation]:
        """Signals end of stream; returns what the end completed. Idempotent (then ``[]``).

        Reports ``unterminated_final_event`` if the array was opened but not closed (the detail
        says how many bytes were pending: of the unfinished element, which is not framed, or
        since the last element); an empty or whitespace-only body, a closed array, or a body
        already reported as not an array gives ``[]``.
        """
        if self._closed:
            return []
        self._closed = True
        out: list[Message | Violation] = []
        pending_bom = self._bom.flush()
        if pending_bom:
            # The stream ended inside what could have been a BOM: those bytes are content.
            self._consume(pending_bom, out)
        state = self._state
        if state in _IN_ELEMENT:
            if self._skip:
                detail = "stream ended inside an array element already reported as oversize; no closing ']'"
            else:
                pending = nbytes(self._base - self._elem_at)
                detail = f"stream ended inside an array element ({pending} pending, not framed); no closing ']'"
        elif state in (_FIRST, _NEXT, _AFTER, _RESYNC_ST):
            pending = nbytes(self._base - self._frame_from)
            detail = f"stream ended before the closing ']' of the array ({pending} pending, no element open)"
        else:
            detail = ""
        if detail:
            out.append(Violation(kind=ViolationKind.UNTERMINATED_FINAL_EVENT, seq=None, detail=detail))
        self._elem = bytearray()
        self._skip = False
        self._state = _DEAD
        return out

    # -- internals ---------------------------------------------------------------------------

    def _consume(self, data: bytes, out: list[Message | Violation]) -> None:
        """Scans one non-empty chunk (BOM already handled), resuming from the saved state."""
        n = len(data)
        base = self._base
        state = self._state
        depth = self._depth
        i = 0
        while i < n:
            if state == _ELEM:
                # Inside an object/array: jump to the next bracket or unclosed string.
                j = _RUN(data, i).end()
                if j == n:
                    i = n
                    break
                c = data[j]
                i = j + 1
                if c == _QUOTE:
                    # A string that does not close in this chunk (complete ones were skipped).
                    state = _STR
                elif c == _LBRACE or c == _LBRACKET:
                    depth += 1
                else:  # '}' or ']'
                    depth -= 1
                    if not depth:
                        # Back at depth 0: the element's last byte.
                        self._finish(data, i, out)
                        state = _AFTER
            elif state == _STR:
                if self._esc:
                    # The previous chunk ended with a backslash: this byte is the escaped one
                    # (RFC 8259 §7: '\"', '\\', '\/', '\b', '\f', '\n', '\r', '\t', '\uXXXX').
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
                if depth:
                    state = _ELEM
                else:
                    # The end of a top-level string element.
                    self._finish(data, i, out)
                    state = _AFTER
            elif state == _AFTER:
                i = _WS(data, i).end()
                if i == n:
                    break
                c = data[i]
                if c == _COMMA:
                    state = _NEXT
                    i += 1
                elif c == _RBRACKET:
                    state = _END
                    i += 1
                elif c in _VALUE_START:
                    # Two elements with no ',' between them: say so, but frame the next anyway.
                    out.append(self._invalid(f"missing ',' between array elements at byte {base + i}"))
                    state, depth, i = self._start(data, i)
                else:
                    out.append(self._junk(base + i, c, "',' or ']' after an array element"))
                    state = _RESYNC_ST
            elif state == _NEXT or state == _FIRST:
                i = _WS(data, i).end()
                if i == n:
                    break
                c = data[i]
                if c in _VALUE_START:
                    state, depth, i = self._start(data, i)
                elif c == _RBRACKET:
                    if state == _NEXT:
                        # RFC 8259 §5 allows no trailing comma; the array still ends here.
                        out.append(self._invalid(f"trailing ',' before the closing ']' at byte {base + i}"))
                    state = _END
                    i += 1
                else:
                    out.append(self._junk(base + i, c, "an array element" if state == _NEXT else "an element or ']'"))
                    state = _RESYNC_ST
            elif state == _SCAL:
                # A number or literal ends at the first delimiter, which is not part of it.
                j = _SCALAR(data, i).end()
                if j == n:
                    i = n
                    break
                self._finish(data, j, out)
                state = _AFTER
                i = j
            elif state == _RESYNC_ST:
                # Junk recovery (already reported once): resume at the next '{' or ']'.
                m = _RESYNC(data, i)
                if m is None:
                    i = n
                    break
                i = m.start()
                if data[i] == _LBRACE:
                    state, depth, i = self._start(data, i)
                else:
                    state = _END
                    i += 1
            elif state == _START:
                i = _WS(data, i).end()
                if i == n:
                    break
                c = data[i]
                if c == _LBRACKET:
                    state = _FIRST
                    i += 1
                else:
                    detail = f"body is not a JSON array: expected '[' at byte {base + i}, found {_show(c)}"
                    out.append(self._invalid(detail))
                    state = _DEAD
                    break
            else:  # _END (never _DEAD: feed scans only a live array, close only a held BOM prefix)
                i = _WS(data, i).end()
                if i == n:
                    break
                detail = f"data after the closing ']' of the array at byte {base + i}: {_show(data[i])}"
                out.append(self._invalid(detail))
                state = _DEAD
                break
        if state in _IN_ELEMENT and not self._skip:
            # The element continues in the next chunk: keep its bytes of this chunk, within bound.
            start = self._elem_at - base
            if start < 0:
                start = 0
            if base + n - self._elem_at > self._max:
                out.append(self._oversize_violation())
                self._elem = bytearray()
                self._skip = True
            else:
                self._elem += data[start:] if start else data
        self._state = state
        self._depth = depth
        self._base = base + n

    def _start(self, data: bytes, i: int) -> tuple[int, int, int]:
        """Begins an element at ``data[i]`` (a value's first byte); returns (state, depth, i)."""
        self._elem_at = self._base + i
        c = data[i]
        if c == _LBRACE or c == _LBRACKET:
            return _ELEM, 1, i + 1
        if c == _QUOTE:
            return _STR, 0, i + 1
        return _SCAL, 0, i  # number or literal: _SCALAR consumes it from its first byte

    def _finish(self, data: bytes, end: int, out: list[Message | Violation]) -> None:
        """Ends the current element at ``data[end - 1]``: frames it unless it is oversize."""
        base = self._base
        end_at = base + end
        if self._skip:
            self._skip = False  # oversize element already reported: drop it, resume after it
        else:
            start = self._elem_at - base
            if start >= 0:
                raw = data[start:end]  # the whole element is in this chunk
            else:
                self._elem += data[:end]
                raw = bytes(self._elem)
                self._elem = bytearray()
            if len(raw) > self._max:
                out.append(self._oversize_violation())
            else:
                out.append((None, raw, None, None, end_at - self._frame_from))
        # The next frame's size counts from here (dropped elements' bytes are in no frame).
        self._frame_from = end_at

    def _oversize_violation(self) -> Violation:
        # The detail must not depend on where the overflow was noticed (chunking independence).
        return Violation(
            kind=ViolationKind.OVERSIZE_EVENT, seq=None, detail=f"array element exceeded {self._max} bytes"
        )

    @staticmethod
    def _invalid(detail: str) -> Violation:
        return Violation(kind=ViolationKind.INVALID_JSON, seq=None, detail=detail)

    def _junk(self, at: int, c: int, expected: str) -> Violation:
        return self._invalid(f"expected {expected} at byte {at}, found {_show(c)}; skipping to the next '{{' or ']'")
