"""Incremental, sans-IO decoder for ``text/event-stream`` (Server-Sent Events).

Implements WHATWG HTML §9.2.6 "Interpreting an event stream" (with the line ends and BOM
of §9.2.5 "Parsing an event stream"), in the manner of python-hyper/h11 and httpx-sse ``_decoders.py``:
bytes go in through :meth:`SSEDecoder.feed`, complete events (``observer.wire.frames.Message``
tuples, undecoded) and :class:`~observer.records.Violation` values come out, in stream order. No I/O, no clock, no
globals; the decoder never blocks and never raises on malformed input (malformed input is
either ignored, as WHATWG prescribes, or reported as a ``Violation``).

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object is accepted and copied once), split anywhere,
  including inside a multi-byte UTF-8 character, inside the leading BOM and between the CR
  and the LF of a CRLF.
- Output: ``list[Message | Violation]``. Concatenating the lists returned by every
  ``feed`` and the final ``close`` gives the same sequence however the input was split.
- One event (WHATWG "dispatch the event") is the message ``(event, data, id, retry,
  size_bytes)``: ``event`` the ``event`` field's value, undecoded bytes (``b""`` when the block
  had none: WHATWG's default type ``"message"`` is left to the consumer); ``data`` the ``data``
  lines' values joined with LF (WHATWG appends value + LF per line and removes one trailing LF
  at dispatch), undecoded; ``id`` the last-event-ID buffer at dispatch (it persists across
  events; ``None`` if no ``id`` field was ever accepted), decoded with replacement; ``retry``
  the reconnection time in milliseconds set by a ``retry`` field of this block (ASCII digits
  only), else ``None``.
- UTF-8 is not decoded here: WHATWG decodes the stream with replacement, and the consumer
  does that (``observer.wire.frames.text_message``, which also reports ``invalid_utf8``) only
  for data it cannot parse as JSON straight from the bytes.
- Sizes (``size_bytes``, ``max_event_bytes``): bytes on the wire, UTF-8 undecoded, line
  terminators included (every line since the previous blank line, comments and unknown fields
  included, plus the dispatching blank line), the stream's leading BOM excluded.

Where this decoder departs from WHATWG, on purpose (it observes for the record, it does not
drive an ``EventSource``):

- End of stream: WHATWG discards an event whose dispatching blank line never arrived. Here
  :meth:`SSEDecoder.close` still parses it and returns it followed by a
  ``Violation(kind="unterminated_final_event")``.
- Oversize events: an event block larger than ``max_event_bytes`` is discarded and reported
  as ``Violation(kind="oversize_event")``; the decoder resynchronises at the next blank line.
- Recovered framings (``observer.wire.recovery``, which says when each is unambiguous): a block
  whose ``data`` lines hold several JSON documents (consecutive events with no blank line
  between them) is dispatched as one message per document, after one
  ``Violation(kind="nonconformant_framing")``; a field WHATWG ignores whose value is JSON
  (llama.cpp's ``error: {...}``) is dispatched as a message of its own, its ``event`` the field's
  name, after a ``Violation(kind="nonstandard_field")``; any other unknown field is still ignored
  but named once per stream in a ``nonstandard_field`` violation. The messages of one block are
  its data's first (``retry`` on it only), then its surfaced fields in wire order; the block's
  ``size_bytes`` is shared so that they add up to it: each later message counts its data's
  length, the first the rest. Only the slow paths (a block of several ``data`` lines, a field
  line other than ``data``/``event``) ever look for these.
- A line whose CR is the very last byte fed so far is not acted on until the next byte (or
  ``close``) shows whether an LF follows: that keeps ``size_bytes`` and the ``max_event_bytes``
  check exact and the output independent of chunking. Only streams using bare-CR line ends, or a CRLF split exactly
  between its two bytes, see a dispatch one chunk late.
"""

from __future__ import annotations

from observer.records import Violation, ViolationKind
from observer.wire.bom import LeadingBOM
from observer.wire.frames import Message, nbytes
from observer.wire.recovery import (
    MAX_NAMED_FIELDS,
    MAX_SHOWN_NAME_BYTES,
    MAX_SURFACED_PER_BLOCK,
    json_documents,
    shown,
    surfaced,
)

__all__ = ["SSEDecoder"]

_LF = 0x0A
_CR = 0x0D
_COLON = 0x3A

# What to do with an LF that opens a chunk when the previous chunk ended with a CR: such an
# LF is the second half of a CRLF line end (WHATWG: "a U+000D CARRIAGE RETURN U+000A LINE
# FEED (CRLF) character pair" is one line end), never a line end of its own.
_CR_NONE = 0  # the previous chunk did not end with a CR
_CR_LINE = 1  # CR ended a field/comment line (held in ``_held``): act on it once its size is known
_CR_DEFER = 2  # CR ended a blank line: the LF (if any) belongs to it, then act on the blank line
_CR_DROP = 3  # CR ended a line being skipped (oversize recovery): swallow the LF


def _bare_line_end(block: bytes) -> bool:
    """True when ``block`` holds a CR or LF that is not part of a CRLF pair (memchr scans; the
    ``replace`` only for blocks of several lines)."""
    if _LF not in block:
        return _CR in block
    rest = block.replace(b"\r\n", b"")
    return _CR in rest or _LF in rest


class SSEDecoder:
    """Incremental ``text/event-stream`` decoder (WHATWG HTML §9.2.6).

    ``max_event_bytes`` (bytes, > 0) bounds one event block as measured by
    the message's ``size_bytes``; a larger block is discarded with one ``oversize_event``
    violation. The decoder holds at most about ``max_event_bytes`` plus one input chunk.

    Cost: each input byte is scanned a small constant number of times, by C code
    (``in``, ``bytes.split``/``splitlines``), when its chunk arrives; the bytes of an incomplete
    line are appended to a ``bytearray`` and never rescanned; Python work is per line, not per
    byte. Shortcuts for the usual chunks (one event of one data line, after at most one event
    line, while nothing is pending; whole blocks split on two line ends, LF or CRLF throughout;
    a pending block finished line by line, then the whole blocks after it) give exactly the
    line-by-line output, and a long line is copied once on its way to ``data``.
    """

    __slots__ = (
        "_max",
        "_closed",
        "_bom",
        "_partial",
        "_data",
        "_event",
        "_last_id",
        "_retry",
        "_size",
        "_skipping",
        "_skip_at_line_start",
        "_cr",
        "_bom_open",
        "_idle",
        "_held",
        "_fields",
        "_named",
    )

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        """Raises ``ValueError`` if ``max_event_bytes`` is not a positive int."""
        if not isinstance(max_event_bytes, int) or max_event_bytes <= 0:
            raise ValueError(f"max_event_bytes must be a positive int, got {max_event_bytes!r}")
        self._max = max_event_bytes
        self._closed = False
        # Bytes seen at the very start of the stream while they may still be a split BOM;
        # None once the BOM question is settled (at most 2 bytes are ever held here).
        self._bom = LeadingBOM()
        # The incomplete current line (no terminator seen yet).
        self._partial = bytearray()
        # The current block: data values (raw bytes), event type buffer,
        # retry set by this block, and the bytes of its complete lines.
        self._data: list[bytes] = []
        self._event = b""
        self._retry: int | None = None
        self._size = 0
        # WHATWG "last event ID buffer": persists across dispatches.
        self._last_id: str | None = None
        # Oversize recovery: discarding input up to the next blank line.
        self._skipping = False
        self._skip_at_line_start = True
        self._cr = _CR_NONE
        # A field/comment line whose CR was the last byte fed so far, with its size: acted on when
        # the next byte (or ``close``) shows whether an LF follows, so that the size checked
        # against ``max_event_bytes`` counts its whole line end, however the input was split.
        self._held: tuple[bytes, int] | None = None
        self._bom_open = True  # until the leading-BOM question is settled
        # Nothing held or in progress (BOM question settled, no partial line, no block begun, no
        # CR pending, not skipping, not closed): set after each chunk ``feed`` took the long way.
        self._idle = False
        # The current block's surfaced fields (``observer.wire.recovery``), (name, value) in wire
        # order, or None (the usual case); the ignored field names already named in a violation.
        self._fields: list[tuple[bytes, bytes]] | None = None
        self._named: set[bytes] = set()

    @property
    def last_id(self) -> str | None:
        """The WHATWG last event ID buffer (``id`` of the events dispatched next), or None."""
        return self._last_id

    @property
    def buffered_bytes(self) -> int:
        """Bytes of input currently held (partial line, data values, event type, BOM prefix).

        Diagnostic (tests, metrics); costs O(number of buffered data lines)."""
        held = len(self._partial) + len(self._event) + sum(map(len, self._data))
        if self._fields is not None:
            held += sum(len(value) for _, value in self._fields)
        if self._held is not None:
            held += len(self._held[0])
        return held + self._bom.held_bytes

    def feed(self, data: bytes) -> list[Message | Violation]:
        """Consumes the next chunk of the response body and returns what it completed.

        Returns the events dispatched and violations found, in stream order (often ``[]``).
        Raises ``ValueError`` if called after :meth:`close`.

        The commonest chunk of a token stream, exactly one event of one ``data: `` line,
        optionally after one ``event: `` line, LF line ends (or CRLF for a lone data line),
        arriving while nothing is held
        (``_idle``), is handled first, in as few steps as possible: what the line-by-line path
        gives for it (docs/performance.md, "The one-event chunk")."""
        if self._idle and data.__class__ is bytes:
            head, _, rest = data.partition(b"\n")
            if rest == b"\n":
                if head[:6] == b"data: " and _CR not in head and (n := len(data)) <= self._max:
                    return [(b"", head[6:], self._last_id, None, n)]
            elif rest == b"\r\n":  # one CRLF data-line event (Google's streams)
                if head[:6] == b"data: " and head.find(b"\r") == len(head) - 1 and (n := len(data)) <= self._max:
                    return [(b"", head[6:-1], self._last_id, None, n)]
            elif (
                head[:7] == b"event: "
                and rest[:6] == b"data: "
                and rest[-2:] == b"\n\n"
                and rest.find(b"\n") == len(rest) - 2
                and _CR not in data
                and (n := len(data)) <= self._max
            ):
                return [(head[7:], rest[6:-2], self._last_id, None, n)]
        out = self._feed(data)
        self._idle = not (self._bom_open or self._size or self._partial or self._cr or self._skipping or self._closed)
        return out

    def _feed(self, data: bytes) -> list[Message | Violation]:
        """``feed`` for any chunk."""
        if self._closed:
            raise ValueError("SSEDecoder.feed() called after close()")
        if not isinstance(data, bytes):
            data = bytes(data)
        out: list[Message | Violation] = []
        if self._bom_open:
            # WHATWG §9.2.5: the stream is decoded with "UTF-8 decode", which strips exactly one
            # leading BOM; a later BOM is ordinary data (it becomes U+FEFF).
            data = self._bom.feed(data)
            self._bom_open = not self._bom.settled
        if not data:
            return out
        if self._cr:
            self._consume(data, out)
            return out
        # LF line ends, or else CRLF as Google sends them (``_blocks`` checks each block).
        eol = b"\n" if _CR not in data else b"\r\n"  # int membership: memchr (bytes: ~20x slower)
        if not self._size and not self._partial and not self._skipping:
            # Nothing pending: whole blocks take the shortcut (the usual case).
            self._blocks(data, out, eol)
            return out
        # A block is pending (a chunk boundary fell inside it): finish it line by line, then the
        # whole blocks after it take the shortcut. The first blank line ends a block: the line
        # ending at its first two line ends in a row is followed by a blank line.
        sep = eol + eol
        end = data.find(sep) + len(sep)
        if end >= len(sep) and end < len(data):
            # data[:end] ends with a blank line, which ends the block (and any oversize
            # skipping) with nothing held: the rest is whole blocks, as ``_blocks`` requires.
            self._consume(data[:end], out)
            self._blocks(data[end:], out, eol)
            return out
        self._consume(data, out)
        return out

    def close(self) -> list[Message | Violation]:
        """Signals end of stream; returns what the end completed. Idempotent (then ``[]``).

        WHATWG discards an incomplete final event; here, if the block pending at the end has
        data (an unterminated last line is parsed as a line first), it is returned as an
        message followed by ``Violation(kind="unterminated_final_event")``; a pending block
        with no data yields only the violation; nothing pending yields ``[]``. A block being
        skipped as oversize was already reported and yields nothing more.
        """
        if self._closed:
            return []
        self._closed = True
        self._idle = False
        out: list[Message | Violation] = []
        pending_bom = self._bom.flush()
        if pending_bom:
            # A stream that ended inside what could have been a BOM: those bytes are content.
            self._consume(pending_bom, out)
        if self._cr == _CR_DEFER:
            # The blank line's CR was the last byte of the stream: act on the blank line now.
            self._cr = _CR_NONE
            self._line(b"", 0, out)
        elif self._cr == _CR_LINE:
            self._cr = _CR_NONE
            body, n = self._held  # type: ignore[misc]
            self._held = None
            self._line(body, n, out)
        self._cr = _CR_NONE
        if self._skipping:
            self._partial.clear()
            return out
        if self._partial:
            # WHATWG would drop an unterminated line at EOF; we parse it for the record.
            body = bytes(self._partial)
            self._partial.clear()
            self._line(body, len(body), out)
        size = self._size
        if self._data or self._fields is not None:
            self._emit_event(out)
            out.append(
                Violation(
                    kind=ViolationKind.UNTERMINATED_FINAL_EVENT,
                    seq=None,
                    detail=f"stream ended before the blank line that dispatches the final event ({size} bytes)",
                )
            )
        elif size:
            out.append(
                Violation(
                    kind=ViolationKind.UNTERMINATED_FINAL_EVENT,
                    seq=None,
                    detail=f"stream ended inside an event block with no data ({size} bytes discarded)",
                )
            )
        self._reset_block()
        return out

    # -- internals ---------------------------------------------------------------------------

    def _consume(self, data: bytes, out: list[Message | Violation]) -> None:
        """Scans one non-empty chunk (BOM already handled)."""
        cr = self._cr
        if cr == _CR_LINE:
            self._cr = _CR_NONE
            body, n = self._held  # type: ignore[misc]
            self._held = None
            if data[0] == _LF:  # WHATWG: CRLF is one line end, even split between chunks
                data = data[1:]
                n += 1
            self._line(body, n, out)
            if not data:
                return
        elif cr:
            self._cr = _CR_NONE
            if data[0] == _LF:
                # WHATWG: CRLF is one line end, even when a chunk boundary falls inside it.
                data = data[1:]
                if cr != _CR_DROP:
                    self._size += 1
                    if self._size > self._max:
                        self._oversize(out, line_complete=True, blank=cr == _CR_DEFER)
                        cr = _CR_NONE
            if cr == _CR_DEFER:
                self._line(b"", 0, out)
            if not data:
                return
        line = self._line
        if _CR not in data:
            # Fast path (the common case: LF-only streams): split once, no terminators to strip.
            tail = self._split_lines(data, b"\n", out)
        elif data[-1] != _CR and data.count(b"\r") == data.count(b"\r\n") == data.count(b"\n"):
            # CRLF-only chunk not ending inside a CRLF (Google's streams): split on CRLF once.
            tail = self._split_lines(data, b"\r\n", out)
        else:
            # General path. bytes.splitlines splits on LF, CR and CRLF only -- exactly WHATWG's
            # line ends (str.splitlines would also split on VT, FF, FS..RS, NEL, U+2028/9).
            lines = data.splitlines(True)
            last = lines[-1][-1]
            tail = b"" if last == _LF or last == _CR else lines.pop()
            if lines and self._partial:
                self._partial += lines[0]  # one copy of a long line, not two
                lines[0] = bytes(self._partial)
                self._partial.clear()
            ends_with_cr = last == _CR
            final = len(lines) - 1
            for i, raw in enumerate(lines):
                body = raw.rstrip(b"\r\n")
                if ends_with_cr and i == final:
                    self._line_before_lf(body, len(raw), out)
                else:
                    line(body, len(raw), out)
        if tail:
            if self._skipping:
                self._skip_at_line_start = False  # mid-line while skipping: hold nothing
            else:
                self._partial += tail
                if self._size + len(self._partial) > self._max:
                    self._oversize(out, line_complete=False, blank=False)

    def _blocks(self, data: bytes, out: list[Message | Violation], eol: bytes) -> None:
        """Fast path for the common chunk: nothing pending before it and line ends ``eol``: LF
        (then ``data`` has no CR at all), or CRLF. Complete blocks made only of ``data``/
        ``event`` lines are dispatched straight from one ``split`` on two line ends (with CRLF,
        each piece is checked for any other CR or LF: memchr, not a count); from the first block
        that is anything else (comments, ``id``/``retry``, extra blank lines, other line ends,
        oversize) the rest of the chunk, else just the unfinished tail after the last blank
        line, goes through :meth:`_consume`, which sees exactly the state it would have seen
        (every block before it was complete). Same output as :meth:`_consume` alone."""
        blocks = data.split(eol + eol)
        tail = blocks.pop()  # after the last blank line: the start of the next block (maybe b"")
        limit = self._max
        crlf = eol == b"\r\n"
        term = 4 if crlf else 2
        emit = self._emit_raw
        append = out.append
        last_id = self._last_id  # no id line is handled here: constant for the loop
        pos = 0
        for block in blocks:
            n = len(block) + term
            if n > limit:
                break
            if block[:5] == b"data:":
                if _LF not in block and not (crlf and _CR in block):  # one data line; ONE space dropped
                    append((b"", block[6:] if block[5:6] == b" " else block[5:], last_id, None, n))
                    pos += n
                    continue
            elif block[:6] == b"event:":
                head, _, rest = block.partition(eol)
                if (
                    rest[:5] == b"data:"
                    and _LF not in rest
                    and not (crlf and (_CR in rest or _CR in head or _LF in head))
                ):  # an event line and one data line
                    event = head[7:] if head[6:7] == b" " else head[6:]
                    append((event, rest[6:] if rest[5:6] == b" " else rest[5:], last_id, None, n))
                    pos += n
                    continue
            if not block or block[0] == _LF or block[0] == _CR or (crlf and _bare_line_end(block)):
                break
            event = b""
            values = []
            for line in block.split(eol):
                if line.startswith(b"data:"):
                    value = line[5:]
                    values.append(value[1:] if value[:1] == b" " else value)
                elif line.startswith(b"event:"):
                    value = line[6:]
                    event = value[1:] if value[:1] == b" " else value
                else:
                    values = None
                    break
            if values is None:
                break
            if values:
                if len(values) == 1:
                    emit(values[0], event, n, None, out)
                else:
                    self._emit_lines(values, event, n, None, out)
            pos += n
        else:
            if tail:
                self._consume(tail, out)
            return
        self._consume(data[pos:] if pos else data, out)

    def _split_lines(self, data: bytes, sep: bytes, out: list[Message | Violation]) -> bytes:
        """Processes the complete lines of ``data``, all ended by ``sep`` (LF, or CRLF with no
        other CR or LF in ``data``), the first continuing the held partial line; returns the
        unterminated tail."""
        lines = data.split(sep)
        tail = lines.pop()
        if lines:
            if self._partial:
                self._partial += lines[0]  # one copy of a long line, not two
                lines[0] = bytes(self._partial)
                self._partial.clear()
            self._lines(lines, len(sep), out)
        return tail

    def _lines(self, lines: list[bytes], term: int, out: list[Message | Violation]) -> None:
        """Processes complete lines that all ended with a ``term``-byte terminator: the same
        as calling :meth:`_line` on each, with ``data``/``event`` fields and blank lines (nearly
        every line of a real stream) handled inline; anything else (other fields, comments,
        oversize, skipping) goes through :meth:`_line`."""
        line = self._line
        size = self._size
        limit = self._max
        data = self._data
        skipping = self._skipping
        for body in lines:
            n = len(body) + term
            if skipping or size + n > limit:
                self._size = size
                line(body, n, out)
                size = self._size
                data = self._data
                skipping = self._skipping
                continue
            size += n
            if not body:
                # WHATWG blank line: dispatch if the data buffer is non-empty; reset the block.
                if data:
                    self._size = size
                    self._emit_event(out)
                    data = self._data = []
                elif self._fields is not None:  # a block of surfaced fields only
                    self._size = size
                    self._emit_event(out)
                self._event = b""
                self._retry = None
                size = 0
                continue
            if body.startswith(b"data:"):
                # One slice (a 300 KB line is copied once): drop ONE leading space if present.
                data.append(body[6:] if body[5:6] == b" " else body[5:])
                continue
            if body.startswith(b"event:"):
                value = body[6:]
                if value[:1] == b" ":
                    value = value[1:]
                self._event = value
                continue
            # Comments, id, retry, unknown fields: size already counted.
            self._size = size
            line(body, 0, out)
        self._size = size

    def _line_before_lf(self, body: bytes, n: int, out: list[Message | Violation]) -> None:
        """Handles a line whose CR terminator is the last byte fed so far (an LF may follow)."""
        if self._skipping:
            self._line(body, n, out)
            self._cr = _CR_DROP
        elif not body:
            # A blank line: defer it until we know whether its line end is CR or CRLF, so
            # that size_bytes counts the whole terminator whatever the chunking.
            self._size += n
            if self._size > self._max:
                self._oversize(out, line_complete=True, blank=True)
                self._cr = _CR_DROP
            else:
                self._cr = _CR_DEFER
        else:
            self._held = (body, n)
            self._cr = _CR_LINE

    def _line(self, body: bytes, n: int, out: list[Message | Violation]) -> None:
        """Processes one complete line: ``body`` without its terminator, ``n`` its size on the
        wire with the terminator (the size of a deferred blank line is already counted when
        ``n`` is 0)."""
        if self._skipping:
            # Oversize recovery: only a blank line (a line end right at a line start) ends it.
            if self._skip_at_line_start and not body:
                self._skipping = False
            self._skip_at_line_start = True
            return
        size = self._size + n
        self._size = size
        if size > self._max:
            self._oversize(out, line_complete=True, blank=not body)
            return
        if not body:
            # WHATWG: "If the line is empty (a blank line): Dispatch the event." (Here also a
            # block of surfaced fields only: ``observer.wire.recovery``.)
            if self._data or self._fields is not None:
                self._emit_event(out)
            # WHATWG: if the data buffer is empty, reset the data and event type buffers and
            # return without dispatching. Either way the block's buffers start afresh.
            self._reset_block()
            return
        if body[0] == _COLON:
            # WHATWG: "If the line starts with a U+003A COLON character (:)": ignore the line.
            return
        colon = body.find(b":")
        if colon < 0:
            # WHATWG: no colon -> the whole line is the field name, the value is "".
            name = body
            value = b""
        else:
            # WHATWG: field name before the first colon; value after it, minus ONE leading
            # U+0020 SPACE if present.
            name = body[:colon]
            value = body[colon + 1 :]
            if value[:1] == b" ":
                value = value[1:]
        # Decoding: field names are compared as bytes (all valid names are ASCII); values are
        # UTF-8 decoded with replacement. Lines are split on bytes first, so a character split
        # across chunks is whole by then, and no invalid sequence can span an ASCII separator.
        if name == b"data":
            # WHATWG: append the value and a LF to the data buffer (joined at dispatch).
            self._data.append(value)
        elif name == b"event":
            # WHATWG: set the event type buffer to the value.
            self._event = value
        elif name == b"id":
            # WHATWG: if the value contains U+0000 NULL, ignore the field; otherwise set the
            # last event ID buffer (which persists across events) to the value.
            if b"\x00" not in value:
                self._last_id = value.decode("utf-8", "replace")
        elif name == b"retry":
            # WHATWG: if the value consists of only ASCII digits, set the reconnection time;
            # otherwise ignore the field. (bytes.isdigit is ASCII-only and False for b"".)
            if value.isdigit():
                try:
                    self._retry = int(value)
                except ValueError:  # more digits than int() accepts (sys.int_info): ignore
                    pass
        else:
            # WHATWG: any other field name is ignored. Here it is put on record: surfaced, or
            # named (``observer.wire.recovery``).
            self._nonstandard(name, value, out)

    def _nonstandard(self, name: bytes, value: bytes, out: list[Message | Violation]) -> None:
        """An unknown field ``name: value`` of the current block: kept to be dispatched with
        the block when ``observer.wire.recovery.surfaced`` says so (at most
        ``MAX_SURFACED_PER_BLOCK`` per block), else named in a ``nonstandard_field`` violation
        the first time its name is seen (at most ``MAX_NAMED_FIELDS`` names per stream)."""
        fields = self._fields
        if surfaced(name, value) and (fields is None or len(fields) < MAX_SURFACED_PER_BLOCK):
            if fields is None:
                self._fields = fields = []
            fields.append((name, value))
            return
        key = name[:MAX_SHOWN_NAME_BYTES]
        if key in self._named or len(self._named) >= MAX_NAMED_FIELDS:
            return
        self._named.add(key)
        detail = f"field {shown(name)} ({nbytes(len(value))}) is not an SSE field: ignored, as WHATWG §9.2.6 says"
        if surfaced(name, value):
            detail += f" (more than {MAX_SURFACED_PER_BLOCK} JSON-valued fields in one event)"
        out.append(Violation(ViolationKind.NONSTANDARD_FIELD, None, detail))

    def _emit_event(self, out: list[Message | Violation]) -> None:
        # WHATWG: data buffer = values each followed by LF, then one trailing LF removed,
        # i.e. the values joined by LF (decoding is the consumer's: module docstring).
        data = self._data
        if len(data) == 1 and self._fields is None:
            self._emit_raw(data[0], self._event, self._size, self._retry, out)
        else:
            self._emit_block(out)

    def _emit_block(self, out: list[Message | Violation]) -> None:
        """Dispatches the current block when it is more than one data line: several data lines
        (their JSON documents, when ``observer.wire.recovery.json_documents`` finds several),
        and/or surfaced fields, each after its ``nonstandard_field`` violation; sizes shared as
        the module docstring says. The surfaced fields are consumed."""
        data, fields = self._data, self._fields
        self._fields = None
        if fields is None:
            self._emit_lines(data, self._event, self._size, self._retry, out)
            return
        # Every later message counts its data's length, the first the rest (module docstring).
        later = sum(len(value) for _, value in fields)
        size = self._size - later
        retry = self._retry
        if data:
            self._emit_lines(data, self._event, size, retry, out)
        else:
            name, value = fields[0]
            fields = fields[1:]
            out.append(self._surfaced_violation(name, value))
            out.append((name, value, self._last_id, retry, size + len(value)))
        for name, value in fields:
            out.append(self._surfaced_violation(name, value))
            out.append((name, value, self._last_id, None, len(value)))

    @staticmethod
    def _surfaced_violation(name: bytes, value: bytes) -> Violation:
        detail = (
            f"field {shown(name)} ({nbytes(len(value))}) is not an SSE field (WHATWG §9.2.6 ignores it): "
            f"its value dispatched as an event of type {shown(name)}"
        )
        return Violation(ViolationKind.NONSTANDARD_FIELD, None, detail)

    def _emit_lines(
        self, values: list[bytes], event: bytes, size: int, retry: int | None, out: list[Message | Violation]
    ) -> None:
        """Dispatches a block of ``data`` lines ``values`` (one or more): as WHATWG joins them,
        unless they hold several JSON documents (``observer.wire.recovery.json_documents``):
        then one ``nonconformant_framing`` violation and one message per document, ``retry`` on
        the first, each later one counting its document's length and the first the rest."""
        docs = json_documents(values) if len(values) > 1 else None
        if docs is None:
            self._emit_raw(values[0] if len(values) == 1 else b"\n".join(values), event, size, retry, out)
            return
        detail = (
            f"{len(docs)} JSON documents in one event's data ({len(values)} data lines without a blank line "
            "between them): each read as an event of its own"
        )
        out.append(Violation(ViolationKind.NONCONFORMANT_FRAMING, None, detail))
        last_id = self._last_id
        first = size - sum(len(doc) for doc in docs[1:])
        out.append((event, docs[0], last_id, retry, first))
        for doc in docs[1:]:
            out.append((event, doc, last_id, None, len(doc)))

    def _emit_raw(self, raw: bytes, event: bytes, size: int, retry: int | None, out: list[Message | Violation]) -> None:
        """Dispatches one event: data ``raw`` and type ``event`` undecoded, ``size`` bytes on the
        wire, ``retry`` set by its block."""
        out.append((event, raw, self._last_id, retry, size))

    def _reset_block(self) -> None:
        self._data = []
        self._event = b""
        self._retry = None
        self._size = 0
        self._fields = None

    def _oversize(self, out: list[Message | Violation], *, line_complete: bool, blank: bool) -> None:
        """Discards the current block (reported once) and, unless the line that overflowed was
        the block's own blank line, skips input up to the next blank line."""
        out.append(Violation(kind=ViolationKind.OVERSIZE_EVENT, seq=None, detail=f"event exceeded {self._max} bytes"))
        self._reset_block()
        self._partial.clear()
        self._skipping = not blank
        self._skip_at_line_start = line_complete
