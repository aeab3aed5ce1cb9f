"""A resumed event stream through the real proxy (issue 16, item 8): a client reads a draft
stream whose events carry SSE ``id`` fields until the connection ends mid-event, then
reconnects as an ``EventSource`` does (WHATWG HTML §9.2: ``Last-Event-ID`` set to the id of the
last event it dispatched) and gets the rest. The replay upstream serves the wire fixtures
``llm-stream-1.0/event_ids`` and ``event_ids_resumed`` byte for byte.

Checked by hand from the fixtures: the client's last dispatched id is ``evt-3`` (the final event
of the first body is unterminated: never dispatched), the first record's ``last_event_id`` is
that id, the second record's ``request_last_event_id`` is what the client sent and its
``resumes_id`` is the first record; the bodies reach the client unchanged.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.e2e.replay_upstream import FIXTURES, ReplayUpstream

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CASE = "llm-stream-1.0"


@pytest.fixture(scope="module")
def upstream() -> Any:
    with ReplayUpstream(default_gap_ms=20) as up:
        yield up


def _last_dispatched_id(body: bytes) -> str | None:
    """The id a WHATWG EventSource holds after ``body``: the ``id`` of each block that a blank line
    dispatched (an unterminated last block is not)."""
    last = None
    blocks = body.decode().split("\n\n")
    for block in blocks[:-1]:  # the part after the last blank line was never dispatched
        for line in block.splitlines():
            if line.startswith("id: "):
                last = line[4:]
    return last


def test_a_reconnecting_client_is_linked_to_the_stream_it_resumes(recorded: Any, upstream: ReplayUpstream) -> None:
    tid = "e2e-" + uuid.uuid4().hex[:12]
    request = (FIXTURES / CASE / "event_ids.request.json").read_bytes()
    url = f"http://127.0.0.1:{upstream.http_port}/v1/stream?tid={tid}"
    headers = {"content-type": "application/llm-request+json; version=1.0", "x-upstream-case": f"{CASE}/event_ids"}
    with httpx.Client(proxy=recorded.proxy_url, trust_env=False, timeout=20) as client:
        first = client.post(url, content=request, headers=headers)
        assert first.content == (FIXTURES / CASE / "event_ids.sse").read_bytes()
        resume_from = _last_dispatched_id(first.content)
        assert resume_from == "evt-3"
        again = {**headers, "x-upstream-case": f"{CASE}/event_ids_resumed", "last-event-id": resume_from}
        second = client.post(url + "-2", content=request, headers=again)
        assert second.content == (FIXTURES / CASE / "event_ids_resumed.sse").read_bytes()
    one = recorded.api.wait_record(lambda r: r["path"].endswith(f"tid={tid}"), what="the first record")
    two = recorded.api.wait_record(lambda r: r["path"].endswith(f"tid={tid}-2"), what="the second record")
    assert (one["last_event_id"], one["request_last_event_id"], one["outcome"]) == ("evt-3", None, "truncated")
    assert (two["request_last_event_id"], two["last_event_id"], two["outcome"]) == ("evt-3", "evt-6", "completed")
    assert two["resumes_id"] == one["id"]
    assert one["resumes_id"] is None
