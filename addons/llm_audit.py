"""mitmproxy addon: observe LLM inference streams and hand one audit record per exchange to the
store writer. Thin glue: options, hook wiring, fail-open policy; the work is in ``observer``.

Load with ``mitmdump -s addons/llm_audit.py --set observer_db=URL`` or embedded by
``observer run``. Hook use follows the measured facts of mitmproxy 12.3
(shared reference "mitmproxy-streaming", §2 and §7):

- ``requestheaders``: classify by headers (cheap); other traffic gets ``stream = True`` on the
  request (and later the response) so it is never buffered and never recorded.
- ``request``: read the (buffered) request body of an observed flow into the record.
- ``responseheaders``: install a per-flow stream callable that feeds the core and returns
  every chunk unchanged — the same object, never ``b""`` for non-empty input.
- ``response`` / ``error`` (mutually exclusive): finish the record and ``put_nowait`` it.

Fail open: no exception leaves a hook or the stream callable. A failure stops observation of
that flow, the bytes keep flowing, and the record carries an ``observer_error`` violation.
Hooks never block or await.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable

from mitmproxy import ctx, exceptions, http
from mitmproxy.connection import ConnectionState

from observer.config import add_options, settings_from_options
from observer.dialects.base import Dialect, RequestView
from observer.errors import ConfigError, ObserverError
from observer.dialects.registry import DialectRegistry, default_registry
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.records import Exchange, RequestFacts, Violation, ViolationKind, utc_from_epoch
from observer.redact import MAX_CHARS, MAX_FIELDS, redact_path, redact_record, redact_request
from observer.tap import StreamObserver, feed_pending, request_only_record
from observer.wire.content import LIMIT_CODE, make_decoder
from observer.worker import WorkerDied, WorkerLink

log = logging.getLogger("observer.addon")

Sink = Callable[[Exchange], bool]
METADATA_KEY = "llm_audit"
FINISH_DELAY_S = 0.005  # seconds from the ``response`` hook to finishing the record (see ``response``)
# Bytes one flow's tap collects before handing them to the worker outside the timed sweep (the
# in-process tap: TapBatcher.max_pending_bytes, 32 KiB, which bounds a parse slice). A worker
# batch costs the proxy one pipe write and the worker one wake-up, whatever its size: bench/bulk.py
# h1, alternating pairs: 256 KiB gave 0.91x of the baseline against 0.88x for 32 KiB (4 pairs),
# and 1 MiB (the pipe's capacity) 0.92x against 0.95x for 256 KiB (3 pairs).
WORKER_FLUSH_BYTES = 256 << 10


class _FlowState:
    """What the addon keeps per observed flow (in ``flow.metadata``) until ``response``/``error``.

    A plain slotted class, not a dataclass: mitmproxy loads ``-s`` scripts without registering
    them in ``sys.modules``, which ``dataclasses`` needs."""

    __slots__ = ("client_id", "dialect", "exchange", "fid", "finish_args", "finished", "headers", "observer",
                 "parsed", "request_tap", "secrets", "tap", "view", "violations")  # fmt: skip

    def __init__(self, dialect: Dialect, exchange: Exchange, view: RequestView, client_id: str = "") -> None:
        self.dialect = dialect
        self.exchange = exchange
        self.view = view
        self.client_id = client_id
        self.parsed = False  # the request body was read (or found unreadable)
        self.request_tap: RequestTap | None = None
        self.observer: StreamObserver | None = None
        self.tap: StreamTap | None = None
        self.violations: list[Violation] = []
        self.finished = False
        # Worker mode: the flow's id in the worker (None: observed in-process), the response's
        # Content-Type and Content-Encoding (to observe in-process if the worker dies), and the
        # arguments of ``_complete`` once the record was asked of the worker.
        self.fid: int | None = None
        self.headers: tuple[str | None, str | None] = (None, None)
        self.finish_args: tuple | None = None
        # Credential values redacted from the request (``observer.redact``), to scrub echoes of them
        # from the record; only in memory, until the record is made.
        self.secrets: list[str] = []


class TapBatcher:
    """Defers the core's parsing of streamed chunks out of mitmproxy's per-chunk path and runs
    it in batches: one timed loop callback every ``interval_s`` seconds starts a *sweep* that
    observes every chunk queued since, flow after flow, in slices of at most ``slice_s`` seconds
    of parsing each.

    Why batches: measured in mitmdump under 100 concurrent token streams, the same parsing costs
    14-20 µs per chunk when it runs inline between mitmproxy's own per-chunk work (cold caches)
    and ~8.6 µs when the chunks of many flows are parsed back to back (bench/README.md, "Addon
    overhead: what was found and fixed").

    Why slices: under 100 TLS streams at 50 events/s each (bench/load.py) one sweep parses ~250
    chunks, measured in mitmdump at 0.8 ms median, 1.2 ms p90 and up to ~5 ms, and every chunk
    arriving meanwhile waits for it. A slice ends once ``clock()`` (seconds, ``time.perf_counter``;
    read after each chunk) has passed its start + ``slice_s``; the rest of the sweep goes to a
    callback scheduled with ``loop.call_soon``, behind the I/O callbacks that became ready
    meanwhile. Default 0.5 ms: a chunk waits for at most ~0.5 ms of our parsing (+ the one chunk
    being parsed), what mitmproxy itself spends on 3-5 events (110-160 µs of proxy CPU per TLS
    event), while a slice still parses ~100-150 chunks back to back (~3.7 µs each in the proxy):
    the total parse time measured the same for budgets of 0.25, 0.5, 1 and 2 ms, so the warm
    batches are kept. What still overruns a slice is a single chunk stretched by a GC pass or by
    the writer thread holding the GIL, which no budget can cut.
    ``slice_s <= 0``: the whole sweep in one callback (the behaviour before slicing).

    Order and fairness: taps are visited in the order they were queued; a tap whose slice ran out
    goes to the back of the sweep, behind the taps not yet visited, so a flow with many chunks
    waiting delays the others by at most one slice. A tap is in at most one queue at a time
    (``StreamTap._queued``) and its chunks are taken off its list before they are fed, so no chunk
    is observed twice or out of order, whichever of a slice, the pending-bytes flush or the
    finishing ``flush`` comes first. Taps queued after a sweep started wait for the next timed
    sweep: a sweep that took in new arrivals would never end under load and would decay into
    per-chunk parsing, losing the warm batches.

    Nothing observable changes: every chunk is fed with its own arrival time (``time.time()``
    taken in the tap), a flow's pending chunks are observed before its record is finished
    (``StreamTap.flush``, also in the middle of a sweep), and the client's bytes are never held
    (the tap returns each chunk at once). A flow whose pending bytes reach ``max_pending_bytes``
    is observed at once (bulk streams: bounded memory, big warm batches). ``interval_s <= 0`` (or
    no running event loop, e.g. unit tests) observes inline. ``drain`` (shutdown) observes
    everything queued and cancels the scheduled callbacks."""

    __slots__ = ("_clock", "_cont", "_dirty", "_sweep", "_timer", "interval_s", "max_pending_bytes", "slice_s")

    def __init__(
        self,
        interval_s: float = 0.05,
        max_pending_bytes: int = 32 << 10,
        slice_s: float = 0.0005,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.interval_s = interval_s  # seconds between timed sweeps; <= 0: inline
        self.max_pending_bytes = max_pending_bytes  # bytes one flow may have waiting
        self.slice_s = slice_s  # seconds of parsing per loop callback; <= 0: no limit
        self._clock = clock  # seconds, monotonic (injectable for tests)
        self._dirty: list[StreamTap] = []  # queued for the next timed sweep
        self._sweep: deque[StreamTap] = deque()  # the sweep in progress: taps not yet fully observed
        self._timer: asyncio.TimerHandle | None = None  # the next timed sweep
        self._cont: asyncio.Handle | None = None  # the next slice of the sweep in progress

    def mark(self, tap: StreamTap) -> bool:
        """Queues ``tap`` for the next sweep; False when no sweep can be scheduled (observe now)."""
        if self._timer is None:
            if self.interval_s <= 0:
                return False
            try:
                self._timer = asyncio.get_running_loop().call_later(self.interval_s, self.sweep)
            except RuntimeError:  # no running loop
                return False
        tap._queued = True
        self._dirty.append(tap)
        return True

    def sweep(self) -> None:
        """The timed callback: the taps queued since the last sweep join the sweep in progress
        (if a slow one is still going) or start one, whose first slice runs now. Never raises."""
        if self._timer is not None:
            self._timer.cancel()  # no-op when this is the timer firing; a direct call replaces it
            self._timer = None
        self._sweep.extend(self._dirty)
        self._dirty = []
        if self._cont is None:
            self._slice()

    def _slice(self) -> None:
        """Observes queued taps, oldest first, until the queue is empty or ``slice_s`` has passed
        (at least one chunk); schedules the next slice with ``call_soon`` if any remain."""
        self._cont = None
        queue = self._sweep
        clock = self._clock
        try:
            deadline = clock() + self.slice_s if self.slice_s > 0 else None
            while queue:
                tap = queue[0]
                if not tap._observe(deadline, clock):
                    queue.rotate(-1)  # its slice ran out: to the back, behind the taps not yet visited
                    break
                queue.popleft()
                tap._queued = False
                if deadline is not None and queue and clock() >= deadline:
                    break
        except Exception:  # noqa: BLE001 - a loop callback must not raise; _observe does not
            log.error("observer: tap sweep failed", exc_info=True)
        if queue:
            try:
                self._cont = asyncio.get_running_loop().call_soon(self._slice)
            except RuntimeError:  # no running loop (a direct call): the rest now
                self.drain()

    def drain(self) -> None:
        """Observes every queued chunk now, in one go, and cancels the scheduled callbacks
        (shutdown: nothing is left waiting for a loop that is stopping). Never raises."""
        for handle in (self._timer, self._cont):
            if handle is not None:
                handle.cancel()
        self._timer = self._cont = None
        taps = [*self._sweep, *self._dirty]
        self._sweep.clear()
        self._dirty = []
        for tap in taps:
            tap._queued = False
            tap.flush()


class StreamTap:
    """The per-flow ``flow.response.stream`` callable: returns each chunk unchanged (the same
    object) and has it observed, with its arrival time, inline or in a ``TapBatcher`` sweep.
    Runs inside mitmproxy's core, so it must never raise (an exception would silently drop the
    chunk for the client)."""

    __slots__ = ("_batcher", "_flush_bytes", "_observer", "_pending", "_pending_bytes", "_queued")

    def __init__(self, observer: StreamObserver, batcher: TapBatcher | None = None) -> None:
        self._observer = observer
        self._batcher = batcher
        self._flush_bytes = batcher.max_pending_bytes if batcher is not None else 0  # observed at once from here
        self._pending: list = []  # chunk, arrival time, chunk, arrival time, ... (oldest first)
        self._pending_bytes = 0  # bytes in _pending
        self._queued = False  # in one of the batcher's queues (set and cleared by the batcher)

    def __call__(self, data: bytes) -> bytes:
        if data:
            try:
                pending = self._pending
                pending.append(data)
                pending.append(time.time())
                self._pending_bytes += len(data)
                batcher = self._batcher
                if batcher is None or self._pending_bytes >= self._flush_bytes:
                    self.flush()
                elif not self._queued and not batcher.mark(self):
                    self.flush()
            except Exception:  # fail open: the chunk goes on whatever happened here
                log.error("observer: stream tap failed", exc_info=True)
        return data

    def flush(self) -> None:
        """Observes every pending chunk now (idempotent; never raises)."""
        self._observe(None, None)

    def _observe(self, deadline: float | None, clock: Callable[[], float] | None) -> bool:
        """Feeds the pending chunks in arrival order. With a ``deadline`` (``clock()`` seconds) it
        stops once the deadline has passed after a chunk, leaving the rest pending; returns True
        when nothing is left. Never raises. The list is taken off the tap before anything is fed,
        so a chunk is fed exactly once. Once the observer no longer needs arrival times
        (``StreamObserver.needs_arrival_times``: its first text was seen) the rest are joined
        and fed as one: bulk streams arrive one small event per chunk, and one feed of ~32 KiB
        parses their events in one loop (bench/bulk.py)."""
        pending = self._pending
        if not pending:
            return True
        self._pending = []
        self._pending_bytes = 0
        i = feed_pending(self._observer, pending, deadline, clock)
        if i < len(pending):  # the slice ran out
            rest = pending[i:]
            rest += self._pending  # (empty: nothing runs in between; kept in order anyway)
            self._pending = rest
            self._pending_bytes = sum(map(len, rest[::2]))
            return False
        return True


class WorkerTap(StreamTap):
    """The stream callable of a flow observed by the worker process (``observer.worker``): queues
    each chunk with its arrival time like ``StreamTap`` and hands each batch to the worker in one
    frame, instead of parsing it here; a flow with ``WORKER_FLUSH_BYTES`` waiting is handed over
    at once. Counts what it sent and what it could not send (the link
    was over its buffer bound: from then on the flow's bytes are only counted, and the worker
    records ``observer_error``). If the worker dies, the addon sets ``local`` to an in-process
    observer (already failed: it only counts) and the rest goes there. Never raises."""

    __slots__ = ("_link", "fid", "local", "record_id", "sent_bytes", "skipped_bytes")

    def __init__(self, fid: int, link: WorkerLink, batcher: TapBatcher | None = None, record_id: str = "") -> None:
        super().__init__(None, batcher)  # type: ignore[arg-type]
        if batcher is not None:
            self._flush_bytes = max(self._flush_bytes, WORKER_FLUSH_BYTES)
        self._link = link
        self.fid = fid
        self.record_id = record_id  # the record's id, for the logs
        self.local: StreamObserver | None = None
        self.sent_bytes = 0  # bytes handed to the worker
        self.skipped_bytes = 0  # bytes forwarded but not handed to the worker (over the link's bound)

    def _observe(self, deadline: float | None, clock: Callable[[], float] | None) -> bool:
        pending = self._pending
        if not pending:
            return True
        nbytes = self._pending_bytes
        self._pending = []
        self._pending_bytes = 0
        try:
            local = self.local
            if local is None:
                if not self.skipped_bytes and self._link.data(self.fid, pending, nbytes):
                    self.sent_bytes += nbytes
                    return True
                local = self.local  # set if the worker was found dead just now
                if local is None:
                    if not self.skipped_bytes and self._link.alive:
                        log.error("observer: the worker fell behind (over observer_worker_buffer_mb); record %s: "
                                  "the rest of its stream is not observed", self.record_id)  # fmt: skip
                    # (A closed link: the addon stopped, e.g. a script reload; the flow was recorded.)
                    self.skipped_bytes += nbytes
                    return True
            for i in range(0, len(pending), 2):
                local.feed(pending[i], pending[i + 1])
        except Exception:  # noqa: BLE001 - never out of the tap
            log.error("observer: worker tap failed", exc_info=True)
        return True


class RequestTap:
    """The ``flow.request.stream`` callable of an observed request whose size is not declared
    (chunked upload): forwards every chunk unchanged and keeps a copy of at most ``max_bytes``
    for the record, so an endless upload is never buffered by the proxy (trial finding: a
    400 MB chunked upload was held whole). Never raises."""

    __slots__ = ("_buf", "_max", "over", "total_bytes")

    def __init__(self, max_bytes: int) -> None:
        self._buf = bytearray()
        self._max = max_bytes
        self.over = False
        self.total_bytes = 0

    def __call__(self, data: bytes) -> bytes:
        if data:
            self.total_bytes += len(data)
            if not self.over:
                if len(self._buf) + len(data) > self._max:
                    self.over = True
                    self._buf = bytearray()
                else:
                    self._buf += data
        return data

    def body(self) -> bytes | None:
        """The kept request body, or ``None`` when it outgrew ``max_bytes``."""
        return None if self.over else bytes(self._buf)


def end_cause_from_error(message: str, *, client_closed: bool = False, server_closed: bool = False) -> EndCause:
    """Classifies mitmproxy's free-text ``flow.error.msg`` (shared reference §2.4): client
    disconnects and client RST_STREAM(CANCEL) are client aborts. ``peer closed connection``
    (HTTP/2) is said for either side, so the connection states decide it: only the client's
    connection closed means the client went away. Everything else (upstream resets, incomplete
    bodies) is an upstream failure. Best effort: the raw message is always recorded too."""
    m = message.lower()
    if m.startswith("client disconnected") or "(cancel)" in m:
        return EndCause.CLIENT_ABORTED
    if m.startswith("peer closed connection") and client_closed and not server_closed:
        return EndCause.CLIENT_ABORTED
    return EndCause.UPSTREAM_FAILED


class LLMAudit:
    """The addon. ``sink`` receives each finished record and returns False when it had to drop
    it; by default (``sink=None``) a ``RecordWriter`` on ``observer_db`` is started in
    ``running`` and closed in ``done``."""

    def __init__(
        self, sink: Sink | None = None, registry: DialectRegistry | None = None, worker: bool | None = None
    ) -> None:
        self._sink = sink
        self._custom_registry = registry is not None
        self._registry = registry or default_registry()
        self._writer = None
        self._limits = Limits()
        self._batcher = TapBatcher()
        self._open: dict[str, _FlowState] = {}  # flow.id -> state of every observed, unfinished flow
        self._by_client: dict[str, set[str]] = {}  # client connection id -> ids of its open flows
        self._use_worker = worker  # None: the observer_worker option decides
        self._link: WorkerLink | None = None  # the worker process, while it lives
        self._remote: dict[int, _FlowState] = {}  # fid -> flows whose record the worker will make
        self._next_fid = 0
        self.worker_deaths = 0
        # A dead worker that had lived this long (seconds) is replaced by a new one; one that died
        # sooner (a crash loop: it cannot import, it dies at once) is not: in-process from then on.
        self.worker_restart_after_s = 60.0
        self._stopping = False  # ``done`` began: no new worker
        self._options_error: str | None = None  # a deferred ``--set observer_*`` that did not parse
        self._deferred: dict[_FlowState, tuple] = {}  # ``response`` finishing soon: state -> (handle, kwargs)
        self.records_submitted = 0
        self.records_dropped = 0
        self.hook_errors = 0

    # ----- options -----
    def load(self, loader) -> None:
        add_options(loader)
        self._apply_deferred_options()

    def _apply_deferred_options(self) -> None:
        """Applies the ``--set observer_*=VALUE`` that mitmproxy deferred until this script
        loaded, so that a malformed one is reported. mitmproxy applies a script's deferred
        options right after ``load``, all at once; a value that does not parse
        (``observer_worker_buffer_mb=abc``) raises there, and the script loader drops the
        exception and the addon without a word, so the proxy ran and recorded nothing (trial
        finding). Here the error is logged (mitmdump exits with code 1 after an error logged
        during start-up: its ``errorcheck`` addon), the ``observer_*`` entries are dropped so the
        addon still loads, and ``running`` refuses to record and shuts the proxy down.
        ``observer run`` checks its options before starting and never gets here."""
        try:
            ctx.options.process_deferred()
        except exceptions.OptionsError as exc:
            self._options_error = str(exc)
            for name in [k for k in ctx.options.deferred if k.startswith("observer_")]:
                del ctx.options.deferred[name]
            log.error("observer: %s; not recording", exc)

    def configure(self, updated: set[str]) -> None:
        if not any(name.startswith("observer_") for name in updated):
            return
        try:
            settings = settings_from_options(ctx.options)
        except ConfigError as exc:
            raise exceptions.OptionsError(str(exc)) from exc
        self._limits = settings.limits
        self._batcher.interval_s = settings.tap_batch_ms / 1000.0
        self._batcher.slice_s = settings.tap_slice_us / 1e6

    def running(self) -> None:
        if self._options_error is not None:
            log.error("observer: not recording: %s", self._options_error)
            ctx.master.shutdown()
            return
        if self._sink is None and self._writer is None:
            self._start_writer()
            if ctx.options.observer_gc_freeze:
                _freeze_startup_heap()
        self._start_worker()

    def _start_writer(self) -> None:
        from observer.store.migrate import upgrade
        from observer.store.store import AuditStore
        from observer.store.writer import RecordWriter

        settings = settings_from_options(ctx.options)
        url = settings.db
        if settings.migrate:
            upgrade(url)
        self._writer = RecordWriter(AuditStore(url), queue_max=settings.queue_max, spool_path=settings.spool_path)
        self._writer.start()
        self._sink = self._writer.submit
        log.info("observer: recording LLM exchanges to %s", _safe_url(url))

    def _start_worker(self) -> None:
        """Starts the worker process when wanted (``worker`` argument, else the
        ``observer_worker`` option) and possible (a running loop, the default dialect registry:
        the worker builds its own). If it cannot start, streams are observed in-process."""
        settings = settings_from_options(ctx.options)
        want = self._use_worker if self._use_worker is not None else settings.worker
        if not want or self._link is not None:
            return
        if self._custom_registry:
            log.warning("observer: custom dialect registry: observing in-process (the worker has the default one)")
            return
        link = WorkerLink(
            on_record=self._worker_record, on_death=self._worker_died,
            max_buffer_bytes=settings.worker_buffer_mb << 20, nice=settings.worker_nice,
        )  # fmt: skip
        try:
            link.start(asyncio.get_running_loop())
        except Exception:
            log.error("observer: cannot start the worker process; observing in-process", exc_info=True)
            return
        self._link = link
        log.info("observer: parsing streams in worker process %s", link.pid)

    def done(self) -> None:
        # Flows still streaming when the proxy stops never see ``response``/``error`` before the
        # writer closes: finish them now as ``interrupted`` so no exchange goes unrecorded. Queued
        # chunks are observed first and the batcher's callbacks cancelled (the loop is stopping).
        self._stopping = True
        deferred, self._deferred = list(self._deferred.items()), {}
        for state, (handle, kwargs) in deferred:  # ended normally, record not finished yet
            handle.cancel()
            self._finish(state, EndCause.EOF, **kwargs)
        self._batcher.drain()
        now = time.time()
        open_states, self._open, self._by_client = list(self._open.values()), {}, {}
        for state in open_states:
            self._finish(state, EndCause.SHUTDOWN, now=now, message="observer shut down", status=None)
        link = self._link
        if link is not None:  # the worker's last records (or, if it fails to stop, in-process ones)
            stopped = link.close(timeout_s=10.0)
            log.info("observer: worker %s (%d frames, %d bytes sent, %d data batches refused)",
                     "stopped" if stopped else "lost", link.frames_sent, link.bytes_sent,
                     link.data_refused)  # fmt: skip
            self._link = None
        if self._writer is not None:
            self._writer.close(timeout_s=10.0)
            log.info("observer: writer closed %s", self._writer.stats())
            self._writer = None
            self._sink = None

    # ----- hooks -----
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        try:
            view = _request_view(flow)
            dialect = self._registry.classify(view)
            if dialect is None:
                flow.request.stream = True  # not ours: never buffer someone else's upload
                return
            state = _FlowState(dialect, self._skeleton(flow, dialect), view, flow.client_conn.id)
            length = view.headers.get("content-length", "")
            if length.isdigit() and int(length) > self._limits.max_request_bytes:
                flow.request.stream = True
                state.parsed = True
                state.exchange.request.body_bytes = int(length)
                state.violations.append(
                    Violation(ViolationKind.OVERSIZE_REQUEST, None, f"request body of {length} bytes not parsed")
                )
            elif not length.isdigit():  # size not declared: stream it, keep a bounded copy
                state.request_tap = RequestTap(self._limits.max_request_bytes)
                flow.request.stream = state.request_tap
            self._track(flow, state)
        except Exception:
            self._hook_failed("requestheaders")

    def request(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(METADATA_KEY)
        if state is not None:
            self._read_request(flow, state)

    def _read_request(self, flow: http.HTTPFlow, state: _FlowState) -> None:
        """Parses the request body into the record, once: from mitmproxy's buffer, or from the
        bounded copy of a streamed upload (``request`` hook, or ``responseheaders`` when the
        response starts before the upload ended)."""
        if state.parsed:
            return
        state.parsed = True
        try:
            if state.request_tap is not None:
                raw = state.request_tap.body()
                if raw is None:
                    state.exchange.request.body_bytes = state.request_tap.total_bytes
                    state.violations.append(
                        Violation(
                            ViolationKind.OVERSIZE_REQUEST, None,
                            f"request body over {self._limits.max_request_bytes} bytes not parsed",
                        )
                    )  # fmt: skip
                    return
            else:
                raw = flow.request.raw_content
                if raw is None:  # streamed by someone else: nothing to parse
                    return
            body = self._decoded_request(raw, flow.request.headers.get("content-encoding"), state)
            if body is None:
                return
            facts, violations = state.dialect.parse_request(body, state.view)
            state.secrets = _redacted(facts, violations)
            state.exchange.request = facts
            state.violations.extend(violations)
        except Exception as exc:
            self._hook_failed("request")
            state.violations.append(Violation(ViolationKind.OBSERVER_ERROR, None, f"request: {type(exc).__name__}"))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        state = flow.metadata.get(METADATA_KEY)
        try:
            state = self._reclassify(flow, state)
        except Exception:
            self._hook_failed("responseheaders")
        if state is None:
            flow.response.stream = True  # not ours: stream through, never buffer
            return
        self._read_request(flow, state)
        try:
            resp = flow.response
            ex = state.exchange
            ex.status_code = resp.status_code
            ex.violations.extend(state.violations)
            state.violations.clear()
            state.headers = (resp.headers.get("content-type"), resp.headers.get("content-encoding"))
            link = self._link
            fid = self._next_fid
            if link is not None and link.open(
                fid, state.dialect.name, ex, state.view, resp.status_code, *state.headers, self._limits
            ):
                self._next_fid += 1
                state.fid = fid
                self._remote[fid] = state
                state.tap = WorkerTap(fid, link, self._batcher, ex.id)
            else:  # no worker, or it is over its bound: this flow in-process
                state.observer = self._local_observer(state)
                state.tap = StreamTap(state.observer, self._batcher)
            flow.response.stream = state.tap
        except Exception as exc:
            flow.response.stream = True  # fail open: the client still gets its stream
            self._hook_failed("responseheaders")
            state.violations.append(
                Violation(ViolationKind.OBSERVER_ERROR, None, f"responseheaders: {type(exc).__name__}")
            )

    def response(self, flow: http.HTTPFlow) -> None:
        """The end of a response: its record is finished ``FINISH_DELAY_S`` after this hook, not
        in it. mitmproxy sends the end of a streamed response to the client only after the
        ``response`` hook (``HttpStream.send_response``; shared reference "mitmproxy-streaming"
        §1.5), from its own hook task a few loop iterations later, so the last chunks' parse (or
        hand-over) and the record's assembly would delay the client's end of stream. Measured
        (bench/latency.py, h1-TLS, 5 streams, 2-core box): finishing in the hook or in a
        ``call_soon`` callback, end of stream +1.6 to +2.0 ms over the baseline; 5 ms later,
        +0.07 and +0.45 ms. ``done`` finishes what is still waiting."""
        state = self._pop(flow)
        if state is not None:
            now = time.time()
            kwargs = dict(now=now, ended_at=flow.response.timestamp_end or now, message=None,
                          status=flow.response.status_code)  # fmt: skip
            try:
                handle = asyncio.get_running_loop().call_later(FINISH_DELAY_S, self._finish_deferred, state, kwargs)
            except RuntimeError:  # no running loop (unit tests): now
                self._finish(state, EndCause.EOF, **kwargs)
                return
            self._deferred[state] = (handle, kwargs)

    def _finish_deferred(self, state: _FlowState, kwargs: dict) -> None:
        if self._deferred.pop(state, None) is not None:
            try:
                self._finish(state, EndCause.EOF, **kwargs)
            except Exception:  # noqa: BLE001 - a loop callback must not raise; _finish does not
                self._hook_failed("response")

    def error(self, flow: http.HTTPFlow) -> None:
        state = self._pop(flow)
        if state is None:
            return
        message = flow.error.msg if flow.error else "unknown error"
        end = end_cause_from_error(
            message,
            client_closed=flow.client_conn.state is ConnectionState.CLOSED,
            server_closed=flow.server_conn.state is ConnectionState.CLOSED,
        )
        status = flow.response.status_code if flow.response is not None else None
        self._finish(state, end, now=time.time(), message=message, status=status)

    # ----- helpers -----
    def _reclassify(self, flow: http.HTTPFlow, state: _FlowState | None) -> _FlowState | None:
        """Lets the response headers name the dialect (registry ``classify_response``). A flow
        first seen here was not recognised by its request, whose body was streamed on unkept:
        its record has no request facts."""
        view = state.view if state is not None else _request_view(flow)
        headers = {k.lower(): v for k, v in flow.response.headers.items()}
        current = state.dialect if state is not None else None
        dialect = self._registry.classify_response(view, headers, current)
        if dialect is None or dialect is current:
            return state
        if state is None:
            state = _FlowState(dialect, self._skeleton(flow, dialect), view, flow.client_conn.id)
            state.parsed = True  # the request was streamed on unkept
            self._track(flow, state)
            return state
        state.dialect = dialect
        state.exchange.dialect = dialect.name
        raw = flow.request.raw_content
        if raw is not None:  # read the request again, the way the dialect the response revealed reads it
            violations: list[Violation] = []
            body = self._decoded_request(raw, flow.request.headers.get("content-encoding"), state)
            if body is not None:
                state.exchange.request, violations = dialect.parse_request(body, state.view)
                state.secrets = _redacted(state.exchange.request, violations)
            state.violations = [v for v in state.violations if v.kind != ViolationKind.INVALID_REQUEST] + violations
        return state

    def _decoded_request(self, raw: bytes, content_encoding: str | None, state: _FlowState) -> bytes | None:
        """The request body with its Content-Encoding removed, decoded with bounded work and
        output (``max_request_bytes``, ``max_decode_ratio``: a compressed bomb must not stall
        the proxy loop); ``None`` with a recorded violation when it cannot be parsed."""
        limit = self._limits.max_request_bytes
        try:
            decoder = make_decoder(content_encoding, max_ratio=self._limits.max_decode_ratio, max_output_bytes=limit)
            body = decoder.feed(raw) + decoder.close()
        except ObserverError as exc:
            state.exchange.request.body_bytes = len(raw)
            kind = ViolationKind.OVERSIZE_REQUEST if exc.code == LIMIT_CODE else ViolationKind.CONTENT_DECODING_ERROR
            state.violations.append(Violation(kind, None, f"request body not parsed: {exc}"))
            return None
        if len(body) > limit:
            state.exchange.request.body_bytes = len(body)
            state.violations.append(
                Violation(ViolationKind.OVERSIZE_REQUEST, None, f"request body of {len(body)} bytes not parsed")
            )
            return None
        return body

    def _track(self, flow: http.HTTPFlow, state: _FlowState) -> None:
        flow.metadata[METADATA_KEY] = state
        self._open[flow.id] = state
        self._by_client.setdefault(state.client_id, set()).add(flow.id)

    def _pop(self, flow: http.HTTPFlow) -> _FlowState | None:
        """The flow's state, unless it is not observed or was already finished."""
        self._untrack(flow.id)
        state = flow.metadata.pop(METADATA_KEY, None)
        return None if state is None or state.finished else state

    def _untrack(self, flow_id: str) -> _FlowState | None:
        state = self._open.pop(flow_id, None)
        if state is not None:
            ids = self._by_client.get(state.client_id)
            if ids is not None:
                ids.discard(flow_id)
                if not ids:
                    del self._by_client[state.client_id]
        return state

    def client_disconnected(self, client) -> None:
        """Finishes the flows of a closed client connection that mitmproxy ended without a
        ``response``/``error`` hook (e.g. HTTP/2 streams reset before their request was
        complete): recorded as ``client_aborted`` instead of lingering until shutdown (trial
        finding: 20k resets leaked state and surfaced as phantom ``interrupted`` records)."""
        ids = self._by_client.pop(client.id, None)
        if not ids:
            return
        now = time.time()
        for flow_id in ids:
            state = self._open.pop(flow_id, None)
            if state is not None and not state.finished:
                self._finish(state, EndCause.CLIENT_ABORTED, now=now, message="client disconnected", status=None)

    def _finish(
        self,
        state: _FlowState,
        end: EndCause,
        *,
        now: float,
        message: str | None,
        status: int | None,
        ended_at: float | None = None,
    ) -> None:
        """Completes one record and submits it (once per flow); in worker mode asks the worker
        for it (``_worker_record`` submits it when it comes back)."""
        state.finished = True
        if state.tap is not None:
            state.tap.flush()  # chunks still waiting for the batch sweep
        if not state.parsed:
            self._request_not_received(state)
        state.finish_args = (end, now, message, status, ended_at)
        if state.fid is not None:  # the worker's flow (a death sets fid to None, see _worker_died)
            assert self._link is not None and isinstance(state.tap, WorkerTap)
            self._link.finish(state.fid, end, now, ended_at, message, state.tap.skipped_bytes)
            return
        self._complete(state, end, now, message, status, ended_at)

    def _complete(
        self, state: _FlowState, end: EndCause, now: float, message: str | None, status: int | None,
        ended_at: float | None,
    ) -> None:  # fmt: skip
        """Builds the flow's record in-process and submits it."""
        try:
            if state.observer is None:  # no response headers (or their hook failed)
                record = request_only_record(state.exchange, end, now_s=now, transport_error=message)
                if status is not None:
                    record.status_code = status
            else:
                record = state.observer.finish(end, now_s=now, ended_at_s=ended_at, transport_error=message)
            record.violations.extend(state.violations)
        except Exception as exc:
            self._hook_failed("finish")
            record = state.exchange
            record.transport_error = message
            record.violations.append(Violation(ViolationKind.OBSERVER_ERROR, None, f"finish: {type(exc).__name__}"))
        self._submit(record, state.secrets)

    # ----- worker -----
    def _local_observer(self, state: _FlowState) -> StreamObserver:
        ex = state.exchange
        return StreamObserver(
            state.dialect,
            ex,
            view=state.view,
            status_code=ex.status_code if ex.status_code is not None else 0,
            content_type=state.headers[0],
            content_encoding=state.headers[1],
            limits=self._limits,
        )

    def _worker_record(self, fid: int, record: Exchange) -> None:
        """A record the worker made: the addon's own violations of the flow are added, then it
        is submitted."""
        state = self._remote.pop(fid, None)
        if state is None:
            log.error("observer: the worker returned a record for unknown flow %s", fid)
            return
        record.violations.extend(state.violations)
        self._submit(record, state.secrets)

    def _worker_died(self, reason: str) -> None:
        """Every flow the worker held continues in-process with an observer that has failed
        (``observer_error`` naming the reason; it counts the bytes still to come): its record
        keeps the skeleton (request facts, status, timings) and the bytes forwarded, not the
        stream's content. Flows already finished get their record now. A worker that had lived
        ``worker_restart_after_s`` is replaced (e.g. after an out-of-memory kill); otherwise new
        flows are observed in-process until the proxy restarts."""
        self.worker_deaths += 1
        lived = time.monotonic() - self._link.started_at if self._link is not None else 0.0
        self._link = None
        remote, self._remote = self._remote, {}
        for state in remote.values():
            try:
                tap = state.tap
                assert isinstance(tap, WorkerTap)  # every flow in _remote has one
                state.exchange.response_bytes = tap.sent_bytes + tap.skipped_bytes
                obs = self._local_observer(state)
                obs.fail(WorkerDied(reason))
                state.observer = tap.local = obs
                state.fid = None
                if state.finish_args is not None:
                    self._complete(state, *state.finish_args)
            except Exception:  # noqa: BLE001 - one flow's failure must not lose the others
                self._hook_failed("worker death")
        if self._stopping:
            return
        if lived >= self.worker_restart_after_s:
            log.warning("observer: the worker had run %.0f s; starting a new one", lived)
            self._start_worker()
        else:
            log.error("observer: the worker died %.1f s after it started; parsing in the proxy process from now on"
                      " (restart the proxy to try a worker again)", lived)  # fmt: skip

    def _request_not_received(self, state: _FlowState) -> None:
        """Records that the exchange ended before the request body was complete (neither the
        ``request`` nor the ``responseheaders`` hook came: the upstream was unreachable, the
        client gave up mid-upload, the proxy stopped). Trial finding: such records had an empty
        request and no violation. ``body_bytes``: what a streamed upload had passed on (bytes),
        else left at 0 (a buffered body that never completed is not seen by the addon)."""
        state.parsed = True
        seen = state.request_tap.total_bytes if state.request_tap is not None else None
        if seen is not None:
            state.exchange.request.body_bytes = seen
        got = "" if seen is None else f" ({seen} bytes received)"
        state.violations.append(
            Violation(
                ViolationKind.INCOMPLETE_REQUEST, None, f"exchange ended before the request body was complete{got}; not parsed"
            )
        )

    # ----- helpers -----
    def _skeleton(self, flow: http.HTTPFlow, dialect: Dialect) -> Exchange:
        req = flow.request
        return Exchange(
            id=str(uuid.uuid4()),
            dialect=dialect.name,
            scheme=req.scheme,
            host=req.host,
            port=req.port,
            path=redact_path(req.path),
            method=req.method,
            http_version=req.http_version,
            started_at=utc_from_epoch(req.timestamp_start or time.time()),
        )

    def _submit(self, record: Exchange, secrets: list[str]) -> None:
        """Hands ``record`` to the sink, after removing echoes of the request's credential values
        (``secrets``) and credentials in its request ids (``observer.redact.redact_record``)."""
        try:
            redact_record(record, secrets)
        except Exception:  # noqa: BLE001 - never lose the record
            self._hook_failed("scrub")
        sink = self._sink
        if sink is None:
            self.records_dropped += 1
            log.error("observer: no record sink; record %s dropped", record.id)
            return
        try:
            accepted = sink(record)
        except Exception:
            accepted = False
            log.error("observer: record sink failed; record %s dropped", record.id, exc_info=True)
        if accepted:
            self.records_submitted += 1
        else:
            self.records_dropped += 1

    def _hook_failed(self, hook: str) -> None:
        self.hook_errors += 1
        log.error("observer: %s hook failed; the flow passes through unobserved", hook, exc_info=True)


def _redacted(facts: RequestFacts, violations: list[Violation]) -> list[str]:
    """Redacts the request's credentials in place (``observer.redact.redact_request``) and
    returns the values removed; a part too big to check is dropped with an ``oversize_request``
    violation appended to ``violations``."""
    removed, dropped = redact_request(facts)
    for name in dropped:
        violations.append(Violation(ViolationKind.OVERSIZE_REQUEST, None,
                                    f"request {name}: more than {MAX_FIELDS} values or {MAX_CHARS} characters; "
                                    "not kept (not checked for credentials in bounded time)"))  # fmt: skip
    return removed


def _freeze_startup_heap() -> None:
    """Collects once, then moves every surviving object to the permanent generation
    (``gc.freeze``, Python docs "gc"): the process's start-up heap (mitmproxy, SQLAlchemy's
    metadata and mappers, the dialect tables: long-lived by nature) is then never scanned
    again by a full collection. Why: under 100 concurrent TLS streams full collections in the
    addon's mitmdump took 55-150 ms each, every stream waiting meanwhile. Measured with both in
    the same rounds (bench/load.py --variant nofreeze:observer_gc_freeze=false): 100-stream
    h2-TLS p99 +5.2 ms over the baseline with the freeze, +26.9 ms without (docs/performance.md).
    Objects created later are collected as usual."""
    gc.collect()
    gc.freeze()


def _request_view(flow: http.HTTPFlow) -> RequestView:
    req = flow.request
    return RequestView(req.method, req.host, req.path, {k.lower(): v for k, v in req.headers.items()})


def _safe_url(url: str) -> str:
    """The DB URL without its password, for logs."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable url>"


addons = [LLMAudit()]
