"""Issue 16 item 5, AI SDK exchanges in full, through a real ``observer run``: the real ``ai``
npm package (``tests/node/aisdk_chat.mjs``, pinned in ``tests/node/package.json``) serves an
AI SDK app on 127.0.0.1 on its own route, ``POST /api/assistant`` (not ``/api/chat``), with
``streamText`` and a server-side tool answered by ``toUIMessageStreamResponse()``; its chat UI's
transport (``DefaultChatTransport``, what ``useChat`` uses) calls it through the proxy.

Nothing in that request says LLM when its headers arrive (no dialect's path, no standard media
type), so the proxy streams its body on and keeps a copy (``observer.capture.held``) until the
response's ``x-vercel-ai-ui-message-stream: v1`` claims it. Checked by hand against what the
app received and what the UI read: the request's messages, size and chat id; the answer's text;
the tool call with its arguments as streamed, ``declared`` ``null`` (the app declared the tool
on its server, not in the UI request) and no ``undeclared_tool``. And a JSON POST on the same
host whose response is not an AI SDK stream passes through whole and leaves no record.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.harness import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

NODE_DIR = REPO / "tests" / "node"
ROUTE = "/api/assistant"
PROMPT = "Weather in Vienna?"


def run_app(proxy_url: str, timeout_s: float = 40.0) -> dict[str, Any]:
    """Runs ``aisdk_chat.mjs`` (the app and its UI transport) through ``proxy_url``; its JSON line."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed")
    for pkg in ("ai", "zod", "undici"):
        if not (NODE_DIR / "node_modules" / pkg / "package.json").exists():
            pytest.skip(f"{pkg} not installed in tests/node (`make install`: npm ci)")
    env = dict(os.environ)
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NODE_OPTIONS"):
        env.pop(k, None)  # the script's own ProxyAgent, nothing implicit
    cfg = {"proxy": proxy_url, "route": ROUTE, "prompt": PROMPT, "timeoutMs": int(timeout_s * 1000) - 5000}
    p = subprocess.run(
        ["node", str(NODE_DIR / "aisdk_chat.mjs"), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(NODE_DIR),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    assert p.returncode == 0 and len(lines) == 1 and "error" not in lines[0], (
        f"node exited {p.returncode}\nstdout: {p.stdout[-3000:]}\nstderr: {p.stderr[-3000:]}"
    )
    return lines[0]


def test_an_ai_sdk_app_on_its_own_route_is_recorded_in_full(recorded: Any) -> None:
    out = run_app(recorded.proxy_url)
    # What the UI read (the SDK's own reading of the stream) and what the app received.
    assert (out["status"], out["contentType"], out["uiHeader"]) == (200, "text/event-stream", "v1")
    assert out["message"]["parts"] == [
        {"type": "step-start"},
        {
            "type": "tool-getWeather",
            "toolCallId": "call_1",
            "state": "output-available",
            "input": {"city": "Vienna"},
            "output": {"city": "Vienna", "tempC": 21},
        },
        {"type": "step-start"},
        {"type": "text", "text": "It is 21°C in Vienna.", "state": "done"},
    ]
    sent = json.loads(out["body"])
    assert sent == {
        "id": "chat-e2e-1",
        "messages": [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": PROMPT}]}],
        "trigger": "submit-message",
    }

    port = out["port"]
    rec = recorded.api.wait_record(
        lambda r: r["path"] == ROUTE and r["port"] == port, timeout=15.0, what=f"the record of {ROUTE} on :{port}"
    )
    assert (rec["dialect"], rec["method"], rec["host"], rec["status_code"], rec["outcome"]) == (
        "vercel.ui",
        "POST",
        "127.0.0.1",
        200,
        "completed",
    )
    request = rec["request"]
    assert request["messages"] == [{"id": "u-1", "role": "user", "parts": [{"type": "text", "text": PROMPT}]}]
    assert request["body_bytes"] == 140 == len(out["body"].encode())  # counted by hand, and as the app got it
    assert request["metadata"] == {"id": "chat-e2e-1", "trigger": "submit-message"}
    assert (request["model"], request["tools"], request["tool_names"]) == (None, [], [])
    assert rec["text"] == "It is 21°C in Vienna."
    assert rec["tool_calls"] == [
        {"index": 0, "id": "call_1", "name": "getWeather", "arguments": '{"city":"Vienna"}', "declared": None}
    ]
    assert (rec["stop_reason"], rec["stop_reason_raw"]) == ("end_turn", "stop")
    assert not [v for v in rec["violations"] if v["kind"] == "undeclared_tool"]
    assert rec["violations"] == []


class _JSONApp(http.server.BaseHTTPRequestHandler):
    """Answers every POST with how many body bytes it read and their last 8:
    ``{"got": n, "tail": "..."}``."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        n = int(self.headers.get("content-length", "0"))
        got = self.rfile.read(n)
        body = json.dumps({"got": len(got), "tail": got[-8:].decode()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def json_app() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JSONApp)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_a_held_json_post_whose_answer_is_not_llm_passes_whole_and_is_not_recorded(
    recorded: Any, json_app: int
) -> None:
    """A 1 MiB JSON POST on the LLM host (held while it streams on) answered with plain JSON:
    the app gets every byte, and no record is made (the copy is dropped)."""
    tag = uuid.uuid4().hex[:12]
    payload = json.dumps({"blob": "x" * (1 << 20), "tag": tag}).encode()
    with httpx.Client(proxy=recorded.proxy_url, trust_env=False, timeout=20.0) as client:
        r = client.post(
            f"http://127.0.0.1:{json_app}/api/settings?t={tag}",
            content=payload,
            headers={"content-type": "application/json"},
        )
    assert r.status_code == 200
    assert r.json() == {"got": len(payload), "tail": f'"{tag}"}}'[-8:]}
    # A record made by this proxy after it would be listed by now: a marker exchange it records.
    out = run_app(recorded.proxy_url)
    recorded.api.wait_record(lambda rec: rec["port"] == out["port"], timeout=15.0, what="the marker record")
    assert recorded.api.find(lambda rec: tag in rec["path"], scan=20) is None


# ----- HTTP/2: the response starts while the request is still uploading -----

# A UI message stream as ``toUIMessageStreamResponse()`` writes it (the parts of the Node run
# above, hand-written): a call of the server's tool, its output, then the answer.
H2_STREAM = [
    b'data: {"type":"start"}\n\n',
    b'data: {"type":"start-step"}\n\n',
    b'data: {"type":"tool-input-start","toolCallId":"call_9","toolName":"getWeather"}\n\n',
    b'data: {"type":"tool-input-delta","toolCallId":"call_9","inputTextDelta":"{\\"city\\":\\"Graz\\"}"}\n\n',
    b'data: {"type":"tool-input-available","toolCallId":"call_9","toolName":"getWeather","input":{"city":"Graz"}}\n\n',
    b'data: {"type":"tool-output-available","toolCallId":"call_9","output":{"tempC":18}}\n\n',
    b'data: {"type":"finish-step"}\n\ndata: {"type":"start-step"}\n\n',
    b'data: {"type":"text-start","id":"t"}\n\ndata: {"type":"text-delta","id":"t","delta":"18 degrees."}\n\n',
    b'data: {"type":"text-end","id":"t"}\n\ndata: {"type":"finish-step"}\n\n',
    b'data: {"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n',
]
H2_BODY = b'{"id":"chat-h2","messages":[{"id":"u-7","role":"user","parts":[{"type":"text","text":"Graz?"}]}]}'


class _EarlyUIApp:
    """An ASGI app (served over HTTP/2 by hypercorn) that answers ``POST /api/assistant`` with
    the UI stream's headers as soon as the first body chunk arrives, reads the rest of the
    upload, then streams ``H2_STREAM``; ``got`` is the body it read, ``early`` whether the
    headers went out before the upload ended."""

    def __init__(self) -> None:
        self.got = b""
        self.early = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        started = False
        while True:
            message = await receive()
            self.got += message.get("body", b"")
            more = message.get("more_body", False)
            if not started:
                headers = [(b"content-type", b"text/event-stream"), (b"x-vercel-ai-ui-message-stream", b"v1")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                started, self.early = True, more
            if not more:
                break
        for part in H2_STREAM:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.fixture
def h2_app(tmp_path: Any) -> Iterator[tuple[_EarlyUIApp, int]]:
    import asyncio

    hypercorn_asyncio = pytest.importorskip("hypercorn.asyncio")
    from hypercorn.config import Config

    from tests.e2e.harness import free_port, wait_until
    from tests.e2e.upstream import make_certs

    _ca, cert, key = make_certs(str(tmp_path))
    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.certfile, config.keyfile = cert, key
    config.alpn_protocols = ["h2"]
    config.accesslog = config.errorlog = None
    app = _EarlyUIApp()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(hypercorn_asyncio.serve(app, config, shutdown_trigger=stop.wait))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    from tests.e2e.harness import port_open

    wait_until(lambda: port_open(port), 10.0, interval=0.05, what="the HTTP/2 app")
    try:
        yield app, port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10)


def test_over_http2_a_body_still_uploading_at_the_response_headers_is_read_at_its_end(
    recorded: Any, h2_app: tuple[_EarlyUIApp, int]
) -> None:
    """HTTP/2 end to end: httpx uploads the UI request in two DATA frames 0.5 s apart; the app
    sends the UI stream's headers after the first, so the proxy sees the response start before
    the upload ended. The body is read at the end of the upload (not half-way), and the record
    has the whole request and the tool call ``declared`` ``null``."""
    import asyncio

    from tests.e2e.harness import client_ssl_context

    app, port = h2_app
    half = len(H2_BODY) // 2

    async def upload():
        yield H2_BODY[:half]
        await asyncio.sleep(0.5)
        yield H2_BODY[half:]

    async def call() -> tuple[str, int, bytes]:
        async with httpx.AsyncClient(
            http2=True, proxy=recorded.proxy_url, verify=client_ssl_context(recorded.ca_path), trust_env=False
        ) as client:
            r = await client.post(
                f"https://127.0.0.1:{port}{ROUTE}", content=upload(), headers={"content-type": "application/json"}
            )
            return r.http_version, r.status_code, r.content

    version, status, body = asyncio.run(asyncio.wait_for(call(), 30.0))
    assert (version, status, body) == ("HTTP/2", 200, b"".join(H2_STREAM))
    assert (app.got, app.early) == (H2_BODY, True)
    rec = recorded.api.wait_record(
        lambda r: r["path"] == ROUTE and r["port"] == port, timeout=15.0, what=f"the HTTP/2 record on :{port}"
    )
    assert (rec["dialect"], rec["http_version"], rec["outcome"], rec["text"]) == (
        "vercel.ui",
        "HTTP/2.0",
        "completed",
        "18 degrees.",
    )
    assert rec["request"]["messages"] == [{"id": "u-7", "role": "user", "parts": [{"type": "text", "text": "Graz?"}]}]
    assert (rec["request"]["body_bytes"], rec["request"]["metadata"]) == (97, {"id": "chat-h2"})
    assert rec["tool_calls"] == [
        {"index": 0, "id": "call_9", "name": "getWeather", "arguments": '{"city":"Graz"}', "declared": None}
    ]
    assert rec["violations"] == []


# ----- the budget of held bodies across flows (max_held_request_bytes) -----

HELD_BUDGET = 500_000  # bytes, set for the proxy of this test
HELD_SIZE = 200_000  # bytes of each upload: 2 fit in the budget (400,000), 3 do not (600,000)
HELD_PARALLEL = 6
UI_OK = (
    b'data: {"type":"start"}\n\n'
    b'data: {"type":"text-start","id":"t"}\n\ndata: {"type":"text-delta","id":"t","delta":"ok"}\n\n'
    b'data: {"type":"text-end","id":"t"}\n\ndata: {"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n'
)
HELD_DROPPED = (
    "oversize_request",
    "request body not parsed: its copy was dropped, the request bodies held at once across all flows"
    " reached max_held_request_bytes (500000 bytes)",
)


def ui_upload(tag: str) -> tuple[bytes, str]:
    """A UI request of ``HELD_SIZE`` bytes with chat id ``tag``, and its text."""
    head = b'{"id":"' + tag.encode() + b'","messages":[{"id":"u","role":"user","parts":[{"type":"text","text":"'
    tail = b'"}]}],"trigger":"submit-message"}'
    text = "x" * (HELD_SIZE - len(head) - len(tail))
    return head + text.encode() + tail, text


class _HeldApp(http.server.ThreadingHTTPServer):
    """An AI SDK app for many large uploads: ``POST /api/assistant?t=TAG`` reads the body whole
    (``got[TAG]``: its size and SHA-256), waits until ``parties`` bodies are in (so every copy
    is held by the proxy at the same time), then answers ``UI_OK`` as a UI stream;
    ``POST /api/abort?t=TAG`` reads until the connection ends, ``seen[TAG]`` counting the bytes
    and ``ended`` listing the tags whose connection ended."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HeldHandler)
        self.barrier = threading.Barrier(1)
        self.got: dict[str, tuple[int, str]] = {}
        self.seen: dict[str, int] = {}
        self.ended: list[str] = []


class _HeldHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        import hashlib

        app: _HeldApp = self.server  # type: ignore[assignment]
        path, _, query = self.path.partition("?")
        tag = query.removeprefix("t=")
        n = int(self.headers.get("content-length", "0"))
        digest, got = hashlib.sha256(), 0
        while got < n:
            part = self.rfile.read1(min(1 << 16, n - got))
            if not part:
                break
            digest.update(part)
            got += len(part)
            app.seen[tag] = got
        if path == "/api/abort":
            app.ended.append(tag)
            self.close_connection = True
            return
        app.got[tag] = (got, digest.hexdigest())
        try:
            app.barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("x-vercel-ai-ui-message-stream", "v1")
        self.send_header("content-length", str(len(UI_OK)))
        self.end_headers()
        self.wfile.write(UI_OK)

    def log_message(self, *args: object) -> None:
        return None


def test_parallel_uploads_over_the_held_budget_pass_whole_and_are_recorded_as_over_it(tmp_path: Any) -> None:
    """``observer run`` with ``max_held_request_bytes`` = 500,000. Six parallel 200,000-byte AI
    SDK uploads, all in the proxy at once (the app answers none before it has all six): every
    byte reaches the app intact and every answer the client, and all six are recorded; two
    copies fit (400,000; a third would make 600,000), so exactly two records have their
    request, the four others ``body_bytes`` 200,000 and the budget's ``oversize_request``
    (counted by hand: a copy stops only when three are being made, and then two are left that
    fit with any chunk of mitmproxy's, at most 65,535 bytes: 465,535). Then three uploads
    aborted by their client after 150,000 of 200,000 bytes, and the six again: two are kept
    again, so neither the first round (adopted and dropped copies) nor the aborts left any of
    the budget reserved (450,000 leaked would keep none)."""
    import hashlib
    import socket
    import struct
    from concurrent.futures import ThreadPoolExecutor

    from tests.e2e.harness import ObserverProcess, wait_until

    app = _HeldApp()
    threading.Thread(target=app.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    port = app.server_address[1]
    obs = ObserverProcess(workdir=str(tmp_path), sets={"observer_max_held_request_bytes": str(HELD_BUDGET)})
    try:
        obs.start(timeout=45)
        api = obs.api()
        run = uuid.uuid4().hex[:8]

        def round_of_six(name: str) -> None:
            app.barrier = threading.Barrier(HELD_PARALLEL)
            tags = [f"{name}-{run}-{i}" for i in range(HELD_PARALLEL)]
            uploads = {tag: ui_upload(tag) for tag in tags}

            def post(tag: str) -> tuple[int, bytes]:
                with httpx.Client(proxy=obs.proxy_url, trust_env=False, timeout=60.0) as client:
                    r = client.post(
                        f"http://127.0.0.1:{port}{ROUTE}?t={tag}",
                        content=uploads[tag][0],
                        headers={"content-type": "application/json"},
                    )
                return r.status_code, r.content

            with ThreadPoolExecutor(HELD_PARALLEL) as pool:
                answers = list(pool.map(post, tags))
            assert answers == [(200, UI_OK)] * HELD_PARALLEL
            for tag in tags:  # every byte at the app, intact
                assert app.got[tag] == (HELD_SIZE, hashlib.sha256(uploads[tag][0]).hexdigest()), tag

            def records() -> dict[str, dict[str, Any]] | None:
                items = [i for i in api.list(limit=100)["items"] if i["port"] == port and name in i["path"]]
                if len(items) < HELD_PARALLEL:
                    return None
                recs = [api.detail(i["id"]) for i in items]
                return {rec["path"].partition("t=")[2]: rec for rec in recs}

            recs = wait_until(records, 30.0, interval=0.2, what=f"the six records of round {name}")
            assert sorted(recs) == sorted(tags)
            kept, dropped = [], []
            for tag, rec in recs.items():
                assert (rec["dialect"], rec["outcome"], rec["text"]) == ("vercel.ui", "completed", "ok"), tag
                assert rec["request"]["body_bytes"] == HELD_SIZE, tag
                if rec["violations"] == []:
                    part = {"type": "text", "text": uploads[tag][1]}
                    assert rec["request"]["messages"] == [{"id": "u", "role": "user", "parts": [part]}], tag
                    assert rec["request"]["metadata"] == {"id": tag, "trigger": "submit-message"}
                    kept.append(tag)
                else:
                    assert rec["request"]["messages"] == [], tag
                    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == [HELD_DROPPED], tag
                    dropped.append(tag)
            assert (len(kept), len(dropped)) == (2, 4), (kept, dropped)

        round_of_six("first")

        for i in range(3):  # uploads the client aborts mid-way, each held while it lasted
            tag = f"abort-{run}-{i}"
            head = (
                f"POST http://127.0.0.1:{port}/api/abort?t={tag} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {HELD_SIZE}\r\n\r\n"
            ).encode()
            with socket.create_connection(("127.0.0.1", obs.proxy_port), timeout=10) as sock:
                sock.sendall(head + b"{" + b" " * 149_999)
                wait_until(lambda t=tag: app.seen.get(t, 0) >= 150_000, 15.0, what=f"150,000 bytes of {tag} upstream")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a RST
            wait_until(lambda t=tag: t in app.ended, 15.0, what=f"the proxy ending {tag} upstream")

        round_of_six("second")
    finally:
        code = obs.stop()
        app.shutdown()
        app.server_close()
        print(f"\nobserver exit code {code}; log tail:\n{obs.tail(20)}")
