"""End to end: ``mitmdump -s addons/llm_audit.py -w FILE`` records exchanges live and writes a
flow dump; ``observer ingest FILE`` into a fresh store gives the same records, field by field.

Not compared: ``id`` (a live record's is UUID 4, an ingested one's UUID 5 of its flow),
``provenance`` (null live; the file, its SHA-256 and the flow when ingested, checked here) and
``ttft_s`` (the arrival times of the chunks are not in a dump: null when ingested). The proxy
keeps streamed bodies in the dump only with ``--set store_streamed_bodies=true``; without it,
the same exchanges are named as "without a response body" and not recorded (checked too).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from mitmproxy.io import FlowReader

from observer.config import SPECS
from observer.store.store import AuditStore
from tests.e2e.harness import LLM_CONTENT_TYPE, REPO, MitmdumpProcess, stream_request, tool
from tests.e2e.upstream import COMPLETE_TEXT, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

REQUEST = {
    "version": "1.0",
    "stream": True,
    "model": "example-model-latest",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
    "metadata": {"user_id": "user-ingest"},
}
NOT_COMPARED = ("provenance", "ttft_s")


class DumpingMitmdump(MitmdumpProcess):
    """``MitmdumpProcess`` with ``-w FILE``: mitmproxy's own flow dump beside the addon."""

    def __init__(self, *args: Any, dump: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dump = dump

    def build_argv(self) -> list[str]:
        return [*super().build_argv(), "-w", str(self.dump)]


def _live_run(upstream: UpstreamServer, workdir: Path, store_bodies: bool) -> tuple[Path, str]:
    """Three requests through a live proxy writing a dump: a streamed exchange over HTTP/1.1, one
    over HTTP/2 and TLS with a gzip body (an upload without Content-Length), and a request that
    is not LLM traffic. Returns (dump, live store URL) after the proxy stopped."""
    workdir.mkdir()
    live_db = f"sqlite:///{workdir / 'live.db'}"
    sets = {"observer_db": live_db, "store_streamed_bodies": "true" if store_bodies else "false"}
    if "proxy_allow_loopback" in SPECS:  # the local upstream is on loopback
        sets["observer_proxy_allow_loopback"] = "true"
    dump = workdir / "flows.mitm"
    proxy = DumpingMitmdump(REPO / "addons" / "llm_audit.py", workdir=str(workdir), quiet=False, sets=sets, dump=dump)
    with proxy:
        plain = stream_request(
            f"http://127.0.0.1:{upstream.http_port}/v1/stream?tid=ingest-h1", proxy=proxy.proxy_url, json_body=REQUEST
        )
        tls = stream_request(
            f"https://127.0.0.1:{upstream.https_port}/v1/stream?tid=ingest-h2&gzip=1",
            proxy=proxy.proxy_url,
            ca_path=proxy.ca_path,
            http2=True,
            content=iter([json.dumps(REQUEST).encode()]),  # type: ignore[arg-type]  # (a stream: no Content-Length)
            headers={"Content-Type": LLM_CONTENT_TYPE},
        )
        other = stream_request(
            f"http://127.0.0.1:{upstream.http_port}/v1/json", proxy=proxy.proxy_url, method="GET", timeout=10
        )
        assert (plain.status, tls.status, tls.http_version, other.status) == (200, 200, "HTTP/2", 200), proxy.describe()
    return dump, live_db


def _ingest(dump: Path, db: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSERVER_")}
    return subprocess.run(
        [tool("observer"), "ingest", "--db", db, "--key", str(cwd / "ingest-key.pem"), str(dump)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _records(url: str) -> list[dict[str, Any]]:
    store = AuditStore(url)
    try:
        with store.engine.connect() as conn:
            ids = conn.scalars(sa.text("SELECT id FROM exchanges ORDER BY started_at")).all()
        return [store.get(i) for i in ids]  # type: ignore[misc]
    finally:
        store.dispose()


def test_a_dump_of_a_live_run_ingests_to_the_live_records(upstream: UpstreamServer, tmp_path: Path) -> None:
    dump, live_db = _live_run(upstream, tmp_path / "live", store_bodies=True)
    live = _records(live_db)
    assert [(r["http_version"], r["outcome"], r["text"], r["request"]["end_user"]) for r in live] == [
        ("HTTP/1.1", "completed", COMPLETE_TEXT, "user-ingest"),
        ("HTTP/2.0", "completed", COMPLETE_TEXT, "user-ingest"),
    ]
    fresh = f"sqlite:///{tmp_path / 'ingested.db'}"
    done = _ingest(dump, fresh, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"observer: {dump}: 3 flows read: 2 records stored, 0 already stored, 1 not LLM traffic\n" in done.stdout
    ingested = _records(fresh)
    assert len(ingested) == 2
    with open(dump, "rb") as f:
        flow_ids = [flow.id for flow in FlowReader(f).stream()]
    sha = hashlib.sha256(dump.read_bytes()).hexdigest()
    for was, now in zip(live, ingested, strict=True):
        for key in was:
            if key not in NOT_COMPARED:
                assert now[key] == was[key], f"{key}: ingested {now[key]!r}, live {was[key]!r}"
        assert was["provenance"] is None and was["ttft_s"] is not None and now["ttft_s"] is None
        prov = now["provenance"]
        assert (prov["source"], prov["file"], prov["file_sha256"], prov["file_format"]) == (
            "offline_ingest",
            str(dump),
            sha,
            "mitmproxy",
        )
        assert prov["flow_id"] in flow_ids
    check = subprocess.run(
        [tool("observer"), "verify", "--db", fresh, "--key", str(tmp_path / "ingest-key.pem")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("OBSERVER_")},
    )
    assert check.returncode == 0 and "verified: 2 entries of 1 writers, 1 checkpoints checked" in check.stdout, check
    again = _ingest(dump, fresh, tmp_path)
    assert again.returncode == 0
    assert "3 flows read: 0 records stored, 2 already stored, 1 not LLM traffic" in again.stdout
    assert len(_records(fresh)) == 2
    # A flow recorded live has the id its ingest gives it: the dump ingested into the live store
    # adds nothing (trial finding: the README's dump-and-ingest lines stored every exchange twice).
    assert [r["id"] for r in ingested] == [r["id"] for r in live]
    into_live = _ingest(dump, live_db, tmp_path)
    assert into_live.returncode == 0, into_live.stdout + into_live.stderr
    assert "3 flows read: 0 records stored, 2 already stored, 1 not LLM traffic" in into_live.stdout
    assert [r["id"] for r in _records(live_db)] == [r["id"] for r in live]


def test_a_dump_without_the_streamed_bodies_says_so(upstream: UpstreamServer, tmp_path: Path) -> None:
    """The proxy's default: streamed bodies are not kept (every LLM response, and the upload
    without Content-Length), so the LLM exchanges cannot be recorded from the dump; each is
    named, the counts said, nothing made up."""
    dump, _live = _live_run(upstream, tmp_path / "live", store_bodies=False)
    done = _ingest(dump, f"sqlite:///{tmp_path / 'ingested.db'}", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "3 flows read: 0 records stored, 0 already stored, 1 not LLM traffic, 1 without a response body in the file,"
        " 1 without a request body in the file\n"
    ) in done.stdout
    assert done.stderr.count("but the file holds no response body") == 1, done.stderr
    assert done.stderr.count("but the file holds no request body") == 1, done.stderr
    assert "Traceback" not in done.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
