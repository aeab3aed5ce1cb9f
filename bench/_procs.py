"""Process and client harness shared by the proxy benchmarks (latency, load, bulk, and later
memory / scale-out): the upstream subprocess, the two proxies under comparison, and a light
raw-asyncio SSE client for HTTP/1.1, HTTP/1.1 inside CONNECT+TLS and HTTP/2 inside CONNECT+TLS.

Processes (all bound to 127.0.0.1 on free ports, each in its own session; ``stop()`` ends the
whole process group, SIGTERM then SIGKILL, so nothing outlives the bench):

- ``Upstream``: ``tests/e2e/upstream.py`` as a subprocess (its own GIL). Streams carry
  ``"x-bench:sent": time.time()`` per event; ``/v1/bench/exchange?of=<tid>`` returns the send
  times and ``end_wall`` (just before the end of the body was written); ``/v1/bulk`` streams
  many MB without gaps.
- ``start_proxy(kind, workdir)``: ``mitmdump`` with ``bench/passthrough_addon.py``
  (``"baseline"``: streaming on, no work) or ``addons/llm_audit.py`` with a SQLite store
  (``"addon"``: the product). Returns a started ``tests.e2e.harness.MitmdumpProcess``.

Client (``fetch_sse``): one request per fresh connection, written against ``asyncio`` streams
with a hand-written HTTP/1.1 chunked decoder and the ``h2`` library for HTTP/2, so 100 concurrent
streams cost the client little CPU (httpx costs several times more per event). Every read is
timestamped with ``time.time()`` (epoch seconds, the upstream's clock: same host). SSE events
are split on blank lines; ``"x-bench:sent"`` is found by a byte search, not ``json.loads``.

Transports (``TRANSPORTS``): ``h1`` (absolute-form request through the proxy, plain),
``h1-tls`` (CONNECT, then TLS to the proxy's minted certificate, ALPN ``http/1.1``) and
``h2-tls`` (CONNECT, then TLS with ALPN ``h2``). Without a proxy the client talks to the
upstream directly (``direct``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.e2e.harness import MitmdumpProcess  # noqa: E402

TRANSPORTS = ("h1", "h1-tls", "h2-tls")
LLM_CONTENT_TYPE = "application/llm-request+json"
REQUEST_ID = "550e8400-e29b-41d4-a716-446655440000"
_STAMP = b'"x-bench:sent":'


def llm_request(n: int) -> bytes:
    """A small draft-standard request body (``application/llm-request+json``) asking for ``n``
    tokens: what the addon classifies, parses and records."""
    return json.dumps(
        {
            "version": "1.0",
            "model": "example-model",
            "stream": True,
            "messages": [{"role": "user", "content": f"Write {n} tokens."}],
            "metadata": {"request_id": REQUEST_ID, "session_id": "bench"},
        }
    ).encode()


# --------------------------------------------------------------------------------------------
# processes


class Upstream:
    """``tests/e2e/upstream.py`` in its own process and session. ``http_port`` (plain HTTP/1.1),
    ``https_port`` (TLS, ALPN h2/http1.1) and ``ca_cert`` (the CA a direct TLS client trusts)
    are set by ``start()``. A context manager; ``stop()`` closes its stdin (it exits on EOF),
    then SIGTERM / SIGKILL to its process group."""

    def __init__(self, workdir: Path):
        self.log_path = Path(workdir) / "upstream.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = self.https_port = 0
        self.ca_cert = ""

    def command(self) -> list[str]:
        """The upstream's command line; it must print one JSON line with ``http_port`` (and
        ``https_port``/``ca_cert`` if it serves TLS) and exit when its stdin closes."""
        return [
            sys.executable,
            str(REPO / "tests" / "e2e" / "upstream.py"),
            "--port",
            "0",
            "--tls-port",
            "0",
            "--exit-on-stdin-eof",
        ]

    def start(self, timeout: float = 20.0) -> Upstream:
        """Starts it and waits (at most ``timeout`` seconds) for its port line."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=str(REPO),
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            raise RuntimeError(f"upstream did not start; log:\n{self.log_path.read_text(errors='replace')}")
        info = json.loads(line)
        self.http_port, self.https_port, self.ca_cert = (
            info["http_port"],
            info.get("https_port", 0),
            info.get("ca_cert", ""),
        )
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        """Ends the upstream and its process group (bounded: ~15 s at worst)."""
        p = self.proc
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(Exception):
                assert p.stdin is not None
                p.stdin.close()  # --exit-on-stdin-eof
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)  # stragglers of the group

    def __enter__(self) -> Upstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


PROXY_KINDS = ("baseline", "addon")


def start_proxy(
    kind: str,
    workdir: Path,
    *,
    db_path: Path | None = None,
    addon: str = "addons/llm_audit.py",
    sets: dict[str, str] | None = None,
    addon_sets: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> MitmdumpProcess:
    """A started ``mitmdump -q`` on a free 127.0.0.1 port with its own confdir under ``workdir``.

    ``kind="baseline"``: ``bench/passthrough_addon.py`` (``flow.response.stream = True``, nothing
    else). ``kind="addon"``: ``addon`` (relative to the repo) with
    ``observer_db=sqlite:///<db_path>`` (default ``<workdir>/bench.db``). ``sets`` are mitmproxy
    options for both kinds, ``addon_sets`` options for the addon only. Raises RuntimeError
    (with the log tail) when it does not start."""
    workdir = Path(workdir)
    if kind == "baseline":
        p = MitmdumpProcess(REPO / "bench" / "passthrough_addon.py", sets=sets, workdir=str(workdir / "baseline"))
    elif kind == "addon":
        db = db_path or workdir / "bench.db"
        p = MitmdumpProcess(
            REPO / addon,
            sets={"observer_db": f"sqlite:///{db}", **(sets or {}), **(addon_sets or {})},
            workdir=str(workdir / "addon"),
        )
    else:
        raise ValueError(f"unknown proxy kind {kind!r}")
    p.start(timeout=timeout)
    return p


# --------------------------------------------------------------------------------------------
# client


@dataclass
class Target:
    """Where ``fetch_sse`` goes: the upstream's ``host``/ports and CA, and optionally a proxy
    (``proxy_port`` and the proxy's CA file ``proxy_ca``)."""

    host: str
    http_port: int
    https_port: int
    upstream_ca: str
    proxy_port: int | None = None
    proxy_ca: str | None = None

    def ssl_context(self, alpn: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.proxy_ca if self.proxy_port else self.upstream_ca)
        ctx.set_alpn_protocols([alpn])
        return ctx


def upstream_target(up: Upstream, proxy: MitmdumpProcess | None = None) -> Target:
    """A ``Target`` for ``up``, through ``proxy`` when given."""
    return Target(
        "127.0.0.1",
        up.http_port,
        up.https_port,
        up.ca_cert,
        proxy.port if proxy is not None else None,
        proxy.ca_path if proxy is not None else None,
    )


@dataclass
class SSEResult:
    """What the client saw of one streamed response; all times ``time.time()`` seconds.

    ``t_start``: just before connecting; ``t_headers``: response headers parsed;
    ``t_first_byte``: first body byte read; ``t_end``: end of body seen (HTTP/1.1 last chunk,
    HTTP/2 END_STREAM); ``events``: SSE events; ``event_types``/``sent``/``arrived``: per event,
    its ``event:`` type, its ``x-bench:sent`` (``None`` when not stamped) and the time of the
    read that completed it; ``body_bytes``: de-chunked body bytes."""

    t_start: float = 0.0
    status: int | None = None
    t_headers: float | None = None
    t_first_byte: float | None = None
    t_end: float | None = None
    events: int = 0
    body_bytes: int = 0
    event_types: list[bytes] = field(default_factory=list)
    sent: list[float | None] = field(default_factory=list)
    arrived: list[float] = field(default_factory=list)
    error: str | None = None
    keep_events: bool = True

    def latencies_ms(self) -> list[float]:
        """arrival - x-bench:sent of every stamped event, in milliseconds."""
        return [(a - s) * 1000.0 for s, a in zip(self.sent, self.arrived, strict=True) if s is not None]

    def latency_of(self, event_type: bytes, last: bool = True) -> float | None:
        """Latency (ms) of the last (or first) stamped event of ``event_type``; ``None`` if absent."""
        idx = range(len(self.event_types) - 1, -1, -1) if last else range(len(self.event_types))
        for i in idx:
            if self.event_types[i] == event_type and self.sent[i] is not None:
                return (self.arrived[i] - self.sent[i]) * 1000.0  # type: ignore[operator]
        return None


class _SSESink:
    """Splits a body into SSE events and records their stamps (cheap: byte searches)."""

    __slots__ = ("buf", "res")

    def __init__(self, res: SSEResult) -> None:
        self.buf = b""
        self.res = res

    def feed(self, data: bytes, now: float) -> None:
        res = self.res
        res.body_bytes += len(data)
        if res.t_first_byte is None:
            res.t_first_byte = now
        buf = self.buf + data if self.buf else data
        start = 0
        while True:
            i = buf.find(b"\n\n", start)
            if i < 0:
                break
            res.events += 1
            if res.keep_events:
                ev = buf[start:i]
                etype = ev[7 : ev.find(b"\n")] if ev.startswith(b"event: ") else b""
                j = ev.find(_STAMP)
                sent = None
                if j >= 0:
                    j += len(_STAMP)
                    k = j
                    while k < len(ev) and ev[k] not in b",}":
                        k += 1
                    with contextlib.suppress(ValueError):
                        sent = float(ev[j:k])
                res.event_types.append(etype)
                res.sent.append(sent)
                res.arrived.append(now)
            start = i + 2
        self.buf = buf[start:]


class _Chunked:
    """Incremental HTTP/1.1 ``Transfer-Encoding: chunked`` decoder (no trailers expected)."""

    __slots__ = ("buf", "crlf", "done", "left")

    def __init__(self) -> None:
        self.buf = b""
        self.left = 0  # bytes of the current chunk's data still to come
        self.crlf = False  # the CRLF after a chunk's data is still to come
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        """The data bytes contained in ``data`` (in order); sets ``done`` at the last chunk."""
        out: list[bytes] = []
        buf = self.buf + data if self.buf else data
        pos, n = 0, len(buf)
        while pos < n and not self.done:
            if self.left:
                take = min(self.left, n - pos)
                out.append(buf[pos : pos + take])
                pos += take
                self.left -= take
                self.crlf = self.left == 0
                continue
            if self.crlf:
                if n - pos < 2:
                    break
                pos += 2
                self.crlf = False
                continue
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:
                self.done = True  # (trailers / the final CRLF are not needed)
            self.left = size
        self.buf = b"" if self.done else buf[pos:]
        return out


async def _open(target: Target, transport: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection ready for the request: plain, or TLS (through CONNECT when proxied)."""
    tls = transport != "h1"
    alpn = "h2" if transport == "h2-tls" else "http/1.1"
    if target.proxy_port is None:
        if not tls:
            return await asyncio.open_connection(target.host, target.http_port)
        return await asyncio.open_connection(
            target.host, target.https_port, ssl=target.ssl_context(alpn), server_hostname=target.host
        )
    reader, writer = await asyncio.open_connection("127.0.0.1", target.proxy_port)
    if not tls:
        return reader, writer
    authority = f"{target.host}:{target.https_port}"
    writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    if b" 200" not in head.split(b"\r\n", 1)[0]:
        writer.close()
        raise ConnectionError(f"CONNECT refused: {head[:80]!r}")
    await writer.start_tls(target.ssl_context(alpn), server_hostname=target.host)
    return reader, writer


async def _h1(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    target: Target,
    transport: str,
    path: str,
    body: bytes,
    res: SSEResult,
) -> None:
    port = target.https_port if transport != "h1" else target.http_port
    authority = f"{target.host}:{port}"
    line_target = f"http://{authority}{path}" if (target.proxy_port and transport == "h1") else path
    writer.write(
        f"POST {line_target} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {LLM_CONTENT_TYPE}\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    now = time.time()
    res.t_headers = now
    res.status = int(head.split(b" ", 2)[1])
    lower = head.lower()
    chunked = b"transfer-encoding: chunked" in lower
    sink = _SSESink(res)
    dech = _Chunked() if chunked else None
    read = reader.read
    while True:
        data = await read(65536)
        now = time.time()
        if not data:
            if dech is not None and not dech.done:
                res.error = "connection closed before the end of the chunked body"
            else:
                res.t_end = now
            return
        if dech is None:
            sink.feed(data, now)
            continue
        for piece in dech.feed(data):
            sink.feed(piece, now)
        if dech.done:
            res.t_end = now
            return


async def _h2(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: Target, path: str, body: bytes, res: SSEResult
) -> None:
    import h2.config
    import h2.connection
    import h2.events
    import h2.settings

    ssl_obj = writer.get_extra_info("ssl_object")
    if ssl_obj is None or ssl_obj.selected_alpn_protocol() != "h2":
        raise ConnectionError("ALPN did not select h2")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
        },
    )
    conn.initiate_connection()
    conn.increment_flow_control_window(2**31 - 1 - 65535)  # no WINDOW_UPDATEs needed below 2 GB
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", f"{target.host}:{target.https_port}"),
            (":path", path),
            ("content-type", LLM_CONTENT_TYPE),
            ("accept", "text/event-stream"),
            ("content-length", str(len(body))),
        ],
    )
    conn.send_data(sid, body, end_stream=True)
    writer.write(conn.data_to_send())
    sink = _SSESink(res)
    read = reader.read
    while True:
        data = await read(65536)
        now = time.time()
        if not data:
            res.error = "connection closed before END_STREAM"
            return
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.DataReceived):
                if ev.stream_id == sid:
                    sink.feed(ev.data, now)
            elif isinstance(ev, h2.events.ResponseReceived):
                res.t_headers = now
                for k, v in ev.headers:
                    if k == b":status":
                        res.status = int(v)
            elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                res.t_end = now
            elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                res.error = f"stream reset ({ev.error_code})"
                return
            elif isinstance(ev, h2.events.ConnectionTerminated):
                res.error = f"connection terminated ({ev.error_code})"
                return
        out = conn.data_to_send()
        if out:
            writer.write(out)
        if res.t_end is not None:
            return


async def fetch_sse(
    target: Target, transport: str, path: str, body: bytes, *, timeout: float = 60.0, keep_events: bool = True
) -> SSEResult:
    """POSTs ``body`` to ``path`` over a fresh connection and reads the SSE response to its end.

    Never raises for a failed stream: ``error`` says what went wrong. ``timeout`` (seconds)
    bounds the whole exchange. With ``keep_events=False`` only counts and the first/last times
    are kept (bulk)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}")
    res = SSEResult(t_start=time.time(), keep_events=keep_events)
    writer: asyncio.StreamWriter | None = None

    async def go() -> None:
        nonlocal writer
        reader, writer = await _open(target, transport)
        if transport == "h2-tls":
            await _h2(reader, writer, target, path, body, res)
        else:
            await _h1(reader, writer, target, transport, path, body, res)

    try:
        await asyncio.wait_for(go(), timeout)
    except TimeoutError:
        res.error = f"timed out after {timeout:g} s"
    except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError, ssl.SSLError) as e:
        res.error = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - h2 protocol errors and the like: reported, not raised
        res.error = f"{type(e).__name__}: {e}"
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 2)
    if res.error is None and res.status != 200:
        res.error = f"HTTP {res.status}"
    return res


async def run_concurrent(
    target: Target, transport: str, paths: list[str], body: bytes, *, spread_s: float, timeout: float
) -> list[SSEResult]:
    """Starts one ``fetch_sse`` per path, start times spread evenly over ``spread_s`` seconds,
    and returns all results (in path order) once every stream ended or timed out."""
    n = len(paths)

    async def one(i: int, p: str) -> SSEResult:
        await asyncio.sleep(spread_s * i / max(1, n))
        return await fetch_sse(target, transport, p, body, timeout=timeout)

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(paths))))


def upstream_times(up: Upstream, tid: str, timeout: float = 5.0) -> dict[str, Any]:
    """The upstream's send log of exchange ``tid`` (``send_wall`` list, ``end_wall``; epoch
    seconds), fetched directly (not through a proxy)."""
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", up.http_port, timeout=timeout)
    try:
        c.request("GET", f"/v1/bench/exchange?of={tid}")
        return json.loads(c.getresponse().read())
    finally:
        c.close()


def pct(values: list[float], q: float) -> float:
    """Linear-interpolated ``q`` quantile (0..1) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def start_proxies(kinds: tuple[str, ...] | list[str], workdir: Path, **kwargs: Any) -> dict[str, MitmdumpProcess]:
    """``start_proxy`` for every kind, started in parallel (threads: each start is a bounded
    wait on a subprocess). If any fails, the others are stopped and the first error raised."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(kinds)) as ex:
        futs = {k: ex.submit(start_proxy, k, workdir, **kwargs) for k in kinds}
    procs: dict[str, MitmdumpProcess] = {}
    errors: list[BaseException] = []
    for k, f in futs.items():
        try:
            procs[k] = f.result()
        except BaseException as e:  # noqa: BLE001 - re-raised below after cleanup
            errors.append(e)
    if errors:
        for p in procs.values():
            p.stop()
        raise errors[0]
    return procs


def stop_all(procs: dict[str, MitmdumpProcess]) -> None:
    """Stops every proxy of ``procs`` (process groups; bounded)."""
    for p in procs.values():
        with contextlib.suppress(Exception):
            p.stop()
