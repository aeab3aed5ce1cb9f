"""Incremental, sans-IO line framer for newline-delimited JSON (NDJSON / JSON Lines).

Frames one message per line; it does **not** parse JSON. Sources:

- NDJSON spec (ndjson/ndjson-spec 1.0, "Parsing"): each line is one JSON text, lines are
  separated by ``\\n`` (LF); ``\\r\\n`` is also accepted "since the ``\\r`` is whitespace" in JSON.
- Ollama ``/api/chat`` and ``/api/generate`` streams (ollama ``docs/api.md``): one complete JSON
  object per ``\\n``-terminated line, no sentinel.
- Vercel AI SDK <= 4 "data stream protocol" (header ``x-vercel-ai-data-stream: v1``): lines
  such as ``0:"Hello"``, ``9:{...}``, ``d:{...}`` -- *not* JSON texts, which is why this framer
  only cuts lines and leaves their interpretation to the dialect.

Bytes go in through :meth:`NDJSONDecoder.feed`, messages (``observer.wire.frames.Message``
tuples ``(None, line, None, None, size_bytes)``) and :class:`~observer.records.Violation` values
come out in stream order; no I/O, no clock, no
globals; malformed input never raises, it is reported.

Shapes and units
----------------
- Input: ``bytes`` (any bytes-like object is accepted and copied once), split anywhere:
  inside a line, inside a multi-byte UTF-8 character, inside the leading BOM, between the CR
  and the LF of a CRLF.
- Output: ``list[Message | Violation]``. Concatenating the lists returned by every ``feed``
  and the final ``close`` gives the same sequence however the input was split.
- The message's data: the line without its line end, undecoded bytes (the consumer decodes;
  ``observer.wire.frames.text_message`` reports invalid UTF-8).
- The message's ``size_bytes`` and ``max_line_bytes``: bytes on the wire, the line *and* its
  terminator (1 byte for LF, 2 for CRLF); the stream's leading UTF-8 BOM is excluded. Skipped
  blank lines belong to no frame, so the sizes of all frames add up to the body's length minus
  the BOM and the blank lines.

Line rules
----------
- A line ends at LF. One CR right before the LF is part of the line end (CRLF) and is removed,
  also when the CR ends one chunk and the LF begins the next. A CR anywhere else ("lone CR") is
  line content: the NDJSON spec separates lines with LF only (unlike SSE, a bare CR does not end
  a line here). A CR that is the very last byte of the stream is taken for a CRLF cut short and
  removed from the final line's text (it still counts in ``size_bytes``).
- Blank lines -- empty or only JSON whitespace (RFC 8259 §2: space, HTAB, CR) -- are skipped: no
  frame, no violation (the NDJSON spec lets parsers ignore empty lines).
- A leading UTF-8 BOM (EF BB BF) is removed once (RFC 8259 §8.1 lets parsers ignore it); a BOM
  later in the stream is content.
- End of stream: a final line without LF is still framed, followed by
  ``Violation(kind="unterminated_final_event")``, unless it is blank (then nothing).
- Oversize: a line whose ``size_bytes`` would exceed ``max_line_bytes`` gives one
  ``Violation(kind="oversize_event")`` and no frame; its bytes are dropped as they arrive (O(1)
  held) up to its LF, and framing resumes with the next line.
- UTF-8: lines are cut on the LF byte, and LF never occurs inside a multi-byte UTF-8 sequence,
  so a character split across chunks is whole in its line.
"""

from __future__ import annotations

from observer.records import Violation, ViolationKind
from observer.wire.bom import LeadingBOM
from observer.wire.frames import Message, nbytes, positive_size

__all__ = ["NDJSONDecoder"]

_CR = 0x0D
_LF = 0x0A
# RFC 8259 §2 insignificant whitespace minus LF (LF cannot occur inside a line).
_JSON_WS = b" \t\r"


class NDJSONDecoder:
    """Incremental NDJSON line framer (see the module docstring for the rules).

    ``max_line_bytes`` (bytes, > 0) bounds one line as measured by its ``size_bytes``.
    The decoder holds at most ``max_line_bytes`` bytes of an incomplete line (plus up to 2 bytes
    of a possible split BOM) between calls.

    Cost: each input byte is searched once by C code (``bytes.find``/``bytes.split``) when its
    chunk arrives; the bytes of an incomplete line are appended to a ``bytearray`` and never
    rescanned (a 300 KB line fed in 16 KB pieces costs O(300 KB)); Python work is per line.
    """

    __slots__ = ("_max", "_closed", "_bom", "_partial", "_skipping", "_bom_open", "_idle")

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        """Raises ``ValueError`` if ``max_line_bytes`` is not a positive int."""
        self._max = positive_size(max_line_bytes, "max_line_bytes")
        self._closed = False
        # Bytes seen at the very start of the stream while they may still be a split BOM; None
        # once the BOM question is settled (at most 2 bytes are ever held here).
        self._bom = LeadingBOM()
        # The incomplete current line (no LF seen yet), a trailing CR included.
        self._partial = bytearray()
        # Oversize recovery: dropping input up to the next LF.
        self._skipping = False
        self._bom_open = True  # until the leading-BOM question is settled
        self._idle = False  # nothing held, BOM settled, not closed: set after each long-way feed

    @property
    def buffered_bytes(self) -> int:
        """Bytes of input currently held (incomplete line, possible BOM prefix). Diagnostic."""
        return len(self._partial) + self._bom.held_bytes

    def feed(self, data: bytes) -> list[Message | Violation]:
        """Consumes the next chunk of the response body and returns what it completed.

        Returns the frames and violations of the lines this chunk completed, in stream order
        (often ``[]``). Raises ``ValueError`` if called after :meth:`close`.

        The commonest chunk, exactly one whole LF-ended line arriving while nothing is held
        (``_idle``), is handled first, in as few steps as possible."""
        if self._idle and data.__class__ is bytes:
            n = len(data)
            if data.find(b"\n") == n - 1 and n <= self._max:
                body = data[:-2] if n > 1 and data[-2] == _CR else data[:-1]
                if body and (body[0] not in _JSON_WS or body.strip(_JSON_WS)):  # not blank
                    return [(None, body, None, None, n)]
                return []
        out = self._feed(data)
        self._idle = not (self._bom_open or self._partial or self._skipping or self._closed)
        return out

    def _feed(self, data: bytes) -> list[Message | Violation]:
        """``feed`` for any chunk."""
        if self._closed:
            raise ValueError("NDJSONDecoder.feed() called after close()")
        if not isinstance(data, bytes):
            data = bytes(data)
        out: list[Message | Violation] = []
        if self._bom_open:
            data = self._bom.feed(data)  # strip exactly one leading BOM
            self._bom_open = not self._bom.settled
        if data:
            self._consume(data, out)
        return out

    def close(self) -> list[Message | Violation]:
        """Signals end of stream; returns what the end completed. Idempotent (then ``[]``).

        A non-blank final line without LF is returned as a message followed by
        ``Violation(kind="unterminated_final_event")``; a blank one, or nothing pending, gives
        ``[]``; a line being skipped as oversize was already reported and gives nothing more.
        """
        if self._closed:
            return []
        self._closed = True
        self._idle = False
        out: list[Message | Violation] = []
        pending_bom = self._bom.flush()
        if pending_bom:
            # The stream ended inside what could have been a BOM: those bytes are content.
            self._consume(pending_bom, out)
        if self._skipping:
            self._skipping = False
            self._partial.clear()
            return out
        if self._partial:
            raw = bytes(self._partial)
            self._partial.clear()
            # A CR as the very last byte: the first half of a CRLF whose LF never came.
            body = raw[:-1] if raw[-1] == _CR else raw
            if body.strip(_JSON_WS):
                self._emit(body, len(raw), out)
                out.append(
                    Violation(
                        kind=ViolationKind.UNTERMINATED_FINAL_EVENT,
                        seq=None,
                        detail=f"stream ended without a line feed after the final line ({nbytes(len(raw))})",
                    )
                )
        return out

    # -- internals ---------------------------------------------------------------------------

    def _consume(self, data: bytes, out: list[Message | Violation]) -> None:
        """Scans one non-empty chunk (BOM already handled)."""
        if self._skipping:
            # Oversize recovery: drop everything up to and including the next LF, holding nothing.
            lf = data.find(b"\n")
            if lf < 0:
                return
            self._skipping = False
            data = data[lf + 1 :]
            if not data:
                return
        partial = self._partial
        if data.find(b"\n") < 0:
            # No line end in this chunk: the line grows. Check the bound before copying so the
            # decoder never holds more than max_line_bytes. A line already longer than the limit
            # without its LF is oversize whatever follows (size_bytes counts the LF too).
            if len(partial) + len(data) > self._max:
                self._oversize(out)
            else:
                partial += data
            return
        # One C-level split of the chunk; the last piece is the start of an incomplete line.
        # Without a CR (memchr; a held line included) no line needs its CR removed.
        crs = _CR in data or _CR in partial
        lines = data.split(b"\n")
        tail = lines.pop()
        if partial:
            # The incomplete line held from earlier chunks is completed by the first piece.
            first = lines[0]
            if len(partial) + len(first) + 1 > self._max:
                lines[0] = None  # type: ignore[call-overload]  # oversize: reported below
            else:
                partial += first  # one copy of a long line, not two
                lines[0] = bytes(partial)
            partial.clear()
        append = out.append
        limit = self._max
        for raw in lines:
            n = len(raw) + 1 if raw is not None else limit + 1
            if n > limit:
                # A complete line over the limit: report it, nothing to skip (its LF is here).
                append(self._oversize_violation())
                continue
            # CRLF: the CR right before the LF belongs to the line end (it counts in size).
            if crs and raw and raw[-1] == _CR:
                raw = raw[:-1]
            if not raw or (raw[0] in _JSON_WS and not raw.strip(_JSON_WS)):
                continue  # blank line: not a message
            append((None, raw, None, None, n))
        if tail:
            if len(tail) > limit:
                self._oversize(out)
            else:
                partial += tail

    def _emit(self, body: bytes, size: int, out: list[Message | Violation]) -> None:
        """Appends the message of one line (``body`` without its line end; ``size`` on the wire)."""
        out.append((None, body, None, None, size))

    def _oversize_violation(self) -> Violation:
        # The detail must not depend on where the overflow was noticed (chunking independence).
        return Violation(kind=ViolationKind.OVERSIZE_EVENT, seq=None, detail=f"line exceeded {self._max} bytes")

    def _oversize(self, out: list[Message | Violation]) -> None:
        """Reports the incomplete current line as oversize and skips input to its LF."""
        out.append(self._oversize_violation())
        self._partial.clear()
        self._skipping = True
