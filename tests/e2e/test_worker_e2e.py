"""The observer worker process in a real ``observer run``: it exists (a child of the proxy), and
killing it mid-stream changes nothing for the client (every byte, in time) while the record of
that stream says what happened (``observer_error`` naming the signal, every byte counted) and the
next stream is recorded completely, in-process. Stopping the proxy stops the worker."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from tests.e2e.harness import LLM_CONTENT_TYPE, ObserverProcess, stream_request, wait_until
from tests.e2e.upstream import UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def children(pid: int) -> list[int]:
    """Live child pids of ``pid`` (Linux ``/proc/<pid>/task/*/children``)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def worker_pid(obs: ObserverProcess) -> int:
    def find() -> int | None:
        for kid in children(obs.proc.pid):  # type: ignore[union-attr]
            try:
                cmd = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"observer.capture.worker" in cmd:
                return kid
        return None

    return wait_until(find, 20, what="the observer worker process")


def request_body(tid: str) -> bytes:
    return json.dumps(
        {
            "version": "1.0",
            "stream": True,
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"session_id": tid},
        }
    ).encode()


def test_killing_the_worker_mid_stream_is_recorded_and_the_stream_goes_on(upstream: UpstreamServer) -> None:
    obs = ObserverProcess()
    obs.start()
    try:
        pid = worker_pid(obs)
        url = upstream.url("/v1/stream?script=long&n=40&gap_ms=50&tid=worker-kill-1")
        got: list = []

        def client() -> None:
            got.append(
                stream_request(
                    url,
                    proxy=obs.proxy_url,
                    ca_path=obs.ca_path,
                    content=request_body("worker-kill-1"),
                    headers={"Content-Type": LLM_CONTENT_TYPE},
                    timeout=30,
                )
            )

        t = threading.Thread(target=client, daemon=True)
        t.start()
        up = upstream.wait_exchange("worker-kill-1", finished=False)
        wait_until(lambda: len(up.send_times) >= 10, 15, what="ten events sent")
        os.kill(pid, signal.SIGKILL)
        t.join(30)
        (res,) = got
        up = upstream.wait_exchange("worker-kill-1")
        assert res.error is None
        assert res.body == up.raw_body  # every byte, unchanged

        api = obs.api()
        rec = api.wait_tid("worker-kill-1", timeout=20)
        assert rec["response_bytes"] == len(up.raw_body)
        assert rec["outcome"] == "unreadable"
        errors = [v["detail"] for v in rec["violations"] if v["kind"] == "observer_error"]
        assert errors == ["WorkerDied: worker exited (killed by signal 9)"], rec["violations"]
        assert obs.alive()

        # The next stream: recorded completely, in-process.
        url2 = upstream.url("/v1/stream?script=long&n=5&gap_ms=10&tid=worker-kill-2")
        res2 = stream_request(
            url2,
            proxy=obs.proxy_url,
            ca_path=obs.ca_path,
            content=request_body("worker-kill-2"),
            headers={"Content-Type": LLM_CONTENT_TYPE},
            timeout=30,
        )
        assert res2.error is None
        rec2 = api.wait_tid("worker-kill-2", timeout=20)
        assert rec2["outcome"] == "completed"
        assert rec2["violations"] == []
        assert rec2["text"]
        assert rec2["response_bytes"] == len(res2.body)
    finally:
        obs.stop()
        obs.cleanup()


def test_stopping_the_proxy_stops_its_worker(upstream: UpstreamServer) -> None:
    obs = ObserverProcess()
    obs.start()
    try:
        pid = worker_pid(obs)
        assert obs.stop(timeout=20) == 0, obs.describe()
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 10, what="the worker to exit")
    finally:
        obs.stop()
        obs.cleanup()


def test_killing_the_proxy_takes_its_worker_and_api_along(upstream: UpstreamServer) -> None:
    """``kill -9`` of ``observer run``: the kernel ends its API process (SIGTERM) and its worker
    (SIGKILL), so the next start finds its ports free (trial finding: the API kept port 8081)."""
    obs = ObserverProcess()
    obs.start()
    try:
        worker = worker_pid(obs)
        api = [k for k in children(obs.proc.pid) if k != worker]  # type: ignore[union-attr]
        assert len(api) == 1, api
        os.kill(obs.proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
        obs.proc.wait(10)  # type: ignore[union-attr]
        for pid in (worker, api[0]):
            wait_until(
                lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), 15, what=f"process {pid} to exit"
            )
        again = ObserverProcess(workdir=str(obs.workdir))
        again.proxy_port, again.api_port = obs.proxy_port, obs.api_port
        try:
            again.start()  # the same ports: free again
            assert again.alive()
        finally:
            again.stop()
    finally:
        obs.stop()
        obs.cleanup()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
