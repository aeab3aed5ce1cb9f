"""The mitmproxy addon: mitmproxy's hooks turned into calls on the capture path (the one module
of the capture path that imports mitmproxy; ``observer.ingest`` reads saved flows with
mitmproxy's own readers and drives these hooks with them). Hook use follows mitmproxy 12.3
(shared reference "mitmproxy-streaming", §2 and §7):

- ``tls_clienthello``: TLS to a host that is not an LLM host (``observer.hosts``; setting
  ``intercept``) is tunnelled without interception: the client sees the server's own
  certificate, and no HTTP hook ever sees it.
- ``server_connect`` / ``server_connected``: upstreams the proxy must not reach for its clients
  (``capture.guard``: loopback, link-local, cloud metadata, the observer's own ports) are refused.
- ``requestheaders``: classify by host and headers (cheap); other traffic gets ``stream = True``
  on the request (and later the response) so it is never buffered and never recorded, except
  that a request on an LLM host that a response-recognised dialect may still claim has its body
  copied on the side as it streams on (``capture.held``), until its response headers decide,
  all such copies together within ``max_held_request_bytes`` (dropped on every end of the flow:
  ``response``, ``error``, ``client_disconnected``, ``done``).
- ``request``: read the (buffered) request body of an observed flow (``capture.request``).
- ``responseheaders``: the response's spec goes to the backend (``capture.backend``) and a
  per-flow stream callable (``capture.tap.StreamTap``) returns every chunk unchanged.
- ``response`` / ``error`` (mutually exclusive), ``client_disconnected``, ``done``: finish the
  record (``capture.flows.FlowTable.finish``).
- ``websocket_start`` / ``websocket_message`` / ``websocket_end``: a WebSocket on an LLM host
  that a socket dialect reads (``DialectRegistry.classify_websocket``) gives one record per turn
  (``capture.sockets``); every socket's ``flow.websocket.messages`` is kept to its newest.

Fail open: no exception leaves a hook or the stream callable. A failure stops observation of
that flow, the bytes keep flowing, and the record carries an ``observer_error`` violation.
Hooks never block or await.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from mitmproxy import ctx, exceptions, http, tls
from mitmproxy.connection import ConnectionState
from mitmproxy.proxy import server_hooks

from observer.alerting.delivery import AlertDispatcher
from observer.alerting.rules import AlertConfig, AlertEngine, load_alert_config
from observer.capture.backend import FailoverBackend, InProcessBackend
from observer.capture.batcher import TapBatcher, running_loop
from observer.capture.flows import FlowState, FlowTable, Sink
from observer.capture.guard import Resolved, UpstreamGuard, build_guard, is_local, literal, resolve
from observer.capture.held import HeldBudget, HeldRequests, adopt, hold, holders, holds
from observer.capture.request import (
    RequestRead,
    RequestTap,
    declared_too_large,
    flow_record_id,
    read_request,
    response_id_of,
    skeleton,
    spec_tool_names,
)
from observer.capture.sender import sender_of, stamp_sender
from observer.capture.sockets import Socket, SocketRecorder
from observer.capture.tap import StreamTap
from observer.config import OPTION_PREFIX, PROXY_SPECS, Settings, add_options, did_you_mean, settings_from_options
from observer.dialects.base import Dialect, RequestView
from observer.dialects.registry import DEFAULT_REGISTRY, DialectRegistry, load_registry
from observer.errors import ConfigError
from observer.identity import FingerprintKey
from observer.limits import Limits
from observer.metrics import ProxyMetrics, SnapshotWriter, pipeline_stats, proxy_name
from observer.reassembly import EndCause
from observer.records import Exchange, Violation, ViolationKind
from observer.redact import header_secrets
from observer.response import ResponseSpec, StreamEnd

if TYPE_CHECKING:
    from observer.journal.journal import Journal
    from observer.otlp import SpanExport
    from observer.store.drain import Drainer

log = logging.getLogger("observer.addon")

METADATA_KEY = "llm_audit"
_REFUSAL = (
    b'{"error":{"type":"recording_unavailable","message":"The audit proxy cannot record this request'
    b" (its journal is full or failing) and is configured to refuse unrecorded LLM traffic (fail_closed);"
    b' try again later."}}'
)
FINISH_DELAY_S = 0.005  # seconds from the ``response`` hook to finishing the record (see ``response``)
_GRPC_STATUS_FIELDS = frozenset({"grpc-status", "grpc-message"})  # gRPC's trailers-only response (``_trailers``)


class LLMAudit:
    """The addon. ``sink`` receives each finished record and returns False when it had to drop
    it; by default (``sink=None``) a ``RecordWriter`` on ``observer_db`` is started in
    ``running`` and closed in ``done``. ``registry``: the dialect registry factory
    (``"package.module:function"``, ``observer.dialects.registry.load_registry``; default: the
    ``observer_dialect_registry`` option), which the worker process builds too; a
    ``DialectRegistry`` object is used as it is, in-process only (a worker cannot rebuild it).
    ``worker``: parse in a worker process (``None``: the ``observer_worker`` option decides)."""

    def __init__(
        self,
        sink: Sink | None = None,
        registry: DialectRegistry | str | None = None,
        worker: bool | None = None,
        fingerprint_key: FingerprintKey | None = None,
    ) -> None:
        # The secret of key fingerprints (observer.identity): given, or the setting's file once
        # the proxy journals (``_start_writer``); without one, records have no key_fingerprint.
        self._fingerprint_key = fingerprint_key
        self._registry_given = registry is not None  # else the observer_dialect_registry option decides
        if isinstance(registry, DialectRegistry):
            self._registry_factory: str | None = None
            self._registry = registry
        else:
            self._registry_factory = registry or DEFAULT_REGISTRY
            self._registry = load_registry(self._registry_factory)
        self._metrics = ProxyMetrics(pipeline=self._pipeline_stats)
        self._metrics_writer: SnapshotWriter | None = None
        self._final_pipeline: dict[str, float] | None = None
        self._alert_config: AlertConfig | None = None
        self._otlp: SpanExport | None = None
        self._alerts: tuple[AlertEngine, AlertDispatcher] | None = None
        self._flows = FlowTable(sink=sink, observe=self._observe)
        self._sockets = SocketRecorder(self._flows, Settings.model_construct().limits)
        self._custom_sink = sink is not None
        self._journal: Journal | None = None
        self._drainer: Drainer | None = None
        self.refused_requests = 0  # fail_closed: LLM requests answered 503
        self._last_refusal_log = -60.0
        self._settings = Settings.model_construct()  # the defaults until ``configure``
        self._limits = self._settings.limits
        # request bodies held until their response headers decide (capture.held), and their budget
        self._held = HeldRequests(HeldBudget(self._limits.max_held_request_bytes))
        self._batcher = TapBatcher(running_loop)
        self._sockets.batcher = self._batcher
        self._use_worker = worker  # None: the observer_worker option decides
        self._backend: InProcessBackend | FailoverBackend = InProcessBackend(
            self._registry, self._flows.on_facts, self._flows.on_turn
        )
        self._flows.backend = self._backend
        self.worker_restart_after_s = 60.0  # a dead worker that had lived this long is replaced
        self._hosts = self._settings.llm_host_list  # the built-in list until ``configure``
        self._intercept_all = False
        self._guard: UpstreamGuard | None = None  # built off the loop at the first connection
        self._guard_lock: asyncio.Lock | None = None
        self._listen_ports: frozenset[int] = frozenset()
        self._refused_servers: dict[str, str] = {}  # server connection id -> why (found after connecting)
        self._connect_allowed: dict[str, tuple[str, int]] = {}  # client connection id -> CONNECT target checked
        self.refused_connections = 0
        self._options_error: str | None = None  # a deferred ``--set observer_*`` that did not parse
        self._deferred: dict[FlowState, tuple] = {}  # ``response`` finishing soon: state -> (handle, end, status)
        self._holders: tuple[DialectRegistry | None, tuple[Dialect, ...]] = (None, ())  # ``_response_holders``
        self.hook_errors = 0

    # ----- counters -----
    @property
    def records_submitted(self) -> int:
        return self._flows.records_submitted

    @property
    def records_dropped(self) -> int:
        return self._flows.records_dropped

    @property
    def metrics(self) -> ProxyMetrics:
        return self._metrics

    @property
    def observer_errors(self) -> int:
        """Failures of the observer's own code (hooks, finishing): each flow passed unobserved."""
        return self.hook_errors + self._flows.errors

    @property
    def worker_alive(self) -> bool:
        """Parsing works: in-process by choice, or the worker process is up."""
        if isinstance(self._backend, FailoverBackend):
            return self._backend.link is not None
        return not (self._use_worker if self._use_worker is not None else self._settings.worker)

    def _pipeline_stats(self) -> dict[str, float]:
        if self._journal is None and self._final_pipeline is not None:  # shut down: the last counts
            return self._final_pipeline
        return pipeline_stats(self._journal, self._drainer, self, self._settings.spool_max_bytes)

    @property
    def open_exchanges(self) -> int:
        """Exchanges whose record is not made yet (streaming, or finishing)."""
        return self._flows.open_count + len(self._deferred)

    @property
    def held_requests(self) -> HeldRequests:
        """The request bodies held until their response headers decide, and their budget
        (``capture.held``)."""
        return self._held

    @property
    def worker_deaths(self) -> int:
        return self._backend.worker_deaths if isinstance(self._backend, FailoverBackend) else 0

    @property
    def _link(self):
        """The live worker link, if any (tests)."""
        return self._backend.link if isinstance(self._backend, FailoverBackend) else None

    # ----- options -----
    def load(self, loader) -> None:
        add_options(loader)  # every proxy setting of observer.config as observer_<name>
        self._apply_deferred_options()

    def _apply_deferred_options(self) -> None:
        """Applies the ``--set observer_*=VALUE`` that mitmproxy deferred until this script
        loaded, so that a malformed one is reported. mitmproxy applies a script's deferred
        options right after ``load``, all at once; a value that does not parse raises there, and
        the script loader drops the exception and the addon without a word (the proxy would run
        and record nothing). Here the error is logged (mitmdump exits with code 1 after an error
        logged during start-up: its ``errorcheck`` addon), the ``observer_*`` entries are dropped
        so the addon still loads, and ``running`` refuses to record and shuts the proxy down."""
        try:
            ctx.options.process_deferred()
        except exceptions.OptionsError as exc:
            self._options_error = str(exc)
        # What is still deferred under our prefix names no option of ours: a typo must not leave
        # the default in force unnoticed (trial finding: --set observer_max_event_byte=1 ran on).
        unknown = [k for k in ctx.options.deferred if k.startswith(OPTION_PREFIX)]
        for name in unknown:
            del ctx.options.deferred[name]
        if unknown and self._options_error is None:
            known = [spec.option for spec in PROXY_SPECS]
            self._options_error = "; ".join(f"--set {k} is not an option{did_you_mean(k, known)}" for k in unknown)
        if self._options_error is None:  # out of range: one line here, not configure's traceback
            try:
                self._apply_options()
            except exceptions.OptionsError as exc:
                self._options_error = str(exc)
        if self._options_error is not None:
            log.error("observer: %s; not recording", self._options_error)

    def configure(self, updated: set[str]) -> None:
        """Applies changed ``observer_*`` options (``_apply_options``); raises ``OptionsError``
        naming a bad one and its range."""
        if self._options_error is not None or not any(name.startswith(OPTION_PREFIX) for name in updated):
            return  # (a start-up error is reported once, by _apply_deferred_options, and stops the proxy)
        self._apply_options()

    def _apply_options(self) -> None:
        """Reads the ``observer_*`` options (``observer.config.settings_from_options``) and applies
        them: limits, batching, and the dialect registry when it names another one (built once).
        Raises ``OptionsError`` naming a bad value and its range, or a registry that cannot be
        built or cannot change (the worker runs)."""
        try:
            settings = settings_from_options(ctx.options)
        except ConfigError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        if not self._registry_given and settings.dialect_registry != self._registry_factory:
            if isinstance(self._backend, FailoverBackend):
                raise exceptions.OptionsError(
                    "observer_dialect_registry cannot change while the worker runs; restart the proxy"
                )
            try:
                registry = load_registry(settings.dialect_registry)
            except (ImportError, AttributeError, ValueError, TypeError) as exc:
                raise exceptions.OptionsError(f"observer_dialect_registry: {type(exc).__name__}: {exc}") from None
            self._registry, self._registry_factory = registry, settings.dialect_registry
            self._backend = self._flows.backend = InProcessBackend(registry, self._flows.on_facts)
        if settings.alerts_file is not None and self._alerts is None:
            try:
                self._alert_config = load_alert_config(settings.alerts_file)
            except ConfigError as exc:
                raise exceptions.OptionsError(f"observer_alerts_file: {exc}") from None
        self._settings = settings
        self._limits = settings.limits
        self._held.budget.limit_bytes = settings.limits.max_held_request_bytes
        self._sockets.limits = settings.limits
        self._hosts = settings.llm_host_list
        self._intercept_all = settings.intercept == "all"
        self._guard = None  # rebuilt with the new settings at the next connection
        self._batcher.interval_s = settings.tap_batch_ms / 1000.0
        self._batcher.slice_s = settings.tap_slice_us / 1e6

    # ----- life cycle -----
    def running(self) -> None:
        self._listen_ports = _listen_ports()
        if self._options_error is not None:
            log.error("observer: not recording: %s", self._options_error)
            ctx.master.shutdown()
            return
        if not self._custom_sink and self._journal is None:
            try:
                self._start_writer()
            except ConfigError as exc:  # the journal in use, a key that cannot be read: not recording
                log.error("observer: not recording: %s", exc)
                ctx.master.shutdown()
                return
            if self._settings.gc_freeze:
                _freeze_startup_heap()
        self._start_worker()
        self._start_metrics()
        self._start_alerts()
        self._start_otlp()

    def _start_otlp(self) -> None:
        """Sends each record as a span too (``observer.otlp``) when ``otlp_endpoint`` is set."""
        endpoint = self._settings.otlp_endpoint
        if endpoint is None or self._otlp is not None:
            return
        from observer.otlp import SpanExport

        self._otlp = SpanExport(endpoint, content=self._settings.otlp_content)
        log.info(
            "observer: records also go to %s as spans%s",
            endpoint,
            " with content" if self._settings.otlp_content else "",
        )

    def _start_alerts(self) -> None:
        """Starts the alert thread (``observer.alerting``) when an alerts file is set: alerts are
        stored in the audit store when this proxy records to one."""
        config = self._alert_config
        if config is None or self._alerts is not None:
            return
        store = None
        if self._journal is not None:
            from observer.store import alerts as alert_rows
            from observer.store.store import AuditStore

            engine = AuditStore(self._settings.db).engine
            store = (
                lambda row: alert_rows.add_alert(engine, row),
                lambda i, d: alert_rows.set_deliveries(engine, i, d),
            )
        rules = AlertEngine(config, proxy_name(self._listen_ports))
        dispatcher = AlertDispatcher(config, rules, self._pipeline_stats, store)
        dispatcher.start()
        self._alerts = (rules, dispatcher)
        log.info("observer: %d alert rules, %d webhooks", len(config.rule), len(config.webhook))

    def _observe(self, record: Exchange) -> None:
        """Every finished record, before the sink, on the loop: counted in the metrics and put
        to the record rules (cheap; delivery is the alert thread's)."""
        self._metrics.observe(record)
        if self._otlp is not None:
            self._otlp.submit(record)
        alerts = self._alerts
        if alerts is not None:
            try:
                alerts[1].submit(alerts[0].on_record(record, time.time()))
            except Exception:  # noqa: BLE001
                self._hook_failed("alerts")

    def _start_metrics(self) -> None:
        """Writes the metrics snapshot to ``metrics_dir`` (``observer.metrics``) when one is set."""
        folder = self._settings.metrics_dir
        if folder is None or self._metrics_writer is not None:
            return
        writer = SnapshotWriter(self._metrics, folder, proxy_name(self._listen_ports))
        try:
            writer.start()
        except OSError as exc:
            log.error("observer: no metrics: cannot write to %s: %s", folder, exc)
            return
        self._metrics_writer = writer

    def _start_writer(self) -> None:
        """The journal (``observer.journal``) and its drainer to the store: what a previous run
        left open is recovered first, then records go to the journal (the sink) and from it to
        the database. A database that does not answer yet is retried by the drainer."""
        from observer.journal.journal import Journal
        from observer.journal.recovery import recover
        from observer.store.checkpoint import CheckpointKey
        from observer.store.drain import Drainer, read_ack
        from observer.store.migrate import upgrade
        from observer.store.store import AuditStore

        settings = self._settings
        url = settings.db
        key = CheckpointKey.load_or_create(settings.checkpoint_key_path)  # ConfigError before anything opens
        if self._fingerprint_key is None:
            self._fingerprint_key = FingerprintKey.load_or_create(settings.fingerprint_key_path)
        journal = Journal(settings.journal_path, max_bytes=settings.spool_max_bytes, queue_max=settings.queue_max)
        journal.open()
        _pos, acked_seq = read_ack(journal.directory)
        recovery = recover(journal.directory, self._registry)
        first = recovery.records + _legacy_spool(settings.legacy_spool)
        journal.start(max(recovery.max_seq, acked_seq) + 1, first)
        waiting = recovery.records_after(acked_seq)
        self._journal = journal
        self._sockets.journal = journal  # WebSocket turns are journaled too (capture.sockets)
        self._drainer = Drainer(
            AuditStore(url),
            journal,
            prepare=(lambda: upgrade(url)) if settings.migrate else None,
            checkpoint_key=key,
            checkpoint_every=settings.checkpoint_every,
            checkpoint_interval_s=settings.checkpoint_interval_s,
            on_write=self._metrics.db_write.observe,
        )
        self._drainer.start()
        self._flows.set_sink(journal.record, journal.forget)
        log.info(
            "observer: journal %s: %d records waiting for the store, %d open exchanges recovered as records%s",
            journal.directory,
            waiting,
            len(recovery.records),
            f", {len(recovery.damaged)} damaged segments (logged)" if recovery.damaged else "",
        )
        log.info("observer: recording LLM exchanges to %s", _safe_url(url))

    def _start_worker(self) -> None:
        """Parses in a worker process when wanted (``worker`` argument, else the
        ``observer_worker`` option) and possible (a running loop, a registry the worker can
        build from its factory name); otherwise in-process."""
        settings = self._settings
        want = self._use_worker if self._use_worker is not None else settings.worker
        if not want or isinstance(self._backend, FailoverBackend):
            return
        if self._registry_factory is None:
            log.warning(
                "observer: a dialect registry object was given: observing in-process (a worker builds its"
                " registry from a factory name)"
            )
            return
        loop = running_loop()
        if loop is None:
            return
        backend = FailoverBackend(
            self._registry,
            self._registry_factory,
            self._flows.on_facts,
            on_turn=self._flows.on_turn,
            buffer_bytes=settings.worker_buffer_mb << 20,
            nice=settings.worker_nice,
            restart_after_s=self.worker_restart_after_s,
        )
        if backend.start(loop):
            self._backend = self._flows.backend = backend

    def done(self) -> None:
        """Flows still streaming when the proxy stops never see ``response``/``error`` before the
        writer closes: they are finished now as ``interrupted``, after the queued chunks were
        handed over and the batcher's callbacks cancelled (the loop is stopping)."""
        if isinstance(self._backend, FailoverBackend):
            self._backend.stopping()  # no new worker from here on
        deferred, self._deferred = list(self._deferred.items()), {}
        for state, (handle, end, status) in deferred:  # ended normally, record not finished yet
            handle.cancel()
            self._flows.finish(state, end, status)
        self._batcher.drain()
        self._held.release_all()  # bodies still held for a response that will not come now
        now = time.time()
        for state in self._flows.take_all():
            self._flows.finish(state, StreamEnd(EndCause.SHUTDOWN, now, transport_error="observer shut down"))
        for sock in list(self._sockets.sockets.values()):  # WebSocket turns still open: interrupted
            self._sockets.end(sock, None, now, shutdown=True)
        if isinstance(self._backend, FailoverBackend):
            self._backend.close(timeout_s=10.0)
        metrics, self._metrics_writer = self._metrics_writer, None
        if metrics is not None:
            metrics.stop()
        alerts, self._alerts = self._alerts, None
        if alerts is not None:
            alerts[1].close(timeout_s=5.0)
        otlp, self._otlp = self._otlp, None
        if otlp is not None:
            otlp.close(timeout_s=5.0)
        if self._journal is not None:
            self._stop_writer()
        if metrics is not None:
            metrics.write()  # the final counts (the journal's and the drainer's: read before they close)
            metrics.retire()  # stopped on purpose: out of /metrics and /readyz

    def _stop_writer(self) -> None:
        """Journals what is queued, stores what the database takes within 10 s, and logs what
        this run journaled, stored and dropped and what waits in the journal for the next start."""
        from observer.store.drain import unstored_records

        journal, drainer = self._journal, self._drainer
        assert journal is not None
        journal.close(timeout_s=10.0)
        if drainer is None:  # its start failed (logged): the records wait in the journal
            self._journal = None
            self._flows.set_sink(None)
            return
        drainer.close(timeout_s=10.0)
        waiting = unstored_records(journal.directory)
        js, ds = journal.stats(), drainer.stats()
        log.info(
            "observer: shutdown: %d records journaled, %d stored (%d gaps), %d dropped, %d waiting in the journal"
            " for the next start%s%s",
            js["journaled"],
            ds["written"],
            ds["gaps"],
            js["dropped"],
            waiting,
            "" if not ds["refused"] else " (the journal belongs to another store: see the error above)",
            f"; {self.refused_requests} LLM requests refused (fail_closed)" if self.refused_requests else "",
        )
        self._final_pipeline = pipeline_stats(journal, drainer, self, self._settings.spool_max_bytes)
        self._journal = self._drainer = None
        self._flows.set_sink(None)

    # ----- connection hooks -----
    def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        """TLS to a host that is not an LLM host is not intercepted (``ignore_connection``: the
        encrypted bytes pass as they are, the client checks the server's own certificate). The
        host is the CONNECT target or the ClientHello's SNI: either on the list intercepts.
        ``intercept = all`` intercepts every connection (labs)."""
        try:
            if self._intercept_all or data.ignore_connection:
                return
            address = data.context.server.address
            port = address[1] if address else 443
            names = [n for n in (data.client_hello.sni, address[0] if address else None) if n]
            if not any(self._hosts.matches(name, port) for name in names):
                data.ignore_connection = True
        except Exception:
            self._hook_failed("tls_clienthello")  # (the connection is intercepted as mitmproxy would)

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Refuses an upstream the guard does not allow (``capture.guard``): the client gets
        mitmproxy's error answer (502 to a CONNECT) naming the reason. The name is resolved off
        the event loop; every address it gives must be allowed. A failure of the check itself
        refuses too (this is an access control: it fails closed), logged."""
        server = data.server
        if server.address is None or server.via is not None:  # (an upstream proxy is the next hop's to police)
            return
        host, port = str(server.address[0]), int(server.address[1])
        if self._connect_allowed.pop(data.client.id, None) == (host, port):
            return  # http_connect has just checked this CONNECT's target (server_connected still checks the peer)
        why = await self._refusal(host, port, "server_connect")
        if why is not None:
            server.error = why
            self._refused(why, data.client.peername)

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        """A ``CONNECT`` to an upstream the guard does not allow is answered ``403`` with the
        reason (text/plain) before any connection is made: a refusal by policy, not a failed
        upstream (refused in ``server_connect`` instead, mitmproxy's 502 for an eager CONNECT
        also advised setting ``connection_strategy``: trial finding). An allowed target is
        remembered for the ``server_connect`` that follows, so it is resolved once."""
        if flow.client_conn.proxy_mode.type_name == "upstream":  # the next hop's to police, as in server_connect
            return
        host, port = flow.request.host, flow.request.port
        why = await self._refusal(host, port, "http_connect")
        if why is None:
            self._connect_allowed[flow.client_conn.id] = (host, port)
            return
        body = f"{why[:1].upper()}{why[1:]}.\n".encode()  # "The audit proxy does not connect to H:P: <reason>."
        flow.response = http.Response.make(403, body, {"content-type": "text/plain; charset=utf-8"})
        self._refused(why, flow.client_conn.peername)

    async def _refusal(self, host: str, port: int, hook: str) -> str | None:
        """Why the guard refuses ``host:port`` (``None``: allowed); the name resolved off the
        event loop, every address it gives checked. A failure of the check refuses (an access
        control fails closed), logged as an observer error of ``hook``."""
        try:
            guard = await self._upstream_guard()
            dest = await asyncio.get_running_loop().run_in_executor(None, resolve, host, port)
            return guard.refusal(dest)
        except Exception:
            self._hook_failed(hook)
            return f"the audit proxy could not check {host}:{port} (observer error, logged)"

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Checks the address actually connected (``peername``): a name that resolved to an
        allowed address for the check and to a refused one for the connection (DNS rebinding)
        gets its connection marked failed, so no request is sent on it (mitmproxy answers each
        with the error) and a tunnel on it is killed at its start (``tcp_start``)."""
        guard = self._guard
        peer = data.server.peername
        if guard is None or peer is None or data.server.via is not None:
            return
        try:
            address = literal(str(peer[0]))
            if address is None:
                return
            host = str(data.server.address[0]) if data.server.address else str(address)
            why = guard.refusal(Resolved(host, int(peer[1]), (address,), (is_local(address),)))
        except Exception:
            self._hook_failed("server_connected")
            return
        if why is not None:
            data.server.error = why
            self._refused_servers[data.server.id] = why
            self._refused(why, data.client.peername)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._refused_servers.pop(data.server.id, None)

    def tcp_start(self, flow) -> None:
        """A tunnel (TLS not intercepted, or raw TCP) on a connection ``server_connected``
        refused is killed before its first byte is relayed."""
        if flow.server_conn.id in self._refused_servers:
            flow.kill()

    async def _upstream_guard(self) -> UpstreamGuard:
        """The guard of the current settings, built once (resolving the protected names is
        blocking: done in the executor, under a lock so that concurrent connections wait for
        one build)."""
        if self._guard is not None:
            return self._guard
        if self._guard_lock is None:
            self._guard_lock = asyncio.Lock()
        async with self._guard_lock:
            if self._guard is None:
                settings, listen = self._settings, self._listen_ports
                self._guard = await asyncio.get_running_loop().run_in_executor(None, build_guard, settings, listen)
        return self._guard

    def _refused(self, why: str, client: object) -> None:
        self.refused_connections += 1
        log.warning("observer: refused a connection for %s: %s", _peer(client), why)

    # ----- hooks -----
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if flow.server_conn.id in self._refused_servers:
            flow.kill()
            return
        if flow.response is not None:  # answered by the proxy itself (proxyauth's 407): no exchange upstream
            return
        try:
            view = _request_view(flow)
            llm_host = self._is_llm_host(flow)
            dialect = self._registry.classify(view, llm_host)
            if dialect is None:
                flow.request.stream = True  # not ours: never buffer someone else's upload
                if holds(self._response_holders(), view, llm_host):  # ... but its response may claim it
                    held = hold(view, self._limits, self._held.budget)
                    self._held.add(flow.id, flow.client_conn.id, held)
                    if held.tap is not None:
                        flow.request.stream = held.tap  # streamed on unchanged, a bounded copy kept
                return
            if self._settings.fail_closed and self._journal is not None and not self._journal.accepting:
                self._refuse(flow)
                return
            state = _new_state(flow, dialect, view)
            length = view.headers.get("content-length", "")
            too_large = declared_too_large(length, self._limits)
            if too_large is not None:
                flow.request.stream = True
                state.parsed = True
                state.exchange.request.body_bytes = int(length)
                state.violations.append(too_large)
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

    def _read_request(self, flow: http.HTTPFlow, state: FlowState) -> None:
        """Parses the request body into the record, once: from mitmproxy's buffer, or from the
        bounded copy of a streamed upload (``request`` hook, or ``responseheaders`` when the
        response starts before the upload ended)."""
        if state.parsed:
            return
        if state.held and flow.request.timestamp_end is None:
            return  # a held body still uploading: read at its end (``request``), else incomplete_request
        state.parsed = True
        try:
            if state.request_tap is not None:
                raw = state.request_tap.body()
                if raw is None:
                    state.exchange.request.body_bytes = state.request_tap.total_bytes
                    state.violations.append(state.request_tap.overflow(self._limits))
                    return
            else:
                raw = flow.request.raw_content
                if raw is None:  # streamed by someone else: nothing to parse
                    return
            encoding = flow.request.headers.get("content-encoding")
            read = read_request(state.dialect, state.view, raw, encoding, self._limits)
            if state.request_tap is not None:  # a streamed upload: a later turn's request is read again
                state.reread = _rereader(state.request_tap, state.dialect, state.view, encoding, self._limits)
            state.take(read)
            state.violations.extend(read.violations)
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
        if state.metadata_only:  # not LLM traffic after all: its response is not read, only counted
            state.exchange.status_code = flow.response.status_code
            flow.response.stream = state.count_unread
            return
        try:
            resp = flow.response
            ex = state.exchange
            ex.status_code = resp.status_code
            request = ex.request
            spec = ResponseSpec(
                dialect=state.dialect.name,
                status_code=resp.status_code,
                content_type=resp.headers.get("content-type"),
                content_encoding=resp.headers.get("content-encoding"),
                started_at_s=ex.started_at.timestamp(),
                path=ex.path,
                tool_names=spec_tool_names(state.dialect, request),
                request_id=request.request_id,
                request_stream=request.stream,
                limits=self._limits,
                message_encoding=resp.headers.get("connect-content-encoding") or resp.headers.get("grpc-encoding"),
                response_id=response_id_of(state.dialect, resp.headers),
            )
            flush_bytes = self._backend.open(state.key, spec)
            state.opened = True
            journal = self._journal
            if journal is not None:
                # A shallow copy: finishing sets the skeleton's fields later; the journal's
                # thread makes the JSON (the loop pays ~2 µs, not ~20).
                journal.open_exchange(state.key, copy.copy(ex), spec, list(state.violations))
            state.tap = StreamTap(state.key, self._backend, flush_bytes, self._batcher, journal)
            flow.response.stream = state.tap
        except Exception as exc:
            flow.response.stream = True  # fail open: the client still gets its stream
            self._hook_failed("responseheaders")
            state.violations.append(
                Violation(ViolationKind.OBSERVER_ERROR, None, f"responseheaders: {type(exc).__name__}")
            )

    def response(self, flow: http.HTTPFlow) -> None:
        """The end of a response: its record is finished ``FINISH_DELAY_S`` after this hook, not
        in it: mitmproxy sends the end of a streamed response to the client only after the
        ``response`` hook (shared reference "mitmproxy-streaming" §1.5), so the last chunks'
        parse and the record's assembly would delay the client's end of stream (measured:
        docs/performance.md, "Finishing after the response hook"). ``done`` finishes what is
        still waiting."""
        state = self._pop(flow)
        if state is None:
            return
        now = time.time()
        end = StreamEnd(EndCause.EOF, now, flow.response.timestamp_end or now, trailers=_trailers(flow.response))
        status = flow.response.status_code
        loop = running_loop()
        if loop is None:  # no running loop (unit tests): now
            self._flows.finish(state, end, status)
            return
        handle = loop.call_later(FINISH_DELAY_S, self._finish_deferred, state)
        self._deferred[state] = (handle, end, status)

    def _finish_deferred(self, state: FlowState) -> None:
        entry = self._deferred.pop(state, None)
        if entry is not None:
            self._flows.finish(state, entry[1], entry[2])

    def error(self, flow: http.HTTPFlow) -> None:
        state = self._pop(flow)
        if state is None:
            return
        message = flow.error.msg if flow.error else "unknown error"
        cause = end_cause_from_error(
            message,
            client_closed=flow.client_conn.state is ConnectionState.CLOSED,
            server_closed=flow.server_conn.state is ConnectionState.CLOSED,
        )
        status = flow.response.status_code if flow.response is not None else None
        self._flows.finish(state, StreamEnd(cause, time.time(), transport_error=message), status)

    def client_disconnected(self, client) -> None:
        """Finishes the flows of a closed client connection that mitmproxy ended without a
        ``response``/``error`` hook (e.g. HTTP/2 streams reset before their request was
        complete): recorded as ``client_aborted`` instead of lingering until shutdown (trial
        finding: 20k resets leaked state and surfaced as phantom ``interrupted`` records)."""
        self._connect_allowed.pop(client.id, None)
        self._held.release_client(client.id)  # held bodies of flows ended without a hook
        states = self._flows.of_client(client.id)
        if states:
            end = StreamEnd(EndCause.CLIENT_ABORTED, time.time(), transport_error="client disconnected")
            for state in states:
                self._flows.finish(state, end)

    # ----- helpers -----
    def _refuse(self, flow: http.HTTPFlow) -> None:
        """``fail_closed``: an LLM request that could not be recorded gets 503 from the proxy."""
        # (Not ``request.stream``: mitmproxy refuses a response set on a streamed request with a
        # body, and the client would hang. The body is read, bounded by mitmproxy, and dropped.)
        flow.response = http.Response.make(503, _REFUSAL, {"content-type": "application/json", "retry-after": "5"})
        self.refused_requests += 1
        now = time.monotonic()
        if now - self._last_refusal_log >= 60.0:
            self._last_refusal_log = now
            js = self._journal.stats() if self._journal is not None else {}
            log.error(
                "observer: fail_closed: LLM requests are refused (503) while recording fails (journal %d bytes"
                " of %d, disk errors %d); %d refused so far",
                js.get("spool_bytes", 0),
                self._settings.spool_max_bytes,
                js.get("disk_errors", 0),
                self.refused_requests,
            )

    def _reclassify(self, flow: http.HTTPFlow, state: FlowState | None) -> FlowState | None:
        """Lets the response headers name the dialect (registry ``classify_response``). A flow
        first seen here was not recognised by its request: its body, streamed on, is the copy
        held for it (``capture.held.adopt``), dropped when the response does not claim it (or
        when this fails: never left reserved)."""
        held = self._held.pop(flow.id)
        try:
            view = state.view if state is not None else _request_view(flow)
            headers = {k.lower(): v for k, v in flow.response.headers.items()}
            current = state.dialect if state is not None else None
            dialect = self._registry.classify_response(view, headers, current, self._is_llm_host(flow))
            if dialect is None or dialect is current:
                return state
            if state is None:
                state = _new_state(flow, dialect, view)
                adopt(state, held)
                held = None
                self._track(flow, state)
                return state
        finally:
            if held is not None:
                held.release()
        state.dialect = dialect
        state.exchange.dialect = dialect.name
        raw = flow.request.raw_content
        if raw is not None:  # read the request again, the way the dialect the response revealed reads it
            read = read_request(dialect, state.view, raw, flow.request.headers.get("content-encoding"), self._limits)
            state.take(read)
            reread = (ViolationKind.INVALID_REQUEST, ViolationKind.NOT_LLM_REQUEST)
            state.violations = [v for v in state.violations if v.kind not in reread]
            state.violations += read.violations
        return state

    # ----- WebSocket (capture.sockets) -----
    def websocket_start(self, flow: http.HTTPFlow) -> None:
        """A WebSocket on an LLM host that a socket dialect reads (``classify_websocket``) is
        observed from here; any other passes unobserved."""
        try:
            view = _request_view(flow)
            dialect = self._registry.classify_websocket(view, self._is_llm_host(flow))
            if dialect is None:
                return
            req = flow.request
            http_facts = {
                "scheme": req.scheme,
                "host": req.host,
                "port": req.port,
                "path": req.path,
                "method": req.method,
                "http_version": req.http_version,
            }
            sock = Socket(
                flow.id,
                flow.client_conn.id,
                dialect,
                dialect.new_session(),
                view,
                http_facts,
                header_secrets(view.headers),
                sender=self._sender(flow),
            )
            self._sockets.sockets[flow.id] = sock
        except Exception:
            self._hook_failed("websocket_start")

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """Sits on the relay path (mitmproxy forwards the message after it returns): keeps
        ``flow.websocket.messages`` to the newest message on every socket (memory; later addons
        still see ``messages[-1]``), and hands an observed socket's message to its session."""
        ws = flow.websocket
        if ws is None or not ws.messages:
            return
        message = ws.messages[-1]
        if len(ws.messages) > 1:
            del ws.messages[:-1]
        sock = self._sockets.sockets.get(flow.id)
        if sock is None:
            return
        try:
            self._sockets.message(sock, message.from_client, message.content, message.timestamp)
        except Exception:
            self._hook_failed("websocket_message")
            self._sockets.fail(sock, "websocket_message", time.time())

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        """The socket closed: its open turns are recorded (``client_aborted`` when the client
        closed it, else ``truncated``)."""
        sock = self._sockets.sockets.get(flow.id)
        if sock is None:
            return
        try:
            ws = flow.websocket
            self._sockets.end(sock, ws.closed_by_client if ws is not None else None, time.time())
        except Exception:
            self._hook_failed("websocket_end")
            self._sockets.fail(sock, "websocket_end", time.time())

    def _is_llm_host(self, flow: http.HTTPFlow) -> bool:
        """The request goes to an LLM host: its connection's host (or the ``Host`` it names)
        at its port is on the list."""
        req = flow.request
        if self._hosts.matches(req.host, req.port):
            return True
        named = req.pretty_host
        return named != req.host and self._hosts.matches(named, req.port)

    def _track(self, flow: http.HTTPFlow, state: FlowState) -> None:
        stamp_sender(state.exchange, self._sender(flow))
        flow.metadata[METADATA_KEY] = state
        self._flows.track(flow.id, state)

    def _sender(self, flow: http.HTTPFlow) -> dict[str, str | None]:
        """Who sent ``flow`` (``observer.capture.sender``); on a failure of ours, nobody known
        (logged once): the flow is still observed."""
        try:
            return sender_of(flow, self._fingerprint_key, self._settings.client_address)
        except Exception:  # noqa: BLE001
            self._hook_failed("sender")
            return {"client_address": None, "proxy_user": None, "key_fingerprint": None, "last_event_id": None}

    def _response_holders(self) -> tuple[Dialect, ...]:
        """The registry's dialects that may claim a request by its response
        (``capture.held.holders``), found once per registry."""
        registry = self._registry
        if self._holders[0] is not registry:
            self._holders = (registry, holders(tuple(registry.get(n) for n in registry.names)))
        return self._holders[1]

    def _pop(self, flow: http.HTTPFlow) -> FlowState | None:
        """The flow's state, unless it is not observed or was already finished (a body still
        held for it is dropped)."""
        self._held.release(flow.id)
        self._flows.untrack(flow.id)
        state = flow.metadata.pop(METADATA_KEY, None)
        return None if state is None or state.finished else state

    def _hook_failed(self, hook: str) -> None:
        self.hook_errors += 1
        log.error("observer: %s hook failed; the flow passes through unobserved", hook, exc_info=True)


def _listen_ports() -> frozenset[int]:
    """The ports the running proxy listens on (mitmproxy's proxyserver), or none known."""
    try:
        server = ctx.master.addons.get("proxyserver")
        return frozenset(int(addr[1]) for addr in server.listen_addrs())
    except Exception:
        return frozenset()


def _peer(client: object) -> str:
    try:
        host, port = client[:2]  # type: ignore[index]
        return f"{host}:{port}"
    except Exception:
        return "a client"


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


def _new_state(flow: http.HTTPFlow, dialect: Dialect, view: RequestView) -> FlowState:
    """A new observed flow: its record skeleton, with the credential values of its URL query and
    headers kept (in memory) to scrub echoes of them."""
    req = flow.request
    removed = header_secrets(view.headers)
    ex = skeleton(
        dialect,
        scheme=req.scheme,
        host=req.host,
        port=req.port,
        path=req.path,
        method=req.method,
        http_version=req.http_version,
        started_at_s=req.timestamp_start or time.time(),
        removed=removed,
        record_id=flow_record_id(flow.id),
    )
    return FlowState(dialect, ex, view, flow.client_conn.id, envelope_secrets=removed)


def _trailers(response: http.Response) -> tuple[tuple[str, str], ...]:
    """``StreamEnd.trailers``: the response's HTTP trailers, or, when it has none, its
    ``grpc-status`` / ``grpc-message`` headers (gRPC's trailers-only response, grpc
    ``doc/PROTOCOL-HTTP2.md``), else ``()``."""
    if response.trailers:
        return tuple(response.trailers.items(multi=True))
    return tuple((k, v) for k, v in response.headers.items(multi=True) if k.lower() in _GRPC_STATUS_FIELDS)


def _rereader(tap: RequestTap, dialect: Dialect, view: RequestView, encoding: str | None, limits: Limits):
    """``FlowState.reread``: the request body as received by ``until_s`` (epoch seconds), read
    again (a multi-turn stream's later turn; ``observer.capture.flows``); an upload that outgrew
    its copy gives no facts and its ``oversize_request``."""

    def reread(until_s: float | None) -> RequestRead:
        body = tap.body(until_s)
        if body is None:
            return RequestRead(None, [tap.overflow(limits)], body_bytes=tap.total_bytes)
        return read_request(dialect, view, body, encoding, limits)

    return reread


def _legacy_spool(path: Path) -> list[Exchange]:
    """The records a version before the journal left in its spool (``DATA_DIR/spool.jsonl``),
    read once: the file is renamed ``*.imported`` after (unreadable lines are logged)."""
    from observer.store.store import exchange_from_dict

    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(exchange_from_dict(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            log.error("observer: %s line %d cannot be read; it stays in %s.imported", path, n, path.name)
    path.rename(path.with_name(path.name + ".imported"))
    log.warning("observer: %d records of the old spool %s go to the journal", len(records), path)
    return records


def _freeze_startup_heap() -> None:
    """Collects once, then moves every surviving object to the permanent generation
    (``gc.freeze``, Python docs "gc"): the process's start-up heap (mitmproxy, SQLAlchemy's
    metadata, the dialect tables: long-lived by nature) is then never scanned again by a full
    collection, which under load paused every stream (docs/performance.md, "gc.freeze")."""
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


__all__ = ["FINISH_DELAY_S", "METADATA_KEY", "LLMAudit", "end_cause_from_error"]
