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
