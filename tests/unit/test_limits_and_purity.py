"""Bounded memory per stream (caps give recorded violations) and the pure-core import rule."""

from __future__ import annotations

import ast
from pathlib import Path

from observer.limits import Limits
from tests.wirefeed import observe

REQ = b'{"version":"1.0","stream":true,"model":"m","messages":[]}'
START = b'event: stream.start\ndata: {"v":"1.0","seq":0,"type":"stream.start","model":"m"}\n\n'
END = b'event: stream.end\ndata: {"v":"1.0","seq":2,"type":"stream.end"}\n\n'


def delta(seq: int, text: str) -> bytes:
    return (
        b'event: content.delta\ndata: {"v":"1.0","seq":%d,"type":"content.delta","index":0,"role":"assistant",'
        b'"delta":{"text":"%s"}}\n\n' % (seq, text.encode())
    )


def test_oversize_event_is_skipped_and_flagged():
    """An event over max_event_bytes is dropped with one violation; the stream goes on."""
    big = delta(1, "x" * 5000)
    rec = observe("llm-stream-1.0", REQ, [START, big, END], limits=Limits(max_event_bytes=1000))
    assert [v["kind"] for v in rec["violations"]] == ["oversize_event"]
    assert rec["outcome"] == "completed"
    assert rec["text"] == ""


def test_stream_text_cap():
    """Text beyond max_stream_text_chars is dropped once, flagged once."""
    body = START + delta(1, "abcdef") + delta(2, "ghij") + b'event: stream.end\ndata: {"v":"1.0","seq":3,"type":"stream.end"}\n\n'
    rec = observe("llm-stream-1.0", REQ, [body], limits=Limits(max_stream_text_chars=8))
    assert rec["text"] == "abcdefgh"
    assert [v["kind"] for v in rec["violations"]] == ["oversize_stream"]


def test_http_error_body_capped():
    rec = observe("llm-stream-1.0", REQ, [b"e" * 100], status=503, content_type="text/plain", limits=Limits(max_body_bytes=10))
    assert rec["outcome"] == "http_error"
    assert rec["response_body"] == "e" * 10
    assert rec["response_bytes"] == 100


def test_unsupported_encoding_passes_through_flagged():
    """A clean end of a stream we could not decode: unreadable, not the upstream's truncation."""
    rec = observe("llm-stream-1.0", REQ, [START], content_encoding="compress")
    assert [v["kind"] for v in rec["violations"]] == ["content_decoding_error"]
    assert rec["outcome"] == "unreadable"


def test_corrupt_gzip_flagged():
    rec = observe("llm-stream-1.0", REQ, [b"\x1f\x8b\x08\x00garbage-garbage"], content_encoding="gzip")
    assert rec["violations"][0]["kind"] == "content_decoding_error"


def test_non_sse_2xx_flagged():
    rec = observe("llm-stream-1.0", REQ, [b'{"ok":true}'], content_type="application/json")
    assert [v["kind"] for v in rec["violations"]] == ["unexpected_content_type"]
    assert rec["outcome"] == "unreadable"
    assert rec["response_body"] == '{"ok":true}'


PURE = ["observer/wire", "observer/dialects", "observer/reassembly.py", "observer/records.py", "observer/events.py",
        "observer/tap.py", "observer/limits.py", "observer/redact.py"]  # fmt: skip
FORBIDDEN = {"mitmproxy", "sqlalchemy", "fastapi", "asyncio", "time", "socket", "threading", "uvicorn", "datetime.now"}


def test_core_is_sans_io():
    """The pure core imports no proxy, database, web framework, event loop or clock."""
    root = Path(__file__).resolve().parents[2]
    files = [p for entry in PURE for p in ([root / entry] if entry.endswith(".py") else (root / entry).rglob("*.py"))]
    assert len(files) >= 8
    for path in files:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_integers_beyond_64_bits_are_invalid_not_stored():
    """seq and token counts must fit the store's BIGINT: 2^63 is an invalid event, not a value."""
    body = (
        START
        + b'event: usage\ndata: {"v":"1.0","seq":1,"type":"usage","input_tokens":9223372036854775808,"output_tokens":3}\n\n'
        + b'event: stream.end\ndata: {"v":"1.0","seq":9223372036854775808,"type":"stream.end"}\n\n'
    )
    rec = observe("llm-stream-1.0", REQ, [body])
    assert rec["usage"] == {"input_tokens": None, "output_tokens": 3, "reported": True}
    assert [(v["kind"], v["seq"]) for v in rec["violations"]] == [("invalid_event", 1), ("invalid_event", None)]
    assert rec["outcome"] == "completed"


def test_violation_tool_call_and_block_caps():
    """Millions of bad events must not make a multi-GB record: items beyond the caps are
    counted in one oversize_record violation (hostile-stream finding)."""
    bad = b"data: 1\n\n" * 50
    calls = b"".join(
        b'event: tool.call\ndata: {"v":"1.0","seq":%d,"type":"tool.call","index":%d,"id":"c%d","name":"t","arguments":"{}"}\n\n'
        % (i, i, i)
        for i in range(1, 8)
    )
    blocks = b"".join(delta(i, "x").replace(b'"index":0', b'"index":%d' % i) for i in range(8, 14))
    limits = Limits(max_violations=5, max_tool_calls=3, max_blocks=4)
    rec = observe("llm-stream-1.0", REQ, [START, calls, blocks, bad], limits=limits)
    assert len(rec["tool_calls"]) == 3
    assert [b["index"] for b in rec["blocks"]] == [8, 9, 10, 11]
    assert len(rec["violations"]) == 7
    assert rec["violations"][-2]["kind"] == "missing_stream_end"  # end-of-stream facts are never capped
    assert rec["violations"][-1] == {
        "kind": "oversize_record",
        "seq": None,
        "detail": "dropped beyond the per-record caps: 2 content block event, 4 tool call, "
        "50 violation invalid_event, 2 violation undeclared_tool",
    }


def test_long_names_and_details_are_clipped():
    """Trial finding: 1000 tool calls with 1 MB names made a 2 GB record. Names, ids and
    violation details are clipped (with a marker), arguments count against the text cap."""
    name = "n" * 100_000
    call = (
        b'event: tool.call\ndata: {"v":"1.0","seq":1,"type":"tool.call","index":0,"id":"c1","name":"%s",'
        b'"arguments":"{}"}\n\n' % name.encode()
    )
    rec = observe("llm-stream-1.0", REQ, [START, call, END])
    (tc,) = rec["tool_calls"]
    assert tc["name"] == "n" * 1024 + "…[98976 chars cut]"
    (v,) = [v for v in rec["violations"] if v["kind"] == "undeclared_tool"]
    assert len(v["detail"]) <= 512 + len("…[99999999 chars cut]")


def test_one_char_deltas_are_coalesced():
    """Trial finding: 8M one-character deltas held ~58 B per character; pieces are joined."""
    from observer.reassembly import _append, _Parts

    parts = _Parts()
    for _ in range(10_000):
        _append(parts, "x")
    assert len(parts) < 256 and "".join(parts) == "x" * 10_000


def test_event_cap_stops_observation():
    body = START + b"".join(delta(i, "x") for i in range(1, 30)) + END
    rec = observe("llm-stream-1.0", REQ, [body], limits=Limits(max_stream_events=10))
    assert rec["text"] == "x" * 9
    assert [v["kind"] for v in rec["violations"]] == ["oversize_stream"]
    assert rec["outcome"] == "unreadable"
