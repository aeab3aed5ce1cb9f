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
