"""The per-flow observation pipeline, sans-IO: response bytes in, one ``Exchange`` out.

    bytes (as forwarded, still content-encoded)
      -> observer.wire.content decoder (Content-Encoding, RFC 9110 §8.4)
      -> framer chosen by the dialect (observer.wire.frames: SSE, NDJSON, JSON array, whole JSON)
      -> dialect adapter (wire messages -> canonical events)
      -> observer.reassembly.Reassembler (canonical events -> record)

The caller (the mitmproxy addon) supplies every clock reading and must never let an exception
from ``feed`` reach the proxy: it calls ``fail`` instead and keeps forwarding bytes. Non-2xx
answers and bodies the dialect cannot read are not parsed; their first ``max_body_bytes`` are
kept verbatim.
"""

from __future__ import annotations

from observer.dialects.base import Dialect, RequestView, media_type
from observer.errors import ObserverError
from observer.limits import Limits
from observer.reassembly import EndCause, Reassembler
from observer.records import ErrorInfo, Exchange, Outcome, Violation, ViolationKind, utc_from_epoch
from observer.wire.content import ContentDecoder, make_decoder
from observer.wire.frames import make_framer


class StreamObserver:
    """Observes one response of an LLM exchange.

    ``exchange`` is the record skeleton (HTTP facts, request facts and request violations
    already set); ``status_code`` and ``content_type``/``content_encoding`` come from the
    response headers. ``feed`` takes each forwarded chunk (bytes) with its arrival time
    ``now_s`` (epoch seconds); ``finish`` returns the completed record.
    """

    def __init__(
        self,
        dialect: Dialect,
        exchange: Exchange,
        *,
        view: RequestView,
        status_code: int,
        content_type: str | None,
        content_encoding: str | None,
        limits: Limits,
    ) -> None:
        self._exchange = exchange
        self._limits = limits
        self._reassembler = Reassembler(exchange.request, limits=limits)
        self._adapter = dialect.new_adapter(exchange.request, view)
        self._http_error = not 200 <= status_code < 300
        mtype = media_type(content_type)
        framing = None if self._http_error else dialect.framing(exchange.request, view, mtype)
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
        try:
            # Bounded decoding: a decompression bomb stops observation, never the proxy loop.
            self._decoder = make_decoder(content_encoding, max_ratio=limits.max_decode_ratio)
        except ObserverError as exc:
            self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
        self._closed = False

    @property
    def broken(self) -> bool:
        """True once observation of this flow stopped (bytes still pass through)."""
        return self._broken

    def feed(self, data: bytes, now_s: float) -> None:
        """Observes one forwarded chunk. May raise on a bug; the caller then calls ``fail``."""
        self._exchange.response_bytes += len(data)
        if self._broken or not data:
            return
        assert self._decoder is not None
        try:
            plain = self._decoder.feed(data)
        except ObserverError as exc:
            self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
            return
        self._consume(plain, now_s)

    def fail(self, exc: BaseException) -> None:
        """Stops observing after an unexpected exception; records ``observer_error``."""
        self._stop(ViolationKind.OBSERVER_ERROR, f"{type(exc).__name__}: {exc}")

    def _stop(self, kind: ViolationKind, detail: str) -> None:
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
        for item in self._framer.feed(plain):
            self._dispatch(item, now_s)

    def _dispatch(self, item: object, now_s: float) -> None:
        r = self._reassembler
        if self._broken:
            return
        if not isinstance(item, Violation):
            self._messages += 1
            if self._messages > self._limits.max_stream_events:
                self._stop(
                    ViolationKind.OVERSIZE_STREAM,
                    f"more than {self._limits.max_stream_events} messages: observation stopped",
                )
                return
        if isinstance(item, Violation):
            r.violation(item)
            if item.kind == ViolationKind.OVERSIZE_EVENT:
                self._adapter.on_lost()
            return
        self._apply(self._adapter.on_message(item), now_s)

    def _apply(self, items: list, now_s: float) -> None:
        r = self._reassembler
        for ev in items:
            if isinstance(ev, Violation):
                r.violation(ev)
            else:
                r.apply(ev, now_s)

    def finish(
        self,
        end: EndCause,
        *,
        now_s: float,
        ended_at_s: float | None = None,
        transport_error: str | None = None,
    ) -> Exchange:
        """Flushes the decoders and returns the record (call once).

        ``end`` is how the transport ended; ``ended_at_s`` the end time (epoch seconds,
        defaults to ``now_s``); ``transport_error`` the proxy's raw error message, if any.
        """
        if self._closed:
            raise RuntimeError("StreamObserver.finish called twice")
        self._closed = True
        ex = self._exchange
        if not self._broken and self._decoder is not None:
            try:
                tail = self._decoder.close()
                self._consume(tail, now_s)
                if self._framer is not None:
                    # Only a clean end can leave a final message without its terminator
                    # (``unterminated_final_event``); after an abort the tail is just cut off.
                    if end is EndCause.EOF:
                        for item in self._framer.close():
                            self._dispatch(item, now_s)
                    self._apply(self._adapter.on_close(), now_s)
            except ObserverError as exc:
                self._stop(ViolationKind.CONTENT_DECODING_ERROR, str(exc))
            except Exception as exc:  # a bug in our code: record it, never lose the record
                self.fail(exc)
        ex.transport_error = transport_error
        ex.ended_at = utc_from_epoch(ended_at_s if ended_at_s is not None else now_s)
        readable = self._body is None and not self._broken
        self._reassembler.finish(ex, end, request_start_s=ex.started_at.timestamp(), readable=readable)
        if self._body is not None:
            ex.response_body = bytes(self._body).decode("utf-8", "replace")
        if self._http_error:
            ex.outcome = Outcome.HTTP_ERROR
        return ex


def request_only_record(exchange: Exchange, end: EndCause, *, now_s: float, transport_error: str | None) -> Exchange:
    """The record of an exchange that failed before any response headers arrived.

    A client that went away while waiting gives ``client_aborted``, an observer shutdown
    ``interrupted``; otherwise (upstream
    unreachable, refused, reset) the outcome is ``error`` with code ``no_response`` — no
    response existed, so nothing was truncated. ``transport_error`` keeps the proxy's message.
    """
    exchange.ended_at = utc_from_epoch(now_s)
    exchange.transport_error = transport_error
    exchange.request_id = exchange.request.request_id
    if end is EndCause.CLIENT_ABORTED:
        exchange.outcome = Outcome.CLIENT_ABORTED
    elif end is EndCause.SHUTDOWN:
        exchange.outcome = Outcome.INTERRUPTED
    else:
        exchange.error = ErrorInfo("no_response", transport_error)
        exchange.outcome = Outcome.ERROR
    return exchange


__all__ = ["EndCause", "StreamObserver", "request_only_record"]
