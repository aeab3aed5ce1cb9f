"""Request side of the draft standard: media-type detection (draft §4.1, §9.1) and the request
envelope (draft §4.2-§4.7), with expected values written by hand."""

from __future__ import annotations

import pytest

from observer.dialects.base import RequestView
from observer.dialects.registry import default_registry
from observer.dialects.standard import StandardDialect, base64_decoded_size


def view(ctype: str | None, method: str = "POST") -> RequestView:
    headers = {} if ctype is None else {"content-type": ctype}
    return RequestView(method, "llm.example", "/v1/stream", headers)


@pytest.mark.parametrize(
    "ctype",
    [
        "application/llm-request+json",
        "APPLICATION/LLM-REQUEST+JSON",
        "application/llm-request+json; version=1.0; charset=utf-8",
        "  application/llm-request+json ;version=1.0",
    ],
)
def test_media_type_detected(ctype):
    assert default_registry().classify(view(ctype)).name == "llm-stream-1.0"


@pytest.mark.parametrize(
    "ctype",
    [None, "", "application/json", "application/llm-request", "text/event-stream", "application/llm-request+jsonx"],
)
def test_other_media_types_not_detected(ctype):
    assert default_registry().classify(view(ctype)) is None


@pytest.mark.parametrize(
    ("b64", "size"),
    [
        ("", 0),
        ("TQ==", 1),
        ("TWE=", 2),
        ("TWFu", 3),
        ("TWFuTQ==", 4),
        ("TQ", 1),
        ("TWE", 2),
        ("TW\nFu", 3),
        ("iVBORw0KGgo=", 8),
    ],
)
def test_base64_decoded_size(b64, size):
    """RFC 4648 §10 test vectors ("M", "Ma", "Man"), unpadded and with line breaks."""
    assert base64_decoded_size(b64) == size


def test_binary_parts_recorded_by_type_and_size():
    body = (
        b'{"version":"1.0","stream":true,"model":"m","messages":[{"role":"user","content":['
        b'{"type":"text","text":"look"},'
        b'{"type":"document","media_type":"application/pdf","data":"JVBERi0xLjQK"},'
        b'{"type":"audio","media_type":"audio/wav","data":"UklGRg=="}]}]}'
    )
    facts, violations = StandardDialect().parse_request(body)
    assert violations == []
    assert facts.messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "document", "media_type": "application/pdf", "data_bytes": 9},
                {"type": "audio", "media_type": "audio/wav", "data_bytes": 4},
            ],
        }
    ]
    assert b"JVBERi0" not in repr(facts.to_dict()).encode()


@pytest.mark.parametrize(
    ("body", "kinds"),
    [
        (b"not json", ["invalid_request"]),
        (b"[1,2]", ["invalid_request"]),
        (b'{"version":"1.0","stream":true,"model":"m"}', ["invalid_request"]),
        (b'{"version":"2.0","stream":true,"model":"m","messages":[]}', ["unsupported_version"]),
        (b'{"version":"1.0","stream":true,"model":"m","messages":[],"tools":{}}', ["invalid_request"]),
        (b'{"version":"1.0","stream":true,"model":"m","messages":[],"metadata":[]}', ["invalid_request"]),
    ],
)
def test_bad_requests_give_violations_not_errors(body, kinds):
    facts, violations = StandardDialect().parse_request(body)
    assert [v.kind for v in violations] == kinds
    assert facts.body_bytes == len(body)


def test_unknown_fields_and_extensions_ignored():
    body = b'{"version":"1.0","stream":true,"model":"m","messages":[],"x-new":1,"extensions":{"acme:beta":{"a":1}}}'
    facts, violations = StandardDialect().parse_request(body)
    assert violations == []
    assert facts.extensions == ["acme:beta"]
    assert facts.model == "m"


@pytest.mark.parametrize(
    ("body", "details"),
    [
        (b'{"version":"1.0","stream":"yes","model":"m","messages":[]}', ["stream is not a boolean"]),
        (b'{"version":"1.0","stream":false,"model":"m","messages":[]}', ["stream is false (draft §4.2: MUST be true)"]),
        (b'{"version":"1.0","stream":true,"model":42,"messages":[]}', ["model is not a string"]),
        (
            b'{"version":"1.0","stream":true,"model":"m","messages":[],"extensions":[1,2]}',
            ["extensions is not an object"],
        ),
        (
            b'{"version":"1.0","stream":true,"model":"m","messages":["hi",{"content":"x"}]}',
            ["2 message(s) without an object and role"],
        ),
        (
            b'{"version":"1.0","stream":true,"model":"m","messages":[],"metadata":{"request_id":7}}',
            ["metadata.request_id is not a string"],
        ),
    ],
)
def test_wrong_types_are_flagged(body, details):
    """Found by the adversarial trial: wrongly typed fields were silently accepted."""
    facts, violations = StandardDialect().parse_request(body)
    assert [(v.kind, v.detail) for v in violations] == [("invalid_request", d) for d in details]


def test_non_object_messages_kept_as_sent():
    facts, _ = StandardDialect().parse_request(b'{"version":"1.0","stream":true,"model":"m","messages":["hi"]}')
    assert facts.messages == ["hi"]


def test_repeated_content_type_header_still_detected():
    """Trial finding: a second Content-Type line (joined as "a, b") hid the request."""
    for value in ["application/llm-request+json, text/plain", "text/plain, application/llm-request+json; version=1.0"]:
        assert default_registry().classify(view(value)).name == "llm-stream-1.0"


def test_non_post_is_flagged():
    body = b'{"version":"1.0","stream":true,"model":"m","messages":[]}'
    _, violations = StandardDialect().parse_request(body, view("application/llm-request+json", method="GET"))
    assert [(v.kind, v.detail) for v in violations] == [("invalid_request", "method GET (draft §3: POST)")]
