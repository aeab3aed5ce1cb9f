"""The per-flow observation pipeline, sans-IO: response bytes in, the response's facts out.

    bytes (as forwarded, still content-encoded)
      -> observer.wire.content decoder (Content-Encoding, RFC 9110 §8.4)
      -> framer chosen by the dialect (observer.wire.frames: SSE, NDJSON, JSON array, whole JSON)
      -> messages (event, data bytes, id, retry, size) and framing violations
      -> dialect adapter (wire messages -> canonical events)
      -> observer.reassembly.Reassembler (canonical events -> record)

The caller (the mitmproxy addon) supplies every clock reading and must never let an exception
from ``feed`` reach the proxy: it calls ``fail`` instead and keeps forwarding bytes. Non-2xx
answers and bodies the dialect cannot read are not parsed; their first ``max_body_bytes`` are
kept verbatim.

Each message's data is parsed once, with orjson straight from the bytes (which validates UTF-8),
and offered to the adapter's fast lane (``fast``: a text delta or tool-argument fragment goes to
the reassembler with no canonical event built), else its ``on_object``
(``observer.dialects.base.StreamAdapter``). An SSE event of type ``error`` is an error whatever
the adapter makes of it (``observer.dialects.sse_errors``). Data that does not parse, and an SSE
event type that is not ASCII, take the general path: the message in its text form
(``observer.wire.frames.text_message``) to ``on_message``, so ``invalid_utf8`` / ``invalid_json``
are reported as the dialect says; the record is the same either way
(tests/unit/test_fast_lane.py). This module knows no framing: a new one is a framer that returns
messages, and a ``Framing`` name.

A *binary* framing (``Framing.binary``: Connect, gRPC, gRPC-Web envelopes around protobuf) has a
path of its own, chosen once per response: each message tuple goes as it is to the adapter's
``on_binary(message)`` (no JSON parse, no text decoding), or, for an adapter without one, to
``on_message`` as an ``observer.wire.frames.BinaryFrame``; the SSE/JSON path above is untouched.

A *multi-turn* stream (an adapter with ``multi_turn = True``: Cursor's agent ``Run``, whose
HTTP/2 stream stays open after ``turn_ended`` and may carry the next turn, binary-formats §4.4,
§5.2) is cut into turns on that path: when a turn's ``stream.end`` has been applied, the turn's
facts are finished at once (``turns``, taken by the caller with ``take_turns``) and a fresh
reassembler and adapter state take the rest, so each turn's record can be made while the stream
is still open. What follows the last turn is a record only if it holds something
(``tail_empty``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import orjson

from observer.dialects.base import Dialect
from observer.dialects.sse_errors import ERROR_TYPE, NOT_JSON, with_error
from observer.errors import ObserverError
from observer.events import ResponseIdentity
from observer.limits import MAX_NAME_CHARS, clip
from observer.reassembly import EndCause, Reassembler
from observer.records import Outcome, Violation, ViolationKind, utc_from_epoch
from observer.response import ResponseFacts, ResponseSpec, StreamEnd
from observer.wire.content import ContentDecoder, make_decoder
from observer.wire.frames import (
    Framing,
    JSONFrame,
    Message,
    binary_frame,
    make_framer,
    split_documents,
    text_message,
)

_log = logging.getLogger("observer.tap")  # bugs caught by feed_pending (fail open), with their traceback

_loads = orjson.loads
_ERROR_EVENT = ERROR_TYPE.encode()  # the SSE event type of observer.dialects.sse_errors, undecoded
_JSONDecodeError = orjson.JSONDecodeError


class _ParsedEvent:
    """An SSE message whose data the tap already parsed (so known valid UTF-8): ``event``,
    ``id``, ``retry``, ``size_bytes`` as in ``observer.wire.frames.SSEEvent``; ``data`` (str)
    is decoded from the raw bytes only if an adapter reads it (a 300 KB event is not decoded for
    nothing)."""

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
    """A ``JSONFrame`` (a message of a framing without events) the tap already parsed: ``data``
    decoded on first use, as in ``_ParsedEvent``. Built with :func:`_parsed_frame` (the frozen
    dataclass's ``__init__`` would try to assign ``data``)."""

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
        self._reassembler = self._new_reassembler()
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
                framing,
                max_event_bytes=limits.max_event_bytes,
                max_json_body_bytes=limits.max_json_body_bytes,
                encoding=spec.message_encoding,
            )
        )
        self._decoder: ContentDecoder | None = None
        self._broken = False
        self._messages = 0
        self._cap = limits.max_stream_events
        try:
            # Bounded decoding: a decompression bomb stops observation, never the proxy loop.
            self._decoder = make_decoder(spec.content_encoding, max_ratio=limits.max_decode_ratio)
        except ObserverError as exc:
            self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
        # No Content-Encoding: the bytes are the plain body; the metered identity decoder can
        # never refuse them (output = input <= max_ratio x input), so ``feed`` skips it.
        self._identity = getattr(self._decoder, "identity", False)
        # Adapters that map a pre-parsed message (``on_object``), and their fast lanes.
        self._on_object = getattr(self._adapter, "on_object", None)
        # A message that is the whole body is never a delta: no fast lane for it.
        self._whole_body = framing is not None and framing.whole_body
        self._lost_body = False
        streamed = framing is not None and not self._whole_body
        self._fast = getattr(self._adapter, "fast", None) if self._on_object is not None and streamed else None
        self._closed = False
        self._last_event_id: str | None = None  # the last dispatched SSE message's ``id`` (resumption)
        # Multi-turn streams (module docstring): turns cut and not yet taken, as (index, facts).
        self._multi_turn = bool(getattr(self._adapter, "multi_turn", False))
        self.turns: list[tuple[int, ResponseFacts]] = []
        self.turns_cut = 0
        self._turn_start_s = spec.started_at_s  # the current turn's start: ttft_s counts from it
        self._cut_bytes = 0  # response bytes of the turns cut so far
        self._tail_empty = False
        # A length-prefixed framing (binary envelopes, the AWS event stream) that framed no
        # message but reported a violation: the bytes were not that framing at all (e.g. SSE
        # under the event-stream media type), so the stream is unreadable, not cut short.
        self._prefixed = framing is not None and (framing.binary or framing is Framing.EVENT_STREAM)
        self._framer_violation = False
        # ``feed``'s short way: plain bytes straight to the framer (false once observation stops).
        self._plain = self._identity and self._framer is not None and not self._broken
        self._frame = self._framer.feed if self._framer is not None else None
        if framing is not None and framing.binary:  # its own dispatch; the JSON path is not touched
            on_binary = getattr(self._adapter, "on_binary", None)
            if on_binary is None:
                on_message = self._adapter.on_message
                on_binary = lambda message: on_message(binary_frame(message))  # noqa: E731
            self._on_binary = on_binary
            self._dispatch = self._dispatch_binary  # type: ignore[method-assign]

    def _new_reassembler(self) -> Reassembler:
        """A reassembler for the response (or its next turn), knowing the response's id from its
        header when the dialect names one (``ResponseSpec.response_id``): an id the body names
        later replaces it."""
        spec = self._spec
        reassembler = Reassembler(spec.tool_names, spec.request_id, limits=spec.limits)
        if spec.response_id:
            reassembler.apply(ResponseIdentity(None, response_id=spec.response_id), spec.started_at_s)
        return reassembler

    @property
    def needs_arrival_times(self) -> bool:
        """False once no later chunk's arrival time can change the record: the first text has
        been seen (its arrival, ``ttft_s``, is the only chunk time a record keeps; the end time is
        ``finish``'s) or observation stopped. From then on a caller may join consecutive chunks
        and feed them as one with any time: the framers' and decoders' output does not depend on
        how the input was split (tests/unit/test_tap_batcher.py). A multi-turn stream needs
        them throughout: each turn's end time and ``ttft_s`` are chunk arrival times."""
        return (self._multi_turn or self._reassembler.first_text_s is None) and not self._broken

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
        raise on a bug; the caller then calls ``fail``."""
        self._facts.response_bytes += len(data)
        if self._plain:  # the usual case: no Content-Encoding, a framer, observing
            items = self._frame(data)
            if items:
                self._dispatch(items, now_s)
            return
        if self._broken or not data:
            return
        if not self._identity:
            assert self._decoder is not None
            try:
                data = self._decoder.feed(data)
            except ObserverError as exc:
                self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
                return
            if not data:
                return
        self._take(data, now_s)

    def _take(self, plain: bytes, now_s: float) -> None:
        """Plain (content-decoded) bytes to the framer and its messages on, or, for a body that
        is not parsed, into the kept bytes."""
        if self._framer is None:
            self._keep(plain)
            return
        items = self._framer.feed(plain)
        if items:
            self._dispatch(items, now_s)

    def fail(self, exc: BaseException) -> None:
        """Stops observing after an unexpected exception; records ``observer_error``."""
        self._stop(ViolationKind.OBSERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def _dispatch(self, items: list[Message | Violation], now_s: float) -> None:
        """Hands a framer's messages and violations, in order, to the adapter and the
        reassembler. The per-message loop is the hot path (most lists hold one message): one
        exact-type test per item (messages are tuples; ``Violation`` is never one). Each message
        is counted (cap ``max_stream_events``), its data parsed once (orjson), offered to the
        fast lane while the stream has not ended, else mapped (``_mapped``); data that does not
        parse goes to the general path (``_general``)."""
        r = self._reassembler
        fast = self._fast
        on_object = self._on_object
        cap = self._cap
        m = self._messages
        try:
            for item in items:
                if item.__class__ is tuple:
                    m += 1
                    if m > cap:
                        self._messages = m
                        self._over_cap()
                        return
                    if on_object is None:
                        self._general(item, now_s)
                        continue
                    try:
                        obj = _loads(item[1])
                    except _JSONDecodeError:
                        self._general(item, now_s)
                        continue
                    if fast is not None and not r._ended:
                        event = item[0]
                        # An ``error`` event is never a delta: it takes the general mapping,
                        # whose error rule (``observer.dialects.sse_errors``) the lane skips.
                        if (not event or (event.isascii() and event != _ERROR_EVENT)) and fast(event, obj, r, now_s):
                            continue
                    self._mapped(item, obj, now_s)
                else:
                    self._framer_violation = True
                    r.violation(item)  # type: ignore[arg-type]
                    if item.kind == ViolationKind.OVERSIZE_EVENT:  # type: ignore[union-attr]
                        self._adapter.on_lost()
                        # The one message of a whole-body framing is the response: it was not read.
                        self._lost_body = self._whole_body
        finally:
            self._messages = m
            for item in reversed(items):  # WHATWG's last event ID string: the last message's ``id``
                if item.__class__ is tuple:
                    self._last_event_id = item[2]  # type: ignore[index]
                    break

    def _dispatch_binary(self, items: list[Message | Violation], now_s: float) -> None:
        """``_dispatch`` for a binary framing: each message counted (cap ``max_stream_events``
        per turn) and handed whole to the adapter's ``on_binary``; violations as in
        ``_dispatch``. A multi-turn stream's turn is cut right after the message that ended it."""
        on_binary = self._on_binary
        cap = self._cap
        for item in items:
            if item.__class__ is tuple:
                self._messages += 1
                if self._messages > cap:
                    self._over_cap()
                    return
                self._apply(on_binary(item), now_s)
                if self._multi_turn and self._reassembler.ended and not self._reassembler.untouched:
                    self._cut(now_s)
            else:
                self._framer_violation = True
                self._reassembler.violation(item)  # type: ignore[arg-type]
                if item.kind == ViolationKind.OVERSIZE_EVENT:  # type: ignore[union-attr]
                    self._adapter.on_lost()

    def _cut(self, now_s: float) -> None:
        """Finishes the current turn of a multi-turn stream as a clean end at ``now_s`` (its
        ``response_bytes``: the chunks counted since the previous cut, the one that ended it
        included) and starts the next: a fresh reassembler, the adapter's ``next_turn``, the
        message count from 0, ``ttft_s`` counted from this turn's end."""
        facts = ResponseFacts()
        total = self._facts.response_bytes
        facts.response_bytes = total - self._cut_bytes
        facts.ended_at = utc_from_epoch(now_s)
        self._reassembler.finish(facts, EndCause.EOF, request_start_s=self._turn_start_s)
        self.turns.append((self.turns_cut, facts))
        self.turns_cut += 1
        self._cut_bytes = total
        self._turn_start_s = now_s
        self._reassembler = self._new_reassembler()
        self._adapter.next_turn()
        self._messages = 0

    def take_turns(self) -> list[tuple[int, ResponseFacts]]:
        """The turns cut since the last call, as ``(index, facts)`` (index from 0, in order)."""
        turns, self.turns = self.turns, []
        return turns

    @property
    def tail_empty(self) -> bool:
        """After ``finish``: True when turns were cut and nothing of a record followed the last
        one (``Reassembler.untouched``): the caller makes no record of it."""
        return self._tail_empty

    def _mapped(self, message: Message, obj: object, now_s: float) -> None:
        """The general mapping of a counted, parsed message (no fast-lane hit): the adapter's
        ``on_object`` with the message around its undecoded data; an SSE event type that is not
        UTF-8 goes to ``_general`` instead (which reports it)."""
        event, raw, id, retry, size = message
        if event is None:
            parsed: object = _parsed_frame(raw, size)
        else:
            try:
                name = event.decode("utf-8")
            except UnicodeDecodeError:
                self._general(message, now_s)
                return
            parsed = _ParsedEvent(name, raw, id, retry, size)
        items = self._on_object(parsed, obj)  # type: ignore[misc]
        if event == _ERROR_EVENT:  # the rule of observer.dialects.sse_errors
            items = with_error(items, obj, raw)
        self._apply(items, now_s)

    def _general(self, message: Message, now_s: float) -> None:
        """A message whose data is not JSON straight from the bytes (or whose event type is not
        UTF-8): its text form to the adapter's ``on_message``, then ``invalid_utf8`` if
        anything was replaced. Data that is several JSON documents one after another
        (``data: {...}{...}``, ``observer.wire.frames.split_documents``) is read as one message
        per document, after a ``nonconformant_framing`` violation."""
        split = split_documents(message)
        if split is not None:
            violation, parts = split
            self._reassembler.violation(violation)
            for part in parts:
                self._general(part, now_s)
            return
        text, bad = text_message(message)
        items = self._adapter.on_message(text)
        if text.event == ERROR_TYPE:  # the rule of observer.dialects.sse_errors
            items = with_error(items, NOT_JSON, text.data)
        self._apply(items, now_s)
        if bad is not None:
            self._reassembler.violation(bad)

    def _stop(self, kind: ViolationKind, detail: str) -> None:
        self._plain = False
        if not self._broken:
            self._broken = True
            self._reassembler.violation(Violation(kind, None, detail))

    def _keep(self, plain: bytes) -> None:
        """Keeps the first ``max_body_bytes`` of a body that is not parsed."""
        body = self._body
        room = self._limits.max_body_bytes - len(body)  # type: ignore[arg-type]
        if room > 0:
            body += plain[:room]  # type: ignore[operator]

    def _over_cap(self) -> None:
        cap = self._cap
        self._stop(ViolationKind.OVERSIZE_STREAM, f"more than {cap} messages: observation stopped")

    def _apply(self, items: list, now_s: float) -> None:
        """An adapter's canonical events and violations, in order, to the reassembler."""
        self._reassembler.apply_items(items, now_s)

    def finish(self, end: StreamEnd) -> ResponseFacts:
        """Flushes the decoders and returns the response's facts (call once); ``end`` says how
        the transport ended. Raises ``RuntimeError`` on a second call."""
        if self._closed:
            raise RuntimeError("StreamObserver.finish called twice")
        self._closed = True
        self._plain = False
        now_s = end.now_s
        facts = self._facts
        if not self._broken and self._decoder is not None:
            try:
                tail = self._decoder.close()
                if tail:
                    self._take(tail, now_s)
                if self._framer is not None:
                    # Only a clean end can leave a final message without its terminator
                    # (``unterminated_final_event``); after an abort the tail is just cut off.
                    if end.cause is EndCause.EOF and not self._broken:
                        items = self._framer.close()
                        if items:
                            # A client's EventSource never dispatches an unterminated final
                            # event (WHATWG §9.2.6): its last event ID stays the one before.
                            last_id = self._last_event_id
                            self._dispatch(items, now_s)
                            self._last_event_id = last_id
                        on_trailers = getattr(self._adapter, "on_trailers", None)
                        if end.trailers and on_trailers is not None and not self._broken:
                            self._apply(on_trailers(list(end.trailers)), now_s)
                    self._apply(self._adapter.on_close(), now_s)
            except ObserverError as exc:
                self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
            except Exception as exc:  # a bug in our code: record it, never lose the record
                self.fail(exc)
        if self.turns_cut:
            self._tail_empty = self._reassembler.untouched
            facts.response_bytes -= self._cut_bytes
        facts.transport_error = end.transport_error
        facts.ended_at = utc_from_epoch(end.at_s)
        facts.last_event_id = clip(self._last_event_id, MAX_NAME_CHARS) or None
        readable = self._body is None and not self._broken and not self._lost_body
        if self._prefixed and self._framer_violation and not self._messages and not self.turns_cut:
            readable = False
        self._reassembler.finish(facts, end.cause, request_start_s=self._turn_start_s, readable=readable)
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
