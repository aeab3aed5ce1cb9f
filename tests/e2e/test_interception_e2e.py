"""Issue 14 items 1 and 9 through a real ``observer run``: TLS to a host that is not an LLM host
is tunnelled untouched (the client, trusting only that server's own certificate, completes its
request; nothing is recorded), the same for a WebSocket, and the proxy refuses to connect its
clients to the observer's own API and database ports and, by default, to loopback."""

from __future__ import annotations

import json
import re
import socket
import ssl
import threading
import uuid
from collections.abc import Iterator

import httpx
import pytest
from websockets.sync.client import connect as ws_connect
from websockets.sync.server import serve as ws_serve

from tests.e2e.harness import LLM_CONTENT_TYPE, ObserverProcess, observer_cli_available
from tests.e2e.upstream import UpstreamServer, make_certs

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def _cli() -> None:
    ok, why = observer_cli_available()
    if not ok:
        pytest.skip(f"observer CLI not available: {why}")


def draft_request(tid: str) -> bytes:
    return json.dumps(
        {
            "version": "1.0",
            "stream": True,
            "model": "example-model",
            "messages": [{"role": "user", "content": "hello"}],
            "metadata": {"session_id": tid},
        }
    ).encode()


def upstream_only(ca_path: str) -> ssl.SSLContext:
    """A client context that trusts the upstream's own CA and nothing else (not the proxy's)."""
    return ssl.create_default_context(cafile=ca_path)


def post(client: httpx.Client, url: str, tid: str) -> httpx.Response:
    return client.post(url, content=draft_request(tid), headers={"content-type": LLM_CONTENT_TYPE})


def test_tls_to_a_host_off_the_list_is_tunnelled_and_not_recorded(upstream: UpstreamServer) -> None:
    """127.0.0.1 is not an LLM host here: the client completes its HTTPS request through the
    proxy trusting only the upstream's certificate, and no record is made of it; a request in
    clear to the same server (the draft's media type is recorded from any host the proxy sees in
    clear) is the control that the observer records at all."""
    hidden, control = "tls-" + uuid.uuid4().hex[:8], "clear-" + uuid.uuid4().hex[:8]
    with ObserverProcess(sets={"observer_llm_hosts_extra": ""}) as obs:
        api = obs.api()
        with httpx.Client(proxy=obs.proxy_url, verify=upstream_only(upstream.ca_cert_path), timeout=20) as client:
            r = post(client, upstream.url(f"/v1/stream?tid={hidden}", tls=True), hidden)
            assert r.status_code == 200 and b"stream.end" in r.content
        assert upstream.wait_exchange(hidden).body == draft_request(hidden)
        with httpx.Client(proxy=obs.proxy_url, timeout=20) as client:
            assert post(client, upstream.url(f"/v1/stream?tid={control}", tls=False), control).status_code == 200
        rec = api.wait_tid(control, timeout=20)
        assert rec["scheme"] == "http"
        items = api.all_items()
        assert [i["id"] for i in items] == [rec["id"]]
        api.close()


def test_tls_to_an_llm_host_is_intercepted(upstream: UpstreamServer) -> None:
    """The counterpart: with 127.0.0.1 on the list the proxy presents its own certificate, which
    a client trusting only the upstream refuses; a client trusting the proxy's CA is recorded."""
    tid = "llm-" + uuid.uuid4().hex[:8]
    with ObserverProcess() as obs:  # (the tests' LAB_SETS: 127.0.0.1 is an LLM host)
        with httpx.Client(proxy=obs.proxy_url, verify=upstream_only(upstream.ca_cert_path), timeout=20) as client:
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                post(client, upstream.url("/v1/stream?tid=refused", tls=True), "refused")
        with httpx.Client(proxy=obs.proxy_url, verify=obs.ca_path, timeout=20) as client:
            assert post(client, upstream.url(f"/v1/stream?tid={tid}", tls=True), tid).status_code == 200
        api = obs.api()
        assert api.wait_tid(tid, timeout=20)["scheme"] == "https"
        api.close()


@pytest.fixture
def wss_echo(tmp_path) -> Iterator[tuple[int, str]]:
    """A TLS WebSocket echo server on 127.0.0.1 with its own throw-away CA: (port, CA path)."""
    ca, cert, key = make_certs(str(tmp_path))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def echo(ws) -> None:
        for message in ws:
            ws.send(message)

    server = ws_serve(echo, "127.0.0.1", 0, ssl=ctx)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.socket.getsockname()[1], ca
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_a_websocket_to_a_host_off_the_list_is_tunnelled(wss_echo: tuple[int, str]) -> None:
    port, ca = wss_echo
    with ObserverProcess(sets={"observer_llm_hosts_extra": ""}) as obs:
        with ws_connect(
            f"wss://127.0.0.1:{port}/socket", ssl=upstream_only(ca), proxy=obs.proxy_url, open_timeout=10
        ) as ws:
            for text in ("one", "two", "x" * 70000):
                ws.send(text)
                assert ws.recv(timeout=10) == text
        api = obs.api()
        assert api.all_items() == []
        api.close()


def connect_status(proxy_port: int, target: str) -> str:
    """What the proxy answers ``CONNECT target``: its status line and body (``Content-Length``)."""
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as sock:
        sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        data = b""
        while len(data) < 65536:
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if length is None or len(body) >= int(length.group(1)):
                    break
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode("latin-1", "replace")


@pytest.mark.postgres
def test_the_proxy_refuses_its_own_api_and_database_and_by_default_loopback(
    upstream: UpstreamServer, pg_migrated_url: str
) -> None:
    """Trial finding: ``CONNECT 127.0.0.1:5432`` through the proxy reached the audit database;
    the API was reachable the same way. The API and the database stay refused with
    ``proxy_allow_loopback`` (the tests' default); without it every loopback upstream is."""
    from sqlalchemy.engine import make_url

    db_port = make_url(pg_migrated_url).port or 5432
    with ObserverProcess(db_url=pg_migrated_url) as lab:
        api = connect_status(lab.proxy_port, f"127.0.0.1:{lab.api_port}")
        assert api.startswith("HTTP/1.1 403") and "a protected port of this host" in api
        db = connect_status(lab.proxy_port, f"localhost:{db_port}")
        assert db.startswith("HTTP/1.1 403") and "a protected port of this host" in db
        meta = connect_status(lab.proxy_port, "169.254.169.254:80")
        assert meta.startswith("HTTP/1.1 403") and "the cloud metadata service" in meta
        ok = connect_status(lab.proxy_port, f"127.0.0.1:{upstream.https_port}")
        assert ok.startswith("HTTP/1.1 200"), ok
        assert "refused a connection" in lab.tail(200)
    with ObserverProcess(sets={"observer_proxy_allow_loopback": "false"}) as strict:
        up = connect_status(strict.proxy_port, f"127.0.0.1:{upstream.https_port}")
        assert up.startswith("HTTP/1.1 403") and "a loopback address of the proxy's host" in up
        assert "connection_strategy" not in up  # trial finding: mitmproxy's hint for a failed connection misled
        with httpx.Client(proxy=strict.proxy_url, timeout=10) as client:
            r = client.get(f"http://127.0.0.1:{strict.api_port}/healthz")
        assert r.status_code == 502 and "a protected port of this host" in r.text
