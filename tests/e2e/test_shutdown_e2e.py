"""Stopping ``observer run`` (SIGTERM) drains: open streams finish (up to ``drain_timeout_s``)
while no new connection is accepted; a stream still open after it is recorded as
``interrupted``, with the text seen so far (trial finding: such records were silently lost).
An API that dies is started again while the proxy keeps serving."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from pathlib import Path

import pytest

from tests.e2e.harness import LLM_CONTENT_TYPE, ObserverProcess, port_open, stream_request, wait_until
from tests.e2e.upstream import UpstreamServer

pytestmark = pytest.mark.e2e


def test_sigterm_records_open_stream_as_interrupted(upstream: UpstreamServer) -> None:
    obs = ObserverProcess(extra_args=["--drain-timeout-s", "1"])  # the stream needs 5 s
    obs.start()
    try:
        url = upstream.url("/v1/stream?script=long&n=50&gap_ms=100&tid=shutdown-1")
        body = b'{"version":"1.0","stream":true,"model":"m","messages":[{"role":"user","content":"hi"}]}'
        seen: list[int] = []

        def client() -> None:
            res = stream_request(
                url,
                proxy=obs.proxy_url,
                ca_path=obs.ca_path,
                content=body,
                headers={"Content-Type": LLM_CONTENT_TYPE},
                timeout=20,
            )
            seen.append(len(res.body))

        t = threading.Thread(target=client, daemon=True)
        t.start()
        up = upstream.wait_exchange("shutdown-1", finished=False)
        wait_until(lambda: len(up.send_times) >= 5, 10, what="five events sent")
        code = obs.stop(timeout=20)
        t.join(20)
        assert code == 0, obs.describe()
        db = obs.db_url.removeprefix("sqlite:///")
        rows = sqlite3.connect(db).execute("SELECT outcome, transport_error, events, text FROM exchanges").fetchall()
        assert len(rows) == 1, rows
        outcome, transport_error, events, text = rows[0]
        assert (outcome, transport_error) == ("interrupted", "observer shut down")
        assert events >= 5  # stream.start + at least four deltas reached the proxy
        assert text
        assert seen and seen[0] > 0  # the client had received data before the stop
    finally:
        obs.stop()
        obs.cleanup()


def _api_children(pid: int) -> list[int]:
    """The children of ``pid`` running ``observer api`` (Linux /proc; the capture worker is
    another child)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            if b"observer.cli" in argv and b"api" in argv:
                out.append(int(child))
    return out


def test_sigterm_lets_an_open_stream_finish_and_accepts_no_new_connection(upstream: UpstreamServer) -> None:
    """Issue 14 item 9: the stream open at SIGTERM ends normally (the client gets all of it, the
    record is ``completed``); a connection attempted during the drain is refused."""
    obs = ObserverProcess()  # drain_timeout_s: 30 s by default; the stream needs ~2 s
    obs.start()
    try:
        url = upstream.url("/v1/stream?script=long&n=20&gap_ms=100&tid=drain-1")
        body = b'{"version":"1.0","stream":true,"model":"m","messages":[{"role":"user","content":"hi"}]}'
        got: list = []

        def client() -> None:
            got.append(
                stream_request(
                    url,
                    proxy=obs.proxy_url,
                    ca_path=obs.ca_path,
                    content=body,
                    headers={"Content-Type": LLM_CONTENT_TYPE},
                )
            )

        t = threading.Thread(target=client, daemon=True)
        t.start()
        up = upstream.wait_exchange("drain-1", finished=False)
        wait_until(lambda: len(up.send_times) >= 3, 10, what="three events sent")
        assert obs.proc is not None
        obs.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: not port_open(obs.proxy_port), 5, what="the proxy stops listening")
        code = obs.proc.wait(20)
        t.join(20)
        assert code == 0, obs.describe()
        (res,) = got
        assert res.error is None and res.body == up.raw_body
        db = obs.db_url.removeprefix("sqlite:///")
        rows = sqlite3.connect(db).execute("SELECT outcome, transport_error FROM exchanges").fetchall()
        assert rows == [("completed", None)], rows
        assert "open exchanges may finish" in obs.tail(), obs.describe()
    finally:
        obs.stop()
        obs.cleanup()


def test_the_api_is_restarted_when_it_dies_and_the_proxy_keeps_serving(upstream: UpstreamServer) -> None:
    """Issue 14 item 9: ``observer run`` starts the API again (logged) instead of stopping the
    proxy: staff keep reaching their LLMs, and what they do meanwhile is recorded."""
    obs = ObserverProcess()
    obs.start()
    try:
        assert obs.proc is not None
        api = _api_children(obs.proc.pid)
        assert len(api) == 1, api
        os.kill(api[0], signal.SIGKILL)
        url = upstream.url("/v1/stream?tid=while-api-down")
        body = b'{"version":"1.0","stream":true,"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"session_id":"while-api-down"}}'
        res = stream_request(
            url, proxy=obs.proxy_url, ca_path=obs.ca_path, content=body, headers={"Content-Type": LLM_CONTENT_TYPE}
        )
        assert res.error is None and res.status == 200
        wait_until(lambda: obs.ready(), 20, what="the API answering again")
        again = _api_children(obs.proc.pid)
        assert len(again) == 1 and again != api, (api, again)
        assert obs.proc.poll() is None
        assert "the API process exited with code -9; the proxy keeps recording; restarting the API" in obs.tail()
        client = obs.api()
        assert client.wait_tid("while-api-down", timeout=15)["outcome"] == "completed"
        client.close()
    finally:
        obs.stop()
        obs.cleanup()
