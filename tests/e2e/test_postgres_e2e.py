"""``observer run --db postgresql+psycopg://...``: the production set-up, end to end. The record
of a streamed draft §5.5 exchange read back through the API from PostgreSQL matches the one
written by hand (draft §5.5), the same as on SQLite."""

from __future__ import annotations

import json

import pytest

from tests.e2e.harness import LLM_CONTENT_TYPE, ObserverProcess, assert_subset, stream_request
from tests.e2e.upstream import REQUEST_ID, UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(90)]


def test_observer_on_postgresql(upstream: UpstreamServer, pg_migrated_url: str) -> None:
    tid = "pg-e2e-1"
    body = json.dumps(
        {
            "version": "1.0",
            "stream": True,
            "model": "example-model",
            "metadata": {"request_id": REQUEST_ID, "session_id": tid},
            "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
        }
    ).encode()
    with ObserverProcess(db_url=pg_migrated_url) as obs:
        res = stream_request(
            upstream.url(f"/v1/stream?script=complete_example&gap_ms=20&tid={tid}"),
            proxy=obs.proxy_url,
            ca_path=obs.ca_path,
            content=body,
            headers={"Content-Type": LLM_CONTENT_TYPE},
        )
        assert res.error is None
        rec = obs.api().wait_tid(tid)
    assert_subset(
        rec,
        {
            "dialect": "llm-stream-1.0",
            "scheme": "http",
            "port": upstream.http_port,
            "request_id": REQUEST_ID,
            "model": "example-model",
            "text": "The weather in Vienna is 24C and sunny.",
            "blocks": [
                {
                    "index": 0,
                    "type": "text",
                    "text": "The weather in Vienna is 24C and sunny.",
                    "stop_reason": "end_turn",
                }
            ],
            "usage": {"input_tokens": 42, "output_tokens": 8, "reported": True},
            "stop_reason": "end_turn",
            "outcome": "completed",
            "violations": [],
        },
    )


def test_two_observers_write_one_database_each_with_its_own_chain(
    upstream: UpstreamServer, pg_migrated_url: str, tmp_path
) -> None:
    """Two ``observer run`` processes (two hosts, in production) on one PostgreSQL store: each
    has its own writer id, numbers its records 1..n and signs its own checkpoints; ``observer
    verify`` with both public keys passes, with one of them names the other writer's key as
    unknown."""
    import subprocess

    import sqlalchemy as sa

    from tests.e2e.harness import tool

    per_writer = 4
    procs = [ObserverProcess(db_url=pg_migrated_url, workdir=str(tmp_path / name)) for name in ("a", "b")]
    with procs[0] as a, procs[1] as b:
        for obs, name in ((a, "a"), (b, "b")):
            for i in range(per_writer):
                res = stream_request(
                    upstream.url(f"/v1/stream?script=complete_example&gap_ms=1&tid=mw-{name}-{i}"),
                    proxy=obs.proxy_url,
                    ca_path=obs.ca_path,
                    content=json.dumps({"version": "1.0", "stream": True, "model": "m", "messages": []}).encode(),
                    headers={"Content-Type": LLM_CONTENT_TYPE},
                )
                assert res.error is None
        for obs, name in ((a, "a"), (b, "b")):
            obs.api().wait_tid(f"mw-{name}-{per_writer - 1}")
    engine = sa.create_engine(pg_migrated_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT writer_id, seq FROM exchanges ORDER BY writer_id, seq")).all()
    finally:
        engine.dispose()
    writers = sorted({w for w, _ in rows})
    assert len(writers) == 2
    assert all([s for w, s in rows if w == writer] == list(range(1, per_writer + 1)) for writer in writers)
    keys = [str(tmp_path / name / "data" / "checkpoint-key.pem") for name in ("a", "b")]

    def verify(*key_paths: str) -> subprocess.CompletedProcess[str]:
        argv = [tool("observer"), "verify", "--db", pg_migrated_url]
        for k in key_paths:
            argv += ["--key", k]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)

    both = verify(*keys)
    assert both.returncode == 0, both.stdout + both.stderr
    assert f"verified: {2 * per_writer} entries of 2 writers" in both.stdout
    one = verify(keys[0])
    assert one.returncode == 1 and "signed by an unknown key" in one.stderr
