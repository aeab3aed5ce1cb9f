"""Stopping ``observer run`` (SIGTERM) while a stream is open still records that exchange, as
``interrupted``, with the text seen so far (trial finding: such records were silently lost)."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from pathlib import Path

import pytest

from tests.e2e.harness import LLM_CONTENT_TYPE, ObserverProcess, stream_request, wait_until
from tests.e2e.upstream import UpstreamServer

pytestmark = pytest.mark.e2e


def test_sigterm_records_open_stream_as_interrupted(upstream: UpstreamServer) -> None:
    obs = ObserverProcess()
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


def test_the_proxy_stops_when_its_api_exits() -> None:
    """``observer run`` exits with 1 when the API child it started exits (README, "Commands"):
    the proxy does not go on recording what nobody can query."""
    obs = ObserverProcess()
    obs.start()
    try:
        assert obs.proc is not None
        api = _api_children(obs.proc.pid)
        assert len(api) == 1, api
        os.kill(api[0], signal.SIGKILL)
        code = obs.proc.wait(15)
        assert code == 1, obs.describe()
        assert "the API process exited" in obs.tail(), obs.describe()
    finally:
        obs.stop()
        obs.cleanup()
