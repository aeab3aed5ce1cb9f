"""Process and client helpers for the end-to-end tests and the bench.

- ``free_port``, ``wait_until``, ``wait_port``: bounded readiness helpers.
- ``ObserverProcess``: ``observer run`` (forward proxy + query API) with a temporary confdir,
  SQLite DB and API token; ``MitmdumpProcess``: plain ``mitmdump -s <script>``. Both are context
  managers that wait (bounded) until the proxy port accepts connections, the mitmproxy CA file
  exists and (observer) ``/healthz`` answers; they always terminate (then kill) the process
  group they started, capture stdout+stderr in a log file and put its tail into every failure.
- ``stream_request``: an httpx client (through a proxy or direct, HTTP/1.1 or HTTP/2) that
  timestamps every raw body chunk with ``time.monotonic()`` (``iter_raw``: content-encoded bytes
  exactly as received, so gzip bodies can be compared byte for byte).
- ``ApiClient``: the observer's query API, with ``wait_record`` polling (bounded) until the
  background writer has stored the expected exchange.

httpx does not coalesce chunks that arrive apart in time (checked: 8 events 50 ms apart give 8
``iter_raw`` chunks on h1, h1+TLS and h2), so no raw-socket client is needed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LLM_CONTENT_TYPE = "application/llm-request+json"


def tool(name: str) -> str:
    """A console script of the running venv (``mitmdump``, ``observer``), else from PATH."""
    p = BIN / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(name)
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until(
    pred: Callable[[], Any],
    timeout: float,
    interval: float = 0.05,
    what: str = "condition",
    abort: Callable[[], str | None] | None = None,
) -> Any:
    """Polls ``pred`` until it returns a truthy value (returned) or ``timeout`` passes
    (TimeoutError). ``abort`` may return a message to give up early (e.g. process exited)."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - retried until the deadline
            last_exc = e
        if abort is not None:
            msg = abort()
            if msg:
                raise RuntimeError(f"gave up waiting for {what}: {msg}")
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {timeout:.1f}s waiting for {what}"
                + (f" (last error: {last_exc!r})" if last_exc else "")
            )
        time.sleep(interval)


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------------------------
# processes


class ManagedProcess:
    """A child process in its own session (so its whole group can be ended), logging to a file."""

    name = "process"

    def __init__(self, workdir: str | None = None):
        self._own_tmp = None
        if workdir is None:
            self._own_tmp = tempfile.TemporaryDirectory(prefix=f"e2e-{self.name}-")
            workdir = self._own_tmp.name
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []

    # subclasses: argv(), env(), ready()
    def build_argv(self) -> list[str]:
        raise NotImplementedError

    def build_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Never let a configured system proxy interfere with loopback tests.
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env.pop(k, None)
        return env

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> ManagedProcess:
        self.argv = self.build_argv()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.build_env(),
                cwd=str(REPO),
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            wait_until(self.ready, timeout, interval=0.1, what=f"{self.name} readiness", abort=self._exited)
            # mitmdump binds its port before it loads scripts and exits on a startup error
            # ("Error logged during startup, exiting..."): make sure it stays up.
            time.sleep(self.settle_s)
            msg = self._exited() or self.startup_error()
            if msg:
                raise RuntimeError(msg)
        except BaseException as e:
            self.stop()
            raise RuntimeError(f"{self.name} did not become ready: {e}\n{self.describe()}") from e
        return self

    settle_s = 0.5

    def startup_error(self) -> str | None:
        """A fatal startup message in the log (subclasses)."""
        return None

    def _exited(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            return f"{self.name} exited with code {self.proc.returncode}"
        return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 60) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def describe(self, lines: int = 60) -> str:
        return f"--- {self.name}: {' '.join(self.argv)}\n--- log tail ({self.log_path}):\n{self.tail(lines)}\n---"

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM to the group we started, then SIGKILL after ``timeout``; returns the exit code."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        # Stragglers of the group (if the leader left children behind).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
        return p.returncode

    def cleanup(self) -> None:
        if self._own_tmp is not None:
            self._own_tmp.cleanup()
            self._own_tmp = None

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.cleanup()


#: What the test upstreams need of the observer's proxy: they are LLM hosts on this machine's
#: loopback (``observer_llm_hosts_extra``, ``observer_proxy_allow_loopback``). A test that
#: checks the defaults overrides them.
LAB_SETS = {"observer_llm_hosts_extra": "127.0.0.1,localhost", "observer_proxy_allow_loopback": "true"}


class MitmdumpProcess(ManagedProcess):
    """``mitmdump -q -s <script>`` listening on 127.0.0.1 with its own confdir."""

    name = "mitmdump"

    def __init__(
        self,
        script: str | Path,
        sets: dict[str, str] | None = None,
        workdir: str | None = None,
        port: int | None = None,
        quiet: bool = True,
    ):
        super().__init__(workdir)
        self.script = str(script)
        self.sets = {"ssl_insecure": "true", **(sets or {})}
        self.port = port or free_port()
        self.quiet = quiet
        self.confdir = self.workdir / "confdir"

    @property
    def ca_path(self) -> str:
        return str(self.confdir / "mitmproxy-ca-cert.pem")

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def build_argv(self) -> list[str]:
        argv = [tool("mitmdump")]
        if self.quiet:
            argv.append("-q")
        argv += [
            "--listen-host",
            "127.0.0.1",
            "-p",
            str(self.port),
            "--set",
            f"confdir={self.confdir}",
            "-s",
            self.script,
        ]
        sets = dict(self.sets)
        if Path(self.script).name == "llm_audit.py":  # its journal and key: this process's own
            sets.setdefault("observer_journal_dir", str(self.workdir / "journal"))
            sets.setdefault("observer_checkpoint_key", str(self.workdir / "checkpoint-key.pem"))
            sets = LAB_SETS | sets
        for k, v in sets.items():
            argv += ["--set", f"{k}={v}"]
        return argv

    def ready(self) -> bool:
        return os.path.exists(self.ca_path) and port_open(self.port)

    def startup_error(self) -> str | None:
        log = self.tail(200)
        for marker in ("error in script", "Error logged during startup", "Addon error"):
            if marker in log:
                return f"mitmdump logged {marker!r}"
        return None


class ObserverProcess(ManagedProcess):
    """``observer run`` (proxy + API) with a temporary confdir, SQLite DB and API token."""

    name = "observer"

    def __init__(
        self,
        token: str = "e2e-test-token-0123456789",
        sets: dict[str, str] | None = None,
        workdir: str | None = None,
        db_url: str | None = None,
        extra_args: Iterable[str] = (),
    ):
        super().__init__(workdir)
        self.token = token
        self.sets = {"ssl_insecure": "true", **LAB_SETS, **(sets or {})}
        self.proxy_port = free_port()
        self.api_port = free_port()
        while self.api_port == self.proxy_port:
            self.api_port = free_port()
        self.confdir = self.workdir / "confdir"
        self.db_url = db_url or f"sqlite:///{self.workdir / 'observer.db'}"
        self.extra_args = list(extra_args)

    @property
    def ca_path(self) -> str:
        return str(self.confdir / "mitmproxy-ca-cert.pem")

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def build_argv(self) -> list[str]:
        argv = [
            tool("observer"),
            "run",
            "--proxy-port",
            str(self.proxy_port),
            "--api-port",
            str(self.api_port),
            "--db",
            self.db_url,
            "--confdir",
            str(self.confdir),
        ]
        if "--data-dir" not in self.extra_args:  # the journal, key and token: this process's own
            argv += ["--data-dir", str(self.workdir / "data")]
        for k, v in self.sets.items():
            argv += ["--set", f"{k}={v}"]
        return argv + self.extra_args

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        env["OBSERVER_API_TOKEN"] = self.token
        return env

    def ready(self) -> bool:
        if not os.path.exists(self.ca_path) or not port_open(self.proxy_port):
            return False
        r = httpx.get(f"{self.api_url}/healthz", timeout=1.0, trust_env=False)
        return r.status_code == 200

    def api(self, token: str | None = None) -> ApiClient:
        return ApiClient(self.api_url, self.token if token is None else token)


def observer_cli_available(timeout: float = 30.0) -> tuple[bool, str]:
    """Whether ``observer run --help`` works (the product's CLI is installed and importable)."""
    try:
        exe = tool("observer")
    except FileNotFoundError:
        return False, "no `observer` console script in the venv"
    try:
        p = subprocess.run(
            [exe, "run", "--help"], capture_output=True, timeout=timeout, cwd=str(REPO), stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return False, "`observer run --help` timed out"
    if p.returncode != 0:
        out = (p.stdout + p.stderr).decode("utf-8", "replace").strip().splitlines()
        return False, "`observer run --help` failed: " + " | ".join(out[-5:])
    return True, ""


# --------------------------------------------------------------------------------------------
# streaming client


@dataclass
class StreamResult:
    """What the client saw: status, headers, every raw body chunk with its monotonic arrival
    time, and the exception that ended the body early (if any)."""

    started: float
    status: int | None = None
    http_version: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    error: BaseException | None = None
    closed_early: bool = False  # the client stopped reading on purpose (stop_when)
    ended: float | None = None

    @property
    def body(self) -> bytes:
        return b"".join(c for _, c in self.chunks)

    def arrival_of(self, offset: int) -> float | None:
        """Arrival time of the chunk that brought the body to at least ``offset`` bytes."""
        total = 0
        for t, c in self.chunks:
            total += len(c)
            if total >= offset:
                return t
        return None

    def arrivals(self, offsets: Iterable[int]) -> list[float | None]:
        return [self.arrival_of(o) for o in offsets]


def client_ssl_context(ca_path: str | None) -> ssl.SSLContext | bool:
    if ca_path is None:
        return True
    return ssl.create_default_context(cafile=ca_path)


def stream_request(
    url: str,
    *,
    proxy: str | None = None,
    ca_path: str | None = None,
    http2: bool = False,
    method: str = "POST",
    content: bytes | None = None,
    json_body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 15.0,
    stop_when: Callable[[StreamResult], bool] | None = None,
) -> StreamResult:
    """Sends one request with a fresh client (one fresh connection) and reads the raw body,
    timestamping every chunk. ``stop_when(result)`` returning true after a chunk closes the
    client (and so the connection) mid-body. Transport errors end the read and are returned in
    ``result.error``, never raised."""
    import json as _json

    hdrs = dict(headers or {})
    if json_body is not None:
        content = _json.dumps(json_body).encode()
        hdrs.setdefault("Content-Type", LLM_CONTENT_TYPE)
    res = StreamResult(started=time.monotonic())
    client = httpx.Client(
        proxy=proxy, verify=client_ssl_context(ca_path), http2=http2, trust_env=False, timeout=httpx.Timeout(timeout)
    )
    try:
        with client.stream(method, url, content=content, headers=hdrs) as r:
            res.status = r.status_code
            res.http_version = r.http_version
            res.headers = {k.lower(): v for k, v in r.headers.items()}
            for chunk in r.iter_raw():
                res.chunks.append((time.monotonic(), chunk))
                if stop_when is not None and stop_when(res):
                    res.closed_early = True
                    break
    except httpx.HTTPError as e:
        res.error = e
    finally:
        client.close()  # closes the connection: mid-body this is the client abort
        res.ended = time.monotonic()
    return res


def h2_request_then_cancel(
    url: str,
    *,
    proxy: str,
    ca_path: str,
    content: bytes,
    headers: dict[str, str],
    cancel_when: Callable[[StreamResult], bool],
    hold_until: Callable[[], Any] | None = None,
    hold_timeout: float = 5.0,
    timeout: float = 10.0,
) -> tuple[StreamResult, Any]:
    """HTTP/2 over CONNECT+TLS with a raw ``h2`` client: reads the response until
    ``cancel_when(result)``, then sends RST_STREAM(CANCEL) and keeps the connection open (answering
    the peer) until ``hold_until()`` returns something truthy (returned) or ``hold_timeout`` passes.
    httpx cannot do this: it never resets a stream it stops reading, it only closes the connection."""
    from urllib.parse import urlsplit

    import h2.config
    import h2.connection
    import h2.errors
    import h2.events

    u, p = urlsplit(url), urlsplit(proxy)
    assert u.scheme == "https" and u.hostname and u.port and p.hostname and p.port
    res = StreamResult(started=time.monotonic())
    held: Any = None
    sock = socket.create_connection((p.hostname, p.port), timeout=timeout)
    try:
        authority = f"{u.hostname}:{u.port}"
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            more = sock.recv(4096)
            if not more:
                raise ConnectionError(f"proxy closed during CONNECT: {head!r}")
            head += more
        if not head.split(b"\r\n", 1)[0].split(b" ")[1].startswith(b"2"):
            raise ConnectionError(f"CONNECT refused: {head!r}")
        ctx = ssl.create_default_context(cafile=ca_path)
        ctx.set_alpn_protocols(["h2"])
        tls = ctx.wrap_socket(sock, server_hostname=u.hostname)
        sock = tls
        if tls.selected_alpn_protocol() != "h2":
            raise ConnectionError(f"ALPN gave {tls.selected_alpn_protocol()!r}, not h2")
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        target = u.path + (f"?{u.query}" if u.query else "")
        hdrs = [(":method", "POST"), (":scheme", "https"), (":authority", authority), (":path", target)]
        hdrs += [(k.lower(), v) for k, v in headers.items()] + [("content-length", str(len(content)))]
        conn.send_headers(sid, hdrs)
        conn.send_data(sid, content, end_stream=True)
        tls.sendall(conn.data_to_send())
        res.http_version = "HTTP/2"
        ended = False

        def pump(deadline: float) -> list[h2.events.Event]:
            tls.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = tls.recv(65536)
            except TimeoutError:
                return []
            if not data:
                raise ConnectionError("proxy closed the connection")
            evs = conn.receive_data(data)
            out = conn.data_to_send()
            if out:
                tls.sendall(out)
            return evs

        deadline = time.monotonic() + timeout
        while not ended and not res.closed_early:
            if time.monotonic() > deadline:
                raise TimeoutError("no end of response")
            for ev in pump(deadline):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    hd = dict(ev.headers)
                    res.status = int(hd[":status"])
                    res.headers = {k: v for k, v in hd.items() if not k.startswith(":")}
                elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
                    res.chunks.append((time.monotonic(), ev.data))
                    conn.acknowledge_received_data(ev.flow_controlled_length, sid)
                    if not res.closed_early and cancel_when(res):
                        conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                        tls.sendall(conn.data_to_send())
                        res.closed_early = True
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)) and ev.stream_id == sid:
                    ended = True
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    raise ConnectionError(f"GOAWAY {ev.error_code}")
        # Keep the connection open (and answered) while waiting.
        hold_deadline = time.monotonic() + hold_timeout
        while hold_until is not None and time.monotonic() < hold_deadline:
            held = hold_until()
            if held:
                break
            pump(min(hold_deadline, time.monotonic() + 0.1))
    except (OSError, ConnectionError, TimeoutError) as e:
        res.error = e
    finally:
        sock.close()
        res.ended = time.monotonic()
    return res, held


# --------------------------------------------------------------------------------------------
# query API


class ApiClient:
    """The observer's query API (``/healthz``, ``/v1/exchanges``)."""

    def __init__(self, base_url: str, token: str | None):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self._details: dict[str, dict[str, Any]] = {}
        self.http = httpx.Client(base_url=self.base_url, trust_env=False, timeout=10.0)

    def _headers(self, token: str | None = None) -> dict[str, str]:
        t = self.token if token is None else token
        return {"Authorization": f"Bearer {t}"} if t else {}

    def request(
        self, path: str, token: str | None = None, params: dict[str, Any] | None = None, auth: bool = True
    ) -> httpx.Response:
        return self.http.get(path, params=params, headers=self._headers(token) if auth else {})

    def healthz(self) -> httpx.Response:
        return self.http.get("/healthz")

    def list(self, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        r = self.request("/v1/exchanges", params=params)
        r.raise_for_status()
        return r.json()

    def all_items(self, page: int = 50, max_pages: int = 100) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        for _ in range(max_pages):
            body = self.list(limit=page, cursor=cursor)
            items.extend(body.get("items", []))
            cursor = body.get("next_cursor")
            if not cursor:
                break
        return items

    def get(self, exchange_id: str) -> dict[str, Any]:
        r = self.request(f"/v1/exchanges/{exchange_id}")
        r.raise_for_status()
        return r.json()

    def detail(self, exchange_id: str) -> dict[str, Any]:
        """``get`` with a cache (records are final once listed)."""
        if exchange_id not in self._details:
            self._details[exchange_id] = self.get(exchange_id)
        return self._details[exchange_id]

    def find(self, pred: Callable[[dict[str, Any]], bool], scan: int = 50) -> dict[str, Any] | None:
        """The newest record among the latest ``scan`` whose full detail satisfies ``pred``."""
        for item in self.list(limit=scan).get("items", []):
            rec = self.detail(item["id"])
            if pred(rec):
                return rec
        return None

    def wait_record(
        self, pred: Callable[[dict[str, Any]], bool], timeout: float = 10.0, what: str = "record"
    ) -> dict[str, Any]:
        return wait_until(lambda: self.find(pred), timeout, interval=0.1, what=what)

    def wait_tid(self, tid: str, timeout: float = 10.0) -> dict[str, Any]:
        """The record of the request tagged ``tid`` (in the query string and in
        ``metadata.session_id``, see ``tests/e2e/test_proxy_e2e.py``)."""
        return self.wait_record(lambda rec: record_has_tid(rec, tid), timeout, what=f"the record of tid={tid}")

    def close(self) -> None:
        self.http.close()


def record_has_tid(rec: dict[str, Any], tid: str) -> bool:
    req = rec.get("request") or {}
    meta = req.get("metadata") or {}
    return meta.get("session_id") == tid or tid in str(rec.get("path") or "")


# --------------------------------------------------------------------------------------------
# assertions


def subset_mismatches(actual: Any, expected: Any, path: str = "$") -> list[str]:
    """Differences between ``actual`` and the hand-written ``expected`` subset: dicts compare
    only the expected keys (recursively), lists must have the same length (elements compared
    the same way), anything else must be equal."""
    out: list[str] = []
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {actual!r}"]
        for k, v in expected.items():
            if k not in actual:
                out.append(f"{path}.{k}: missing (expected {v!r})")
            else:
                out.extend(subset_mismatches(actual[k], v, f"{path}.{k}"))
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {expected!r}, got {actual!r}"]
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            out.extend(subset_mismatches(a, e, f"{path}[{i}]"))
    elif (
        actual != expected
        or type(actual) is not type(expected)
        and not (isinstance(actual, (int, float)) and isinstance(expected, (int, float)))
    ):
        out.append(f"{path}: expected {expected!r}, got {actual!r}")
    return out


def assert_subset(actual: Any, expected: Any, context: str = "") -> None:
    mism = subset_mismatches(actual, expected)
    assert not mism, (
        "record differs from the expected subset:\n  " + "\n  ".join(mism) + (f"\n  ({context})" if context else "")
    )
