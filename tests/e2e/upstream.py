"""A local streaming "LLM upstream" for the end-to-end tests and the latency bench.

One asyncio server on 127.0.0.1 with two listeners:

- plain HTTP/1.1 (h11);
- TLS with ALPN ``h2`` / ``http/1.1`` (HTTP/2 via the ``h2`` library, HTTP/1.1 via h11), using a
  throw-away CA + leaf certificate for ``127.0.0.1`` / ``localhost`` generated at start
  (``ca_cert_path`` is the file a direct client trusts; a proxy needs ``ssl_insecure``).

Runs in a background thread of the test process (``UpstreamServer().start()``), so the send
times it records (``time.monotonic()``) share the client's clock, or as a script for the bench::

    python tests/e2e/upstream.py --port 0 --tls-port 0
    -> {"http_port": 40123, "https_port": 40124, "ca_cert": "/tmp/.../ca.pem"}   (one JSON line)

Endpoints (POST; the request body is recorded as received):

``/v1/stream``
    Replays a scripted list of SSE events (``event: <type>\\ndata: <compact JSON>\\n\\n``), one
    event per HTTP/1.1 chunk / HTTP/2 DATA frame, ``gap_ms`` (default 200) apart. Query
    parameters (or ``x-upstream-<name>`` request headers):

    - ``script``: ``complete_example`` (draft §5.5, default), ``tool_flow`` (draft §4.8 Response 1
      made complete), ``long`` (``n`` deltas of ~300 bytes, each with ``"x-bench:sent":
      time.time()`` taken just before it is written);
    - ``gzip=1``: ``Content-Encoding: gzip``, one compressor per response, ``Z_SYNC_FLUSH`` after
      every event (the ``Z_FINISH`` tail goes out as one last chunk);
    - ``abort_after=N``: after N events (and one more gap) abort: HTTP/1.1 closes the TCP
      connection without the chunked terminator, HTTP/2 sends RST_STREAM(INTERNAL_ERROR)
      (``abort_mode=close``: HTTP/2 drops the TCP connection instead);
    - ``status=429`` (any non-200): a JSON error body instead of the stream;
    - ``hold_s=S`` (with ``hold_at=I``, default 0): stall S seconds before event I;
    - ``tid=...`` (or header ``x-test-id``): a key under which the exchange is filed;
    - ``stamp=all`` (``long`` only): every event carries ``"x-bench:sent"``, not only the deltas
      (stream.start, content.stop, usage and stream.end too: their promptness is measured).

``/v1/bulk`` (bench)
    ``bytes`` (default 20 MB) of a ``long``-like stream without gaps: stream.start, content
    deltas of ~300 bytes, content.stop, usage, stream.end; still one event per HTTP/1.1 chunk /
    HTTP/2 DATA frame, but many chunks per socket write (events are pre-rendered) so the
    upstream is not the bottleneck of a throughput test.

``/v1/bench/exchange?of=<tid>`` (GET, bench)
    The send times of the exchange filed under ``tid``: ``{"send_wall": [...], "end_wall": t,
    "completed": bool, "events": n}`` (``end_wall`` = ``time.time()`` just before the end of the
    body -- HTTP/1.1 terminator, HTTP/2 END_STREAM -- was written).

``/v1/json``
    A plain, non-streaming JSON answer (``Content-Length``).

For every request the server keeps an ``UpstreamExchange``: the request as received, the
response status/headers, per event the uncompressed event bytes, the monotonic and wall send
times and the cumulative raw-body offset after it, every raw body chunk as written (content
encoded, without HTTP/1.1 chunk framing) -- what a client reading the raw body must receive --
and the wall time just before the end of the body was written (``end_wall``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as dt
import ipaddress
import json
import os
import signal
import ssl
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h11

REQUEST_ID = "550e8400-e29b-41d4-a716-446655440000"
MODEL = "example-model"
CREATED = 1749292800
COMPLETE_TEXT = "The weather in Vienna is 24C and sunny."
TOOL_ARGUMENTS = '{"city":"Vienna"}'
DEFAULT_GAP_MS = 200.0
ERROR_BODY = {"error": {"type": "rate_limit_error", "code": "rate_limited", "message": "Too many requests, slow down."}}
JSON_ANSWER = {"object": "answer", "model": MODEL, "text": "plain JSON, not a stream"}


# --------------------------------------------------------------------------------------------
# scripts


def compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def render_event(envelope: dict[str, Any]) -> bytes:
    """One SSE event: ``event: <type>`` + ``data: <compact JSON>`` + blank line."""
    return f"event: {envelope['type']}\ndata: {compact(envelope)}\n\n".encode()


def script_complete_example(request_id: str = REQUEST_ID) -> list[dict[str, Any]]:
    """Draft §5.5 "Complete Example", event for event (the draft's elided ``"550e8400-..."`` is
    the full request id of §4.6)."""
    ev: list[dict[str, Any]] = [
        {"v": "1.0", "seq": 0, "type": "stream.start", "request_id": request_id, "model": MODEL, "created": CREATED}
    ]
    for seq, text in enumerate(["The", " weather", " in Vienna", " is 24C and sunny."], start=1):
        ev.append(
            {"v": "1.0", "seq": seq, "type": "content.delta", "index": 0, "role": "assistant", "delta": {"text": text}}
        )
    ev.append({"v": "1.0", "seq": 5, "type": "content.stop", "index": 0, "stop_reason": "end_turn"})
    ev.append({"v": "1.0", "seq": 6, "type": "usage", "input_tokens": 42, "output_tokens": 8})
    ev.append({"v": "1.0", "seq": 7, "type": "stream.end", "request_id": request_id})
    return ev


def script_tool_flow(request_id: str = REQUEST_ID) -> list[dict[str, Any]]:
    """Draft §4.8 Response 1, made a complete stream (stream.start ... stream.end, v/seq/index)."""
    return [
        {"v": "1.0", "seq": 0, "type": "stream.start", "request_id": request_id, "model": MODEL, "created": CREATED},
        {
            "v": "1.0",
            "seq": 1,
            "type": "tool.call",
            "index": 0,
            "id": "call_1",
            "name": "get_weather",
            "arguments": TOOL_ARGUMENTS,
        },
        {"v": "1.0", "seq": 2, "type": "content.stop", "index": 0, "stop_reason": "tool_use"},
        {"v": "1.0", "seq": 3, "type": "usage", "input_tokens": 57, "output_tokens": 12},
        {"v": "1.0", "seq": 4, "type": "stream.end", "request_id": request_id},
    ]


LONG_FILLER = " lorem ipsum dolor sit amet" * 6  # 162 chars -> ~300-byte events


def script_long(n: int, request_id: str = REQUEST_ID, stamp_all: bool = False) -> list[dict[str, Any]]:
    """``n`` content deltas of ~300 bytes; ``"x-bench:sent"`` is filled with ``time.time()``
    just before the event is written (the draft says parsers ignore unknown fields). With
    ``stamp_all`` every event carries it, not only the deltas."""
    ev: list[dict[str, Any]] = [
        {"v": "1.0", "seq": 0, "type": "stream.start", "request_id": request_id, "model": MODEL, "created": CREATED}
    ]
    for i in range(n):
        ev.append(
            {
                "v": "1.0",
                "seq": i + 1,
                "type": "content.delta",
                "index": 0,
                "role": "assistant",
                "delta": {"text": f" t{i:05d}" + LONG_FILLER[:140]},
                "x-bench:sent": None,
            }
        )
    ev.append({"v": "1.0", "seq": n + 1, "type": "content.stop", "index": 0, "stop_reason": "end_turn"})
    ev.append({"v": "1.0", "seq": n + 2, "type": "usage", "input_tokens": 10, "output_tokens": n})
    ev.append({"v": "1.0", "seq": n + 3, "type": "stream.end", "request_id": request_id})
    if stamp_all:
        for e in ev:
            e.setdefault("x-bench:sent", None)
    return ev


def build_script(name: str, params: dict[str, str]) -> list[dict[str, Any]]:
    rid = params.get("request_id", REQUEST_ID)
    if name == "complete_example":
        return script_complete_example(rid)
    if name == "tool_flow":
        return script_tool_flow(rid)
    if name == "long":
        return script_long(int(params.get("n", "200")), rid, stamp_all=params.get("stamp") == "all")
    raise KeyError(name)


def expected_body(script: str = "complete_example", **params: str) -> bytes:
    """The uncompressed SSE body a script produces (not for ``long``, whose events carry times)."""
    return b"".join(render_event(e) for e in build_script(script, dict(params)))


# --------------------------------------------------------------------------------------------
# exchange log


async def send_event(w: Any, ex: UpstreamExchange, event: bytes, payload: bytes) -> None:
    """Logs one event (its bytes, send times, raw-body end offset) in ``ex`` and writes its
    ``payload`` (the event as it goes on the wire, e.g. gzip-flushed) at once, flushed."""
    ex.events.append(event)
    ex.raw_chunks.append(payload)
    ex.event_end_offsets.append((ex.event_end_offsets[-1] if ex.event_end_offsets else 0) + len(payload))
    ex.send_wall.append(time.time())
    ex.send_times.append(time.monotonic())
    try:
        w.write_data_nowait(payload)
    except BlockingIOError:
        await w.send_data_blocking(payload)
    await w.flush()


@dataclass
class UpstreamExchange:
    """What the upstream received and sent for one request."""

    tid: str | None
    method: str
    target: str
    path: str
    query: dict[str, str]
    headers: list[tuple[str, str]]
    http_version: str  # "HTTP/1.1" or "HTTP/2"
    tls: bool
    body: bytes = b""
    status: int | None = None
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)  # uncompressed event bytes as rendered
    send_times: list[float] = field(default_factory=list)  # time.monotonic() just before writing event i
    send_wall: list[float] = field(default_factory=list)  # time.time() at the same moment
    event_end_offsets: list[int] = field(default_factory=list)  # raw body length once event i is written
    raw_chunks: list[bytes] = field(default_factory=list)  # raw body as written (encoded, de-chunked)
    end_wall: float | None = None  # time.time() just before the end of the body was written
    aborted: bool = False  # the server aborted the response on purpose (abort_after)
    completed: bool = False  # the server wrote the whole response and its end
    error: str | None = None  # the write failed (e.g. the peer went away)
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def raw_body(self) -> bytes:
        return b"".join(self.raw_chunks)

    def header(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body)


class _PeerGone(Exception):
    pass


# --------------------------------------------------------------------------------------------
# certificates


def make_certs(directory: str) -> tuple[str, str, str]:
    """Writes a throw-away CA and a leaf for 127.0.0.1/localhost; returns (ca, cert, key) paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "e2e upstream test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path = os.path.join(directory, "upstream-ca.pem")
    cert_path = os.path.join(directory, "upstream-cert.pem")
    key_path = os.path.join(directory, "upstream-key.pem")
    with open(ca_path, "wb") as f:
        f.write(ca_cert.public_bytes(serialization.Encoding.PEM))
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    return ca_path, cert_path, key_path


# --------------------------------------------------------------------------------------------
# protocol writers


class _H1Writer:
    def __init__(self, conn: h11.Connection, writer: asyncio.StreamWriter):
        self.conn = conn
        self.writer = writer
        self.closed = False

    async def _write(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise _PeerGone("connection closed")
        self.writer.write(data)
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as e:
            raise _PeerGone(repr(e)) from e

    async def send_headers(self, status: int, headers: list[tuple[str, str]]) -> None:
        await self._write(self.conn.send(h11.Response(status_code=status, headers=headers)))

    def write_data_nowait(self, data: bytes) -> None:
        if self.writer.is_closing():
            raise _PeerGone("connection closed")
        self.writer.write(self.conn.send(h11.Data(data=data)))

    async def flush(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as e:
            raise _PeerGone(repr(e)) from e

    async def send_many(self, chunks: list[bytes]) -> None:
        """One HTTP/1.1 chunk per element, all in one socket write, then drain."""
        send = self.conn.send
        await self._write(b"".join(send(h11.Data(data=c)) for c in chunks))

    async def end(self) -> None:
        await self._write(self.conn.send(h11.EndOfMessage()))

    async def abort(self, mode: str = "close") -> None:
        # Close the TCP connection without the chunked terminator.
        self.closed = True
        self.writer.transport.abort()


class _H2Stream:
    def __init__(self, proto: _H2Protocol, stream_id: int):
        self.proto = proto
        self.sid = stream_id
        self.reset = False
        self.closed = False

    async def send_headers(self, status: int, headers: list[tuple[str, str]]) -> None:
        hdrs = [(":status", str(status))] + [
            (k.lower(), v) for k, v in headers if k.lower() not in ("transfer-encoding", "connection")
        ]
        self._check()
        self.proto.conn.send_headers(self.sid, hdrs)
        await self.proto.flush()

    def _check(self) -> None:
        if self.reset or self.proto.gone:
            raise _PeerGone("stream reset or connection gone")

    def write_data_nowait(self, data: bytes) -> None:
        # Events are small: they fit the window (mitmproxy opens it to 2^31-1) and one frame.
        self._check()
        conn = self.proto.conn
        if len(data) > min(conn.local_flow_control_window(self.sid), conn.max_outbound_frame_size):
            raise BlockingIOError
        conn.send_data(self.sid, data)
        self.proto.writer.write(conn.data_to_send())

    async def send_data_blocking(self, data: bytes) -> None:
        conn = self.proto.conn
        while data:
            self._check()
            room = min(conn.local_flow_control_window(self.sid), conn.max_outbound_frame_size)
            if room <= 0:
                self.proto.window_open.clear()
                await self.proto.window_open.wait()
                continue
            conn.send_data(self.sid, data[:room])
            data = data[room:]
            await self.proto.flush()

    async def flush(self) -> None:
        await self.proto.flush()

    async def send_many(self, chunks: list[bytes]) -> None:
        """One DATA frame per element (waiting for window when needed), then one flush."""
        conn = self.proto.conn
        for c in chunks:
            self._check()
            if len(c) <= min(conn.local_flow_control_window(self.sid), conn.max_outbound_frame_size):
                conn.send_data(self.sid, c)
            else:
                await self.send_data_blocking(c)
        await self.proto.flush()

    async def end(self) -> None:
        self._check()
        self.proto.conn.end_stream(self.sid)
        await self.proto.flush()

    async def abort(self, mode: str = "rst") -> None:
        """``rst``: RST_STREAM(INTERNAL_ERROR); ``close``: drop the whole TCP connection."""
        self.closed = True
        if mode == "close":
            self.proto.gone = True
            self.proto.writer.transport.abort()
            return
        self._check()
        self.proto.conn.reset_stream(self.sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        await self.proto.flush()


class _H2Protocol:
    def __init__(self, server: UpstreamServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        self.window_open = asyncio.Event()
        self.gone = False
        self.streams: dict[int, _H2Stream] = {}
        self.requests: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        self.tasks: set[asyncio.Task] = set()

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)
        try:
            await self.writer.drain()
        except (ConnectionError, OSError) as e:
            self.gone = True
            raise _PeerGone(repr(e)) from e

    async def run(self) -> None:
        self.conn.initiate_connection()
        try:
            await self.flush()
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    break
                for ev in events:
                    self._on_event(ev)
                await self.flush()
        except (_PeerGone, ConnectionError, OSError):
            pass
        finally:
            self.gone = True
            self.window_open.set()
            for s in self.streams.values():
                s.reset = True
            self.writer.close()

    def _on_event(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.RequestReceived):
            self.requests[ev.stream_id] = (list(ev.headers), bytearray())
            if ev.stream_ended is not None:
                self._start(ev.stream_id)
        elif isinstance(ev, h2.events.DataReceived):
            req = self.requests.get(ev.stream_id)
            if req is not None:
                req[1].extend(ev.data)
            self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if ev.stream_ended is not None:
                self._start(ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            self._start(ev.stream_id)
        elif isinstance(ev, h2.events.WindowUpdated):
            self.window_open.set()
        elif isinstance(ev, h2.events.StreamReset):
            s = self.streams.get(ev.stream_id)
            if s is not None:
                s.reset = True
            self.window_open.set()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.gone = True
            self.window_open.set()

    def _start(self, sid: int) -> None:
        if sid in self.streams or sid not in self.requests:
            return
        headers, body = self.requests.pop(sid)
        pseudo = {k: v for k, v in headers if k.startswith(":")}
        regular = [(k, v) for k, v in headers if not k.startswith(":")]
        stream = _H2Stream(self, sid)
        self.streams[sid] = stream
        ex = self.server._new_exchange(
            pseudo.get(":method", "GET"), pseudo.get(":path", "/"), regular, bytes(body), "HTTP/2", True
        )
        t = asyncio.ensure_future(self.server._respond_guarded(ex, stream))
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)


# --------------------------------------------------------------------------------------------
# server


class UpstreamServer:
    """The upstream; ``start()`` runs it on its own event loop in a daemon thread."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, tls_port: int = 0, cert_dir: str | None = None, keep: int = 10000
    ):
        self.host = host
        self._want_port = port
        self._want_tls_port = tls_port
        self._tmp = None
        if cert_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="e2e-upstream-")
            cert_dir = self._tmp.name
        self.ca_cert_path, self._cert_path, self._key_path = make_certs(cert_dir)
        self.http_port: int = 0
        self.https_port: int = 0
        self._lock = threading.Lock()
        self.exchanges: collections.deque[UpstreamExchange] = collections.deque(maxlen=keep)
        self._by_tid: dict[str, UpstreamExchange] = {}
        self._new = threading.Condition(self._lock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.AbstractServer] = []
        self._conn_tasks: set[asyncio.Task] = set()

    # ---- lifecycle

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self._cert_path, self._key_path)
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx

    async def start_async(self) -> None:
        self._loop = asyncio.get_running_loop()
        plain = await asyncio.start_server(self._on_plain, self.host, self._want_port)
        tls = await asyncio.start_server(self._on_tls, self.host, self._want_tls_port, ssl=self.ssl_context())
        self._servers = [plain, tls]
        self.http_port = plain.sockets[0].getsockname()[1]
        self.https_port = tls.sockets[0].getsockname()[1]

    async def stop_async(self) -> None:
        for s in self._servers:
            s.close()
        for t in list(self._conn_tasks):
            t.cancel()
        for s in self._servers:
            try:
                await asyncio.wait_for(s.wait_closed(), 2)
            except (TimeoutError, Exception):
                pass

    def start(self, timeout: float = 10.0) -> UpstreamServer:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as e:  # noqa: BLE001 - reported to the starter
                failure.append(e)
                started.set()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self.stop_async())
                loop.close()

        self._thread = threading.Thread(target=run, name="e2e-upstream", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise RuntimeError("upstream did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> UpstreamServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers for tests

    def url(self, path: str, tls: bool = False, host: str | None = None) -> str:
        h = host or self.host
        return f"https://{h}:{self.https_port}{path}" if tls else f"http://{h}:{self.http_port}{path}"

    def get(self, tid: str) -> UpstreamExchange | None:
        with self._lock:
            return self._by_tid.get(tid)

    def wait_exchange(self, tid: str, timeout: float = 10.0, finished: bool = True) -> UpstreamExchange:
        """The exchange filed under ``tid``; with ``finished``, once the response is over."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while tid not in self._by_tid:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"upstream never received a request with tid={tid}")
                self._new.wait(left)
            ex = self._by_tid[tid]
        if finished and not ex.done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"upstream response for tid={tid} did not finish")
        return ex

    # ---- connection handling

    def _track(self) -> None:
        t = asyncio.current_task()
        if t is not None:
            self._conn_tasks.add(t)
            t.add_done_callback(self._conn_tasks.discard)

    async def _on_plain(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        try:
            await self._serve_h1(reader, writer, tls=False)
        finally:
            writer.close()

    async def _on_tls(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._track()
        try:
            sslobj = writer.get_extra_info("ssl_object")
            alpn = sslobj.selected_alpn_protocol() if sslobj is not None else None
            if alpn == "h2":
                await _H2Protocol(self, reader, writer).run()
            else:
                await self._serve_h1(reader, writer, tls=True)
        finally:
            writer.close()

    async def _serve_h1(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, tls: bool) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                req: h11.Request | None = None
                body = bytearray()
                while True:
                    ev = conn.next_event()
                    if ev is h11.NEED_DATA:
                        data = await reader.read(65536)
                        conn.receive_data(data)
                        continue
                    if isinstance(ev, h11.Request):
                        req = ev
                    elif isinstance(ev, h11.Data):
                        body.extend(ev.data)
                    elif isinstance(ev, h11.EndOfMessage):
                        break
                    elif isinstance(ev, h11.ConnectionClosed) or ev is h11.PAUSED:
                        return
                assert req is not None
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in req.headers]
                ex = self._new_exchange(
                    req.method.decode(), req.target.decode("latin-1"), headers, bytes(body), "HTTP/1.1", tls
                )
                w = _H1Writer(conn, writer)
                await self._respond_guarded(ex, w)
                if w.closed or ex.error is not None or conn.our_state is not h11.DONE:
                    return
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    return
        except (h11.RemoteProtocolError, ConnectionError, OSError):
            return

    def _new_exchange(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes, http_version: str, tls: bool
    ) -> UpstreamExchange:
        parts = urlsplit(target)
        path = parts.path
        if not path.startswith("/"):  # absolute-form (should not reach an origin server, but be lenient)
            path = "/" + path
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        for k, v in headers:
            lk = k.lower()
            if lk.startswith("x-upstream-"):
                query.setdefault(lk[len("x-upstream-") :].replace("-", "_"), v)
        tid = query.get("tid")
        for k, v in headers:
            if k.lower() == "x-test-id":
                tid = tid or v
        ex = UpstreamExchange(
            tid=tid,
            method=method,
            target=target,
            path=path,
            query=query,
            headers=headers,
            http_version=http_version,
            tls=tls,
            body=body,
        )
        with self._lock:
            self.exchanges.append(ex)
            if tid is not None:
                self._by_tid[tid] = ex
            self._new.notify_all()
        return ex

    async def _respond_guarded(self, ex: UpstreamExchange, w: Any) -> None:
        try:
            await self._respond(ex, w)
        except _PeerGone as e:
            ex.error = f"peer gone: {e}"
        except asyncio.CancelledError:
            ex.error = "cancelled"
            raise
        except Exception as e:  # noqa: BLE001 - a test server: record and close
            ex.error = f"server error: {e!r}"
            try:
                await w.abort()
            except Exception:  # noqa: BLE001
                pass
        finally:
            ex.done.set()

    # ---- the endpoints

    async def _send_simple(self, ex: UpstreamExchange, w: Any, status: int, obj: Any) -> None:
        payload = json.dumps(obj).encode()
        headers = [("content-type", "application/json"), ("content-length", str(len(payload)))]
        ex.status, ex.response_headers = status, headers
        await w.send_headers(status, headers)
        ex.raw_chunks.append(payload)
        w.write_data_nowait(payload)
        await w.flush()
        await w.end()
        ex.completed = True

    def _bench_times(self, tid: str) -> dict[str, Any]:
        with self._lock:
            ex = self._by_tid.get(tid)
        if ex is None:
            return {"error": f"no exchange {tid!r}"}
        return {
            "send_wall": list(ex.send_wall),
            "end_wall": ex.end_wall,
            "completed": ex.completed,
            "events": len(ex.events),
        }

    async def _respond_bulk(self, ex: UpstreamExchange, w: Any, total_bytes: int) -> None:
        """``total_bytes`` of SSE without gaps, one event per chunk/frame, ~64 KB per socket
        write. Only the first send time and ``end_wall`` are logged (not every event)."""
        rid = REQUEST_ID
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        if ex.http_version == "HTTP/1.1":
            headers.append(("transfer-encoding", "chunked"))
        ex.status, ex.response_headers = 200, headers
        await w.send_headers(200, headers)
        text = LONG_FILLER[:140]
        head = render_event(
            {"v": "1.0", "seq": 0, "type": "stream.start", "request_id": rid, "model": MODEL, "created": CREATED}
        )
        # A delta with its seq as the only varying part (rendered by string formatting, not json).
        proto = render_event(
            {
                "v": "1.0",
                "seq": 999999999,
                "type": "content.delta",
                "index": 0,
                "role": "assistant",
                "delta": {"text": " t" + text},
            }
        ).decode()
        pre, post = proto.split("999999999")
        n = max(1, total_bytes // len(proto))
        ex.send_wall.append(time.time())
        ex.send_times.append(time.monotonic())
        batch: list[bytes] = [head]
        size = len(head)
        for i in range(1, n + 1):
            ev = f"{pre}{i}{post}".encode()
            batch.append(ev)
            size += len(ev)
            if size >= 65536:
                await w.send_many(batch)
                batch, size = [], 0
        for e in (
            {"v": "1.0", "seq": n + 1, "type": "content.stop", "index": 0, "stop_reason": "end_turn"},
            {"v": "1.0", "seq": n + 2, "type": "usage", "input_tokens": 10, "output_tokens": n},
            {"v": "1.0", "seq": n + 3, "type": "stream.end", "request_id": rid},
        ):
            batch.append(render_event(e))
        await w.send_many(batch)
        ex.events.append(b"")  # the count is not kept per event for bulk: one marker
        ex.end_wall = time.time()
        await w.end()
        ex.completed = True

    async def _respond(self, ex: UpstreamExchange, w: Any) -> None:
        p = ex.query
        if ex.path == "/v1/json":
            await self._send_simple(ex, w, 200, JSON_ANSWER)
            return
        if ex.path == "/v1/bench/exchange":
            await self._send_simple(ex, w, 200, self._bench_times(p.get("of", "")))
            return
        if ex.path == "/v1/bulk":
            await self._respond_bulk(ex, w, int(p.get("bytes", str(20 << 20))))
            return
        if ex.path != "/v1/stream":
            await self._send_simple(ex, w, 404, {"error": {"type": "not_found", "message": ex.path}})
            return
        status = int(p.get("status", "200"))
        if status != 200:
            await self._send_simple(ex, w, status, ERROR_BODY)
            return
        try:
            events = build_script(p.get("script", "complete_example"), p)
        except KeyError:
            await self._send_simple(ex, w, 400, {"error": {"type": "bad_script", "message": p.get("script")}})
            return
        gap = float(p.get("gap_ms", DEFAULT_GAP_MS)) / 1000.0
        use_gzip = p.get("gzip", "0").lower() in ("1", "true", "yes")
        abort_after = int(p["abort_after"]) if "abort_after" in p else None
        abort_mode = p.get("abort_mode", "rst" if ex.http_version == "HTTP/2" else "close")
        hold_s = float(p.get("hold_s", "0"))
        hold_at = int(p.get("hold_at", "0"))
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        if use_gzip:
            headers.append(("content-encoding", "gzip"))
        if ex.http_version == "HTTP/1.1":
            headers.append(("transfer-encoding", "chunked"))
        ex.status, ex.response_headers = 200, headers
        await w.send_headers(200, headers)
        comp = zlib.compressobj(6, zlib.DEFLATED, 31) if use_gzip else None
        for i, env in enumerate(events):
            if hold_s > 0 and i == hold_at:
                await asyncio.sleep(hold_s)
            elif i > 0 and gap > 0:
                await asyncio.sleep(gap)
            if abort_after is not None and i >= abort_after:
                ex.aborted = True
                await w.abort(abort_mode)
                return
            if "x-bench:sent" in env:
                env = dict(env)
                env["x-bench:sent"] = time.time()
            data = render_event(env)
            payload = comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH) if comp is not None else data
            await send_event(w, ex, data, payload)
        if abort_after is not None and abort_after >= len(events):
            await asyncio.sleep(gap)
            ex.aborted = True
            await w.abort(abort_mode)
            return
        if comp is not None:
            tail = comp.flush(zlib.Z_FINISH)
            if tail:
                ex.raw_chunks.append(tail)
                try:
                    w.write_data_nowait(tail)
                except BlockingIOError:
                    await w.send_data_blocking(tail)
                await w.flush()
        ex.end_wall = time.time()
        await w.end()
        ex.completed = True


# --------------------------------------------------------------------------------------------
# script mode


async def _main_async(args: argparse.Namespace) -> None:
    server = UpstreamServer(args.host, args.port, args.tls_port, keep=200)
    await server.start_async()
    print(
        json.dumps({"http_port": server.http_port, "https_port": server.https_port, "ca_cert": server.ca_cert_path}),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if args.exit_on_stdin_eof:
        loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.buffer.read1(4096) or stop.set())  # type: ignore[func-returns-value]
    try:
        await stop.wait()
    finally:
        await server.stop_async()
        if server._tmp is not None:
            server._tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="plain HTTP/1.1 port (0 = any free)")
    ap.add_argument("--tls-port", type=int, default=0, help="TLS port, ALPN h2/http1.1 (0 = any free)")
    ap.add_argument("--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (parent died)")
    args = ap.parse_args(argv)
    asyncio.run(_main_async(args))


if __name__ == "__main__":
    main()
