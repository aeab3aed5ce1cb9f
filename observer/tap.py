"""The per-flow observation pipeline, sans-IO: response bytes in, the response's facts out.

    bytes (as forwarded, still content-encoded)
      -> observer.wire.content decoder (Content-Encoding, RFC 9110 §8.4)
      -> framer chosen by the dialect (observer.wire.frames: SSE, NDJSON, JSON array, whole JSON)
      -> dialect adapter (wire messages -> canonical events)
      -> observer.reassembly.Reassembler (canonical events -> record)

The caller (the mitmproxy addon) supplies every clock reading and must never let an exception
from ``feed`` reach the proxy: it calls ``fail`` instead and keeps forwarding bytes. Non-2xx
answers and bodies the dialect cannot read are not parsed; their first ``max_body_bytes`` are
kept verbatim.

Fast lanes (the bulk of a stream): with no Content-Encoding the decoder is skipped; for SSE and
NDJSON each message's undecoded data is parsed once with orjson (which validates UTF-8) and
offered to the adapter's ``fast`` method (a text delta or tool-argument fragment goes to the
reassembler with no canonical event built) or else its ``on_object``
(``observer.dialects.base.StreamAdapter``). Three ways in, one per chunk shape:

- a chunk that is exactly one simple message (the commonest chunk of a token stream): ``feed``;
- a chunk of many: ``_bulk``, one loop over the whole simple messages (split once), the framer
  taking over from the first message that is anything else;
- whatever reaches the framer: its ``sink`` hook, ``_sink``.

Consecutive hits on one block or tool call form a run, applied with one
``Reassembler.texts``/``fragments`` call (``_hit``). Data that is not valid UTF-8 JSON, and an
SSE event type that is not ASCII, take the general path (decoded message, ``on_message``), so
violations are reported as before; the record is the same either way
(tests/unit/test_fast_lane.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from observer.dialects.base import Dialect
from observer.errors import ObserverError
from observer.reassembly import EndCause, Reassembler
from observer.records import Outcome, Violation, ViolationKind, utc_from_epoch
from observer.response import ResponseFacts, ResponseSpec, StreamEnd
from observer.wire.content import ContentDecoder, make_decoder
from observer.wire.frames import Framing, JSONFrame, make_framer

_log = logging.getLogger("observer.tap")  # bugs caught by feed_pending (fail open), with their traceback

_loads = orjson.loads
_CR = 0x0D
_LF = 0x0A
_JSONDecodeError = orjson.JSONDecodeError
_RUN_MAX = 256  # pieces a run holds before they are applied (the reassembler's coalescing period)


class _ParsedEvent:
    """An SSE event whose data the tap already parsed (so known valid UTF-8): ``event``, ``id``,
    ``retry``, ``size_bytes`` as in ``observer.wire.sse.SSEEvent``; ``data`` (str) is decoded
    from the raw bytes only if an adapter reads it (a 300 KB event is not decoded for nothing)."""

    __slots__ = ("event", "id", "retry", "size_bytes", "_raw")

    def __init__(self, event: str, raw: bytes, id: str | None, retry: int | None, size_bytes: int) -> None:
        self.event = event
        self._raw = raw
        self.id = id
        self.retry = retry
        self.size_bytes = size_bytes

    @property
    def data(self) -> str:
        return self._raw.decode("utf-8")


class _ParsedFrame(JSONFrame):
    """A ``JSONFrame`` (NDJSON line) the tap already parsed: ``data`` decoded on first use, as
    in ``_ParsedEvent``. Built with :func:`_parsed_frame` (the frozen dataclass's ``__init__``
    would try to assign ``data``)."""

    __slots__ = ("_raw",)

    @property  # type: ignore[override]
    def data(self) -> str:  # shadows JSONFrame's slot
        return self._raw.decode("utf-8")


_set_size = JSONFrame.size_bytes.__set__  # type: ignore[attr-defined]
_set_event = JSONFrame.event.__set__  # type: ignore[attr-defined]
_set_raw = _ParsedFrame._raw.__set__  # type: ignore[attr-defined]


def _parsed_frame(raw: bytes, size: int) -> _ParsedFrame:
    frame = object.__new__(_ParsedFrame)
    _set_raw(frame, raw)
    _set_size(frame, size)
    _set_event(frame, "")
    return frame


class StreamObserver:
    """Observes one response of an LLM exchange: ``dialect`` reads it, ``spec`` says what it is
    (status, media type, encoding, the request's declared tools and correlation id, limits).
    ``feed`` takes each forwarded chunk (bytes) with its arrival time ``now_s`` (epoch seconds);
    ``finish`` returns the ``ResponseFacts``.
    """

    def __init__(self, dialect: Dialect, spec: ResponseSpec) -> None:
        limits = spec.limits
        self._spec = spec
        self._facts = ResponseFacts()
        self._limits = limits
        # The run (see ``_hit``): fast-lane pieces after a run's first, not yet applied; the run
        # is a text run (``_text_index``/``_text_type`` set) or a fragment run (``_frag_head``:
        # the key, index, id and name of its fragments), or none. Applied by ``_flush`` before
        # anything else reaches the reassembler, so it sees the same calls in the same order.
        self._run: list[str] = []
        # Data a lane failed to parse as JSON (the framer's sink is offered it next): equal bytes
        # parse the same, so the sink declines them without parsing a second time.
        self._bad: bytes | None = None
        self._text_index: int | None = None
        self._text_type: str | None = None
        self._frag_head: tuple | None = None
        self._reassembler = Reassembler(spec.tool_names, spec.request_id, limits=limits)
        self._adapter = dialect.new_adapter(spec)
        self._http_error = not 200 <= spec.status_code < 300
        mtype = spec.media_type
        framing = None if self._http_error else dialect.framing(spec)
        if not self._http_error and framing is None:
            self._reassembler.violation(
                Violation(ViolationKind.UNEXPECTED_CONTENT_TYPE, None, f"response Content-Type {mtype!r}")
            )
        self._body: bytearray | None = None if framing is not None else bytearray()
        self._framer = (
            None
            if framing is None
            else make_framer(
                framing, max_event_bytes=limits.max_event_bytes, max_json_body_bytes=limits.max_json_body_bytes
            )
        )
        self._decoder: ContentDecoder | None = None
        self._broken = False
        self._messages = 0
        self._cap = limits.max_stream_events
        self._now = 0.0  # the clock reading of the chunk being framed (for the framer's sink)
        try:
            # Bounded decoding: a decompression bomb stops observation, never the proxy loop.
            self._decoder = make_decoder(spec.content_encoding, max_ratio=limits.max_decode_ratio)
        except ObserverError as exc:
            self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
        # No Content-Encoding: the bytes are the plain body; the metered identity decoder can
        # never refuse them (output = input <= max_ratio x input), so ``feed`` skips it.
        self._identity = getattr(self._decoder, "identity", False)
        # JSON-message framings whose adapter can map a pre-parsed message (``on_object``): the
        # framer hands each message's raw bytes to ``_sink``, which parses them once (orjson
        # validates UTF-8) and tries the adapter's fast lane before the general mapping.
        self._on_object = getattr(self._adapter, "on_object", None)
        self._fast = getattr(self._adapter, "fast", None)
        self._sse = framing is Framing.SSE
        if self._on_object is not None and framing in (Framing.SSE, Framing.NDJSON):
            self._framer.sink = self._sink
        self._closed = False
        # The one-message-chunk lane (``feed``): plain body, SSE/NDJSON with a fast-lane adapter.
        # ``_lane`` is true while the framer holds nothing (re-checked after each framer feed),
        # so a chunk that is exactly one complete message can bypass the framer.
        self._can_lane = (
            self._identity
            and self._fast is not None
            and self._on_object is not None
            and self._body is None
            and framing in (Framing.SSE, Framing.NDJSON)
            and not self._broken
        )
        self._lane = False
        self._max_event = limits.max_event_bytes

    @property
    def needs_arrival_times(self) -> bool:
        """False once no later chunk's arrival time can change the record: the first text has
        been seen (its arrival, ``ttft_s``, is the only chunk time a record keeps; the end time is
        ``finish``'s) or observation stopped. From then on a caller may join consecutive chunks
        and feed them as one with any time: the framers' and decoders' output does not depend on
        how the input was split (tests/unit/test_tap_batcher.py)."""
        return self._reassembler._first_text_s is None and not self._broken

    @property
    def broken(self) -> bool:
        """True once observation of this flow stopped (bytes still pass through)."""
        return self._broken

    @property
    def response_bytes(self) -> int:
        """Bytes of the response counted so far (fed or ``skip``-ped)."""
        return self._facts.response_bytes

    def skip(self, nbytes: int) -> None:
        """Counts ``nbytes`` forwarded but never fed (observation had stopped elsewhere)."""
        self._facts.response_bytes += nbytes

    def feed(self, data: bytes, now_s: float) -> None:
        """Observes one forwarded chunk (bytes) that arrived at ``now_s`` (epoch seconds). May
        raise on a bug; the caller then calls ``fail``.

        The commonest chunk of a token stream, exactly one complete message (SSE: one
        ``data: `` line, optionally after one ``event: `` line, LF line ends; NDJSON: one LF-ended
        line; CRLF line ends for a lone ``data: `` line) arriving while the framer holds nothing, is handled here without the framer: one
        orjson parse, then the adapter's fast lane (or ``on_object``), as ``_sink`` would. A
        chunk that is anything else, or data that is not JSON, goes through the framer."""
        n = len(data)
        self._facts.response_bytes += n
        if self._lane and n <= self._max_event:
            # Exactly one whole message: taken here, or (data not JSON) straight to the framer.
            if self._sse:
                if data[-2:] == b"\n\n" and _CR not in data:
                    head, _, rest = data.partition(b"\n")
                    if rest == b"\n":
                        if head[:6] == b"data: ":
                            if self._one(b"", head[6:], n, now_s):
                                return
                            self._framed(data, now_s)
                            return
                    elif head[:7] == b"event: " and rest[:6] == b"data: " and rest.find(_LF) == len(rest) - 2:
                        if self._one(head[7:], rest[6:-2], n, now_s):
                            return
                        self._framed(data, now_s)
                        return
                elif (
                    data[-4:] == b"\r\n\r\n"
                    and data[:6] == b"data: "
                    and data.find(b"\r") == n - 4
                    and data.find(b"\n") == n - 3
                ):
                    # One CRLF data-line event (Google's streams).
                    if self._one(b"", data[6:-4], n, now_s):
                        return
                    self._framed(data, now_s)
                    return
            elif n and data.find(b"\n") == n - 1 and (n < 2 or data[n - 2] != _CR):
                if self._one(None, data[:-1], n, now_s):
                    return
                self._framed(data, now_s)
                return
        if self._broken or not data:
            return
        if self._identity:
            if self._can_lane:
                self._bulk(data, now_s)
            elif self._body is None:
                self._framed(data, now_s)
            else:
                self._consume(data, now_s)
            return
        assert self._decoder is not None
        try:
            plain = self._decoder.feed(data)
        except ObserverError as exc:
            self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
            return
        self._consume(plain, now_s)

    def _frame(self, data: bytes, now_s: float) -> None:
        """Feeds plain bytes to the framer and dispatches what it completes (its messages reach
        ``_sink`` or, not JSON, the general path)."""
        self._now = now_s
        items = self._framer.feed(data)
        if items:
            self._dispatch_all(items, now_s)

    def _framed(self, data: bytes, now_s: float) -> None:
        """A plain chunk straight to the framer; the one-message lane opens if it is idle after."""
        self._frame(data, now_s)
        self._lane = self._can_lane and not self._broken and self._framer.idle

    def _bulk(self, data: bytes, now_s: float) -> None:
        """A chunk of a plain SSE/NDJSON stream with a fast-lane adapter that the one-message
        lane did not take: the messages the framer would dispatch from it one by one through
        ``_sink`` are handled here in one loop (split once, parse, fast lane, run) while they are
        whole simple messages (SSE: one ``data`` line, optionally after one ``event`` line, LF
        line ends, or CRLF throughout; NDJSON: LF-ended lines) and parse as JSON. A block held
        from the previous chunk is finished by the framer first; from the first message that is
        anything else (comments, ``id``/``retry``, several data lines, blank lines, oversize,
        not JSON, an event type not ASCII) the rest of the chunk goes to the framer, which is
        then exactly where it would be had it seen the whole chunk (it is idle at a message
        boundary, and its output does not depend on how input is split). Same record as the
        framer path (tests/unit/test_fast_lane.py)."""
        self._now = now_s
        framer = self._framer
        if self._sse:
            # LF line ends throughout, else try CRLF (Google's streams; each block is checked).
            sep = b"\n\n" if _CR not in data else b"\r\n\r\n"
        elif _CR not in data:
            sep = b"\n"
        else:
            self._framed(data, now_s)
            return
        pos = 0
        if not self._lane:
            # The framer holds something (``_lane`` is false whenever it is not idle): let it
            # finish that message first. A chunk with no message end only adds to what it holds.
            pos = data.find(sep)
            if pos < 0:
                self._frame(data, now_s)
                return
            pos += len(sep)
            self._frame(data[:pos], now_s)
            if self._broken:
                return
            if not framer.idle:
                if pos < len(data):
                    self._framed(data[pos:], now_s)
                return
        n = len(data)
        if pos < n:
            pos = self._messages_lane(data, pos, sep, now_s)
            if self._broken:
                return
            if pos < n:
                self._frame(data[pos:] if pos else data, now_s)
        self._lane = not self._broken and framer.idle

    def _messages_lane(self, data: bytes, pos: int, sep: bytes, now_s: float) -> int:
        """``_bulk``'s loop over the whole messages of ``data[pos:]`` (the framer idle at
        ``pos``); returns where the framer must take over (``len(data)`` when nothing is left)."""
        blocks = (data[pos:] if pos else data).split(sep)
        blocks.pop()  # the unfinished tail (maybe b""): the framer's
        sse = self._sse
        crlf = sep == b"\r\n\r\n"
        term = len(sep)
        limit = self._max_event
        cap = self._cap
        fast = self._fast
        r = self._reassembler
        run = self._run
        last_id = self._framer.last_id if sse else None
        event_b = b"" if sse else None
        # Hot state in locals, written back before anything that reads it: the message count
        # (``_over_cap``, ``_mapped``, the return), the run's keys (changed only by ``_hit``).
        m = self._messages
        ended = r._ended
        ti, tt, fh = self._text_index, self._text_type, self._frag_head
        try:
            for block in blocks:
                size = len(block) + term
                if size > limit or not block:
                    return pos
                if sse:
                    # A whole block of one line "data:" or two, "event:" then "data:", each ended by
                    # LF (no CR anywhere in the chunk) or by CRLF (no other CR or LF in the block).
                    if block[:5] == b"data:":
                        if _LF in block or (crlf and _CR in block):
                            return pos
                        event_b = b""
                        raw = block[6:] if block[5:6] == b" " else block[5:]
                    elif block[:6] == b"event:":
                        head, _, rest = block.partition(b"\r\n" if crlf else b"\n")
                        if rest[:5] != b"data:" or _LF in rest:
                            return pos
                        if crlf and (_CR in rest or _CR in head or _LF in head):
                            return pos
                        event_b = head[7:] if head[6:7] == b" " else head[6:]
                        raw = rest[6:] if rest[5:6] == b" " else rest[5:]
                    else:
                        return pos
                else:
                    raw = block
                try:
                    obj = _loads(raw)
                except _JSONDecodeError:
                    self._bad = raw  # the framer's sink gets these bytes first: not parsed again
                    return pos
                m += 1
                if m > cap:
                    self._messages = m
                    self._over_cap()
                    return len(data)
                if not ended and (not event_b or event_b.isascii()):
                    hit = fast(event_b, obj)
                    if hit is not None:
                        if hit:
                            # ``_take_hit`` with the run's state in locals (the bulk loop's hottest lines)
                            if len(hit) == 3:
                                piece = hit[2] if hit[0] == ti and hit[1] == tt else None
                            else:
                                piece = hit[5] if hit[1:5] == fh else None
                            if piece:
                                run.append(piece)
                                if len(run) >= _RUN_MAX:
                                    self._flush()
                                    run = self._run
                            else:
                                self._hit(hit, now_s)
                                run, ti, tt, fh = self._run, self._text_index, self._text_type, self._frag_head
                        pos += size
                        continue
                self._messages = m
                taken = self._mapped(event_b, raw, obj, size, last_id, None, now_s)
                m = self._messages
                if not taken:
                    return pos  # an event type that is not UTF-8: the framer reports it
                if self._broken:
                    return len(data)
                run, ended = self._run, r._ended
                pos += size
        finally:
            self._messages = m
        return pos

    def fail(self, exc: BaseException) -> None:
        """Stops observing after an unexpected exception; records ``observer_error``."""
        self._stop(ViolationKind.OBSERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def _one(self, event_b: bytes | None, raw: bytes, size: int, now_s: float) -> bool:
        """``feed``'s lane: one complete message (SSE event type ``event_b``, ``None`` for
        NDJSON; undecoded data ``raw``; ``size`` wire bytes) while the framer holds nothing.
        Does what the framer and ``_sink`` would do with it and returns True; returns False
        (nothing done) when the framer must see it (data not JSON, event type not UTF-8).
        It repeats ``_sink``'s count-and-fast-lane steps on purpose (measured:
        docs/performance.md, "The one-message lane")."""
        try:
            obj = _loads(raw)
        except _JSONDecodeError:
            self._bad = raw  # the framer's sink gets these bytes next: not parsed again there
            return False
        m = self._messages = self._messages + 1
        if m > self._cap:
            self._over_cap()
            return True
        if not self._reassembler._ended and (not event_b or event_b.isascii()):
            hit = self._fast(event_b, obj)
            if hit is not None:
                if hit:
                    self._take_hit(hit, now_s)
                return True
        self._now = now_s
        return self._mapped(event_b, raw, obj, size, self._framer.last_id if self._sse else None, None, now_s)

    def _take_hit(self, hit: tuple, now_s: float) -> None:
        """Applies a non-empty fast-lane hit observed at ``now_s``: a non-empty piece that
        continues the run (same block, or same key, index, id and name) is appended to it,
        anything else goes to ``_hit``."""
        if len(hit) == 3:
            piece = hit[2] if hit[0] == self._text_index and hit[1] == self._text_type else None
        else:
            piece = hit[5] if hit[1:5] == self._frag_head else None
        if piece:
            run = self._run
            run.append(piece)
            if len(run) >= _RUN_MAX:
                self._flush()
        else:
            self._hit(hit, now_s)

    def _hit(self, hit: tuple, now_s: float) -> None:
        """Applies a fast-lane hit that does not continue the current run: the run so far is
        applied, then ``hit`` itself, directly (a block opens, the first-text time is taken, a
        tool call opens exactly as from one event); a non-empty text or a fragment
        then starts a run that the next hits on the same block / call (same key, index, id and
        name: setting them again changes nothing) join.

        Why runs: consecutive hits on one block differ only in their text (the only time ever
        read is the first text's, taken here), so ``Reassembler.texts``/``fragments`` apply them
        in one call with the same result as one ``text``/``fragment`` call each (cheaper per
        token: docs/performance.md, "The one-message lane")."""
        if self._run:
            self._flush()
        r = self._reassembler
        if len(hit) == 3:
            r.text(hit[0], hit[1], hit[2], now_s)
            self._frag_head = None
            if hit[2]:
                self._text_index, self._text_type = hit[0], hit[1]
            else:
                self._text_index = self._text_type = None
        else:
            r.fragment(*hit)
            self._text_index = self._text_type = None
            self._frag_head = hit[1:5]

    def _flush(self) -> None:
        """Applies the run's pending pieces (the run stays open). Must run before anything
        else reaches the reassembler."""
        run = self._run
        if run:
            self._run = []
            if self._text_index is not None:
                self._reassembler.texts(self._text_index, self._text_type, run, self._now)  # type: ignore[arg-type]
            else:
                key, index, id, name = self._frag_head  # type: ignore[misc]
                self._reassembler.fragments(None, key, index, id, name, run)

    def _stop(self, kind: ViolationKind, detail: str) -> None:
        self._lane = False
        self._can_lane = False
        if self._run:
            self._flush()
        if not self._broken:
            self._broken = True
            self._reassembler.violation(Violation(kind, None, detail))

    def _consume(self, plain: bytes, now_s: float) -> None:
        if not plain:
            return
        if self._body is not None:
            room = self._limits.max_body_bytes - len(self._body)
            if room > 0:
                self._body += plain[:room]
            return
        self._frame(plain, now_s)

    def _sink(
        self, event_b: bytes, raw: bytes, size: int, last_id: str | None, retry: int | None, out: list
    ) -> bool:
        """The framer's hook (``SSEDecoder.sink``/``NDJSONDecoder.sink``): takes a message whose
        data is valid UTF-8 JSON (and whose SSE event type is valid UTF-8), else returns False
        and the framer emits it for the general path (which reports ``invalid_utf8`` /
        ``invalid_json`` as before). A taken message is counted like any other (cap
        ``max_stream_events``), goes to the adapter's fast lane if it has one and the stream has
        not ended, else to ``on_object`` with the parsed value: the record is the same as from
        ``on_message``."""
        if self._broken:
            return True  # what _dispatch_all would do with it: nothing
        if raw == self._bad:
            return False  # the lane just failed to parse these very bytes
        try:
            obj = _loads(raw)
        except _JSONDecodeError:
            return False
        if out:
            self._dispatch_all(out, self._now)
            out.clear()
            if self._broken:
                return True
        m = self._messages = self._messages + 1
        if m > self._cap:
            self._over_cap()
            return True
        fast = self._fast
        if fast is not None and not self._reassembler._ended and (not event_b or event_b.isascii()):
            hit = fast(event_b, obj)
            if hit is not None:
                if hit:
                    self._take_hit(hit, self._now)
                return True
        return self._mapped(event_b, raw, obj, size, last_id, retry, self._now)

    def _mapped(
        self, event_b: bytes | None, raw: bytes, obj: object, size: int, last_id: str | None, retry: int | None,
        now_s: float,
    ) -> bool:
        """The general mapping of a counted, parsed message (no fast-lane hit): the adapter's
        ``on_object`` with the message rebuilt around its undecoded data. Returns False, and
        un-counts it, when its SSE event type is not UTF-8 (the framer then emits it for the
        general path, which reports that)."""
        if self._sse:
            try:
                event = event_b.decode("utf-8")  # type: ignore[union-attr]
            except UnicodeDecodeError:
                self._messages -= 1  # not taken after all: the framer emits it, the count follows
                return False
            message = _ParsedEvent(event, raw, last_id, retry, size)
        else:
            message = _parsed_frame(raw, size)
        if self._run:
            self._flush()
        r = self._reassembler
        for ev in self._on_object(message, obj):
            if ev.__class__ is Violation:
                r.violation(ev)
            else:
                r.apply(ev, now_s)
        return True

    def _over_cap(self) -> None:
        cap = self._cap
        self._stop(ViolationKind.OVERSIZE_STREAM, f"more than {cap} messages: observation stopped")

    def _dispatch_all(self, items: list, now_s: float) -> None:
        """Hands framed messages (and framing violations) to the adapter, and its canonical
        events to the reassembler. The per-message loop is the hot path: names bound locally,
        one exact-type test per item (``Violation`` is final by use)."""
        if self._run:
            self._flush()
        r = self._reassembler
        apply = r.apply
        on_message = self._adapter.on_message
        cap = self._cap
        for item in items:
            if self._broken:
                return
            if item.__class__ is Violation:
                r.violation(item)
                if item.kind == ViolationKind.OVERSIZE_EVENT:
                    self._adapter.on_lost()
                continue
            self._messages += 1
            if self._messages > cap:
                self._over_cap()
                return
            for ev in on_message(item):
                if ev.__class__ is Violation:
                    r.violation(ev)
                else:
                    apply(ev, now_s)

    def _apply(self, items: list, now_s: float) -> None:
        if self._run:
            self._flush()
        r = self._reassembler
        for ev in items:
            if isinstance(ev, Violation):
                r.violation(ev)
            else:
                r.apply(ev, now_s)

    def finish(self, end: StreamEnd) -> ResponseFacts:
        """Flushes the decoders and returns the response's facts (call once); ``end`` says how
        the transport ended. Raises ``RuntimeError`` on a second call."""
        if self._closed:
            raise RuntimeError("StreamObserver.finish called twice")
        self._closed = True
        self._lane = False
        self._can_lane = False
        now_s = end.now_s
        facts = self._facts
        if not self._broken and self._decoder is not None:
            try:
                tail = self._decoder.close()
                self._consume(tail, now_s)
                if self._framer is not None:
                    # Only a clean end can leave a final message without its terminator
                    # (``unterminated_final_event``); after an abort the tail is just cut off.
                    if end.cause is EndCause.EOF:
                        self._now = now_s
                        self._dispatch_all(self._framer.close(), now_s)
                    self._apply(self._adapter.on_close(), now_s)
            except ObserverError as exc:
                self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
            except Exception as exc:  # a bug in our code: record it, never lose the record
                self.fail(exc)
        facts.transport_error = end.transport_error
        facts.ended_at = utc_from_epoch(end.at_s)
        if self._run:
            self._flush()  # what the closing steps above did not flush already
        readable = self._body is None and not self._broken
        self._reassembler.finish(facts, end.cause, request_start_s=self._spec.started_at_s, readable=readable)
        if self._body is not None:
            facts.response_body = bytes(self._body).decode("utf-8", "replace")
        if self._http_error:
            facts.outcome = Outcome.HTTP_ERROR
        return facts


def feed_pending(
    obs: StreamObserver, pending: list, deadline: float | None = None, clock: Callable[[], float] | None = None
) -> int:
    """Feeds a flow's queued chunks, ``pending`` = ``[chunk, arrival_s, chunk, arrival_s, ...]``
    (bytes, epoch seconds; oldest first), to ``obs`` and returns how many items were consumed
    (``len(pending)`` when all were). Both backends (``observer.capture.backend``: in the proxy
    process and in the worker) feed through here, so their records are the same.

    Chunk by chunk while ``obs.needs_arrival_times``; after that the rest is joined and fed as
    one (bulk streams arrive one small event per chunk, and one feed of ~32 KiB parses their
    events in one loop: bench/bulk.py). With a ``deadline`` (``clock()`` seconds) it stops after
    the chunk during which the deadline passed. Never raises: an exception from ``obs`` is a bug
    in our code, so ``obs.fail`` records ``observer_error``, the remaining chunks are fed to the
    broken observer (which only counts their bytes) and it is logged."""
    i, n = 0, len(pending)
    try:
        feed = obs.feed
        while i < n:
            if n - i > 2 and not obs.needs_arrival_times:
                # No later arrival time can change the record any more.
                chunk, now = b"".join(pending[i:n:2]), pending[n - 1]
                i = n
                feed(chunk, now)
                break
            i += 2
            feed(pending[i - 2], pending[i - 1])
            if deadline is not None and i < n and clock() >= deadline:  # type: ignore[misc]
                return i
    except Exception as exc:  # fail open: stop observing, keep forwarding
        try:
            obs.fail(exc)
            while i < n:
                obs.feed(pending[i], pending[i + 1])
                i += 2
        except Exception:  # noqa: BLE001 - never out of the caller
            pass
        _log.error("observer error on a stream; observation stopped for this flow", exc_info=True)
    return n


__all__ = ["EndCause", "StreamObserver", "feed_pending"]
