"""Hostile JSON values in ``openai.responses`` streams (found by a trial session): arrays or
objects where the adapter expects a string or an integer (``type``, ``item_id``,
``content_index``, ``summary_index``, ``item.type``, a content part's ``type``,
``response.output[].type``) were used as dict/set keys and raised ``TypeError`` out of
``StreamObserver.feed``; through ``feed_pending`` that became ``observer_error`` and the rest of
the stream went unobserved. Each is now an ``invalid_event`` of that event (or ignored where the
value only selects a kind), the same on the fast and the general path, and the stream goes on.
"""

from __future__ import annotations

import pytest

from observer.limits import Limits
from tests.wirefeed import load, observe

_REQUEST = load("openai.responses", "error_event").request
_FOLLOW = (
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","item_id":"m","output_index":0,"content_index":0,"delta":"ok"}\n\n'
)
_HOSTILE = [
    b'{"type":[]}',
    b'{"type":{}}',
    b'{"type":"response.output_text.delta","output_index":0,"content_index":[],"delta":"x"}',
    b'{"type":"response.output_text.delta","item_id":[],"delta":"x"}',
    b'{"type":"response.refusal.delta","content_index":[],"delta":"x"}',
    b'{"type":"response.output_text.done","content_index":{},"text":"x"}',
    b'{"type":"response.reasoning_summary_text.delta","summary_index":[],"delta":"x"}',
    b'{"type":"response.output_item.added","item":{"type":[]}}',
    b'{"type":"response.output_item.done","item":{"type":[]}}',
    b'{"type":"response.output_item.done","item":{"type":"message","content":[{"type":[]}]}}',
    b'{"type":"response.completed","response":{"output":[{"type":[]}]}}',
]


def _responses(body: bytes, *, general: bool, content_type: str = "text/event-stream") -> dict:
    return observe(
        "openai.responses",
        _REQUEST,
        [body],
        content_type=content_type,
        path="/v1/responses",
        limits=Limits(),
        general=general,
    )


@pytest.mark.parametrize("general", [False, True], ids=["fast", "general"])
@pytest.mark.parametrize("data", _HOSTILE, ids=[d.decode() for d in _HOSTILE])
def test_responses_unhashable_values_never_raise_out_of_feed(data, general):
    """A wrong-typed field is a violation of that event, never an exception out of
    ``StreamObserver.feed``; the next event is still observed (for ``response.completed``,
    which ends the stream, the text delta comes before it)."""
    hostile = b"data: " + data + b"\n\n"
    body = _FOLLOW + hostile if b"response.completed" in data else hostile + _FOLLOW
    record = _responses(body, general=general)
    assert "ok" in record["text"]
    assert "observer_error" not in [v["kind"] for v in record["violations"]]


def test_responses_type_array_fast_equals_general():
    """``{"type": []}``: the general path reports ``invalid_event`` and goes on; the fast lane
    (``etype in _CALL_DELTAS`` on a list) raises instead."""
    body = b'data: {"type":[]}\n\n' + _FOLLOW
    assert _responses(body, general=False) == _responses(body, general=True)


def test_responses_whole_body_unhashable_output_type_is_not_an_observer_error():
    """A non-streaming answer whose ``output[0].type`` is an array: ``finish`` catches the
    TypeError and records ``observer_error`` (outcome ``unreadable``) instead of an
    ``invalid_event`` for that item."""
    body = b'{"id":"resp_1","object":"response","status":"completed","model":"m","output":[{"type":[]}]}'
    record = _responses(body, general=False, content_type="application/json")
    assert "observer_error" not in [v["kind"] for v in record["violations"]]


@pytest.mark.parametrize("general", [False, True], ids=["fast", "general"])
@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (
            b'{"type":"response.output_text.delta","output_index":0,"content_index":[],"delta":"x"}',
            "response.output_text.delta: content_index is an array or object",
        ),
        (
            b'{"type":"response.output_text.delta","item_id":[],"delta":"x"}',
            "response.output_text.delta: item_id is an array or object",
        ),
        (
            b'{"type":"response.reasoning_summary_text.delta","summary_index":{},"delta":"x"}',
            "response.reasoning_summary_text.delta: summary_index is an array or object",
        ),
    ],
)
def test_responses_unusable_block_key_is_an_invalid_event(data, detail, general):
    """A delta whose block key is an array or object: one ``invalid_event`` naming the field,
    its text not applied, the next delta applied."""
    record = _responses(b"data: " + data + b"\n\n" + _FOLLOW, general=general)
    assert record["text"] == "ok"
    assert record["violations"][0] == {"kind": "invalid_event", "seq": None, "detail": detail}
