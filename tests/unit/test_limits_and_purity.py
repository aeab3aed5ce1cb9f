"""Bounded memory per stream (caps give recorded violations) and the pure-core import rule."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
    body = (
        START
        + delta(1, "abcdef")
        + delta(2, "ghij")
        + b'event: stream.end\ndata: {"v":"1.0","seq":3,"type":"stream.end"}\n\n'
    )
    rec = observe("llm-stream-1.0", REQ, [body], limits=Limits(max_stream_text_chars=8))
    assert rec["text"] == "abcdefgh"
    assert [v["kind"] for v in rec["violations"]] == ["oversize_stream"]


def test_http_error_body_capped():
    rec = observe(
        "llm-stream-1.0", REQ, [b"e" * 100], status=503, content_type="text/plain", limits=Limits(max_body_bytes=10)
    )
    assert rec["outcome"] == "http_error"
    assert rec["response_body"] == "e" * 10
    assert rec["response_bytes"] == 100


@pytest.mark.parametrize("cut", [0, 7, 30])
def test_gzip_http_error_body_kept_decoded(cut):
    """A gzip-encoded error answer is kept decoded, whatever part of it the decoder still
    held at the end (its tail comes out of ``close``)."""
    import gzip

    body = b'{"error":{"message":"overloaded"}}'
    wire = gzip.compress(body)
    rec = observe(
        "llm-stream-1.0",
        REQ,
        [wire[:cut], wire[cut:]],
        status=529,
        content_type="application/json",
        content_encoding="gzip",
    )
    assert rec["outcome"] == "http_error"
    assert rec["response_body"] == body.decode()


def test_truncated_gzip_is_a_truncated_stream():
    """A gzip body that stops mid-member (its checksum and size never came): what was decoded
    is kept and the stream counts as cut short."""
    import gzip

    wire = gzip.compress(START)
    rec = observe("llm-stream-1.0", REQ, [wire[:-6]], content_encoding="gzip")
    assert [v["kind"] for v in rec["violations"]] == ["missing_stream_end"]
    assert rec["outcome"] == "truncated"
    assert rec["model"] is not None


def test_whole_json_body_over_its_cap():
    """A non-streaming JSON answer larger than max_json_body_bytes: one oversize_event, no
    message, and the record says the observer could not read it (``unreadable``), not that the
    upstream cut it short (regression: ``truncated`` with ``missing_stream_end``)."""
    body = b'{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"content":"' + b"x" * 200 + b'"}}]}'
    rec = observe(
        "openai.chat",
        b'{"model":"m","messages":[]}',
        [body[:50], body[50:]],
        content_type="application/json",
        path="/v1/chat/completions",
        limits=Limits(max_json_body_bytes=100),
    )
    assert [v["kind"] for v in rec["violations"]] == ["oversize_event"]
    assert rec["outcome"] == "unreadable"
    assert rec["text"] == ""


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


PURE = [
    "observer/wire",
    "observer/dialects",
    "observer/reassembly.py",
    "observer/records.py",
    "observer/conversation.py",
    "observer/events.py",
    "observer/tap.py",
    "observer/limits.py",
    "observer/redact.py",
    "observer/response.py",
]
# Modules the pure core may not import (a dotted name or anything below it): proxy, database, web
# framework, event loop, threads and processes, clocks, randomness, files, network.
FORBIDDEN_MODULES = frozenset(
    {
        "mitmproxy",
        "sqlalchemy",
        "alembic",
        "fastapi",
        "starlette",
        "uvicorn",
        "asyncio",
        "socket",
        "ssl",
        "select",
        "selectors",
        "threading",
        "multiprocessing",
        "concurrent",
        "subprocess",
        "signal",
        "time",
        "random",
        "secrets",
        "uuid",
        "os",
        "pathlib",
        "shutil",
        "tempfile",
        "http",
        "urllib.request",
    }
)
# Names the pure core may not use, fully qualified (imports and aliases resolved): clock readings
# from otherwise allowed modules, and the builtins and streams that do I/O.
FORBIDDEN_NAMES = frozenset(
    {
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
        "builtins.open",
        "builtins.print",
        "builtins.input",
        "sys.stdin",
        "sys.stdout",
        "sys.stderr",
    }
)
_IO_BUILTINS = frozenset({"open", "print", "input"})


def _dotted(node: ast.expr) -> list[str] | None:
    """``a.b.c`` of an attribute chain on a plain name as ``["a", "b", "c"]``, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def impurities(source: str) -> list[str]:
    """What in Python ``source`` breaks the pure core's rule, one line each (``line N: ...``):
    imports of ``FORBIDDEN_MODULES`` and uses of ``FORBIDDEN_NAMES`` after resolving ``import``
    and ``from ... import ... as ...`` aliases (``from datetime import datetime as dt; dt.now()``
    is ``datetime.datetime.now``). Dynamic lookups (``getattr(datetime, "now")``) are not seen."""
    tree = ast.parse(source)
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the dotted name it stands for
    bound: set[str] = set()  # names the module binds itself (parameters, assignments, defs)
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                aliases[a.asname or top] = a.name if a.asname else top
            _check_import([a.name for a in node.names], node.lineno, found)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            _check_import([f"{node.module}.{a.name}" for a in node.names], node.lineno, found)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name) and isinstance(node.ctx, ast.Load):
            parts = _dotted(node)
            if parts is None:
                continue
            head = parts[0]
            builtin = head in _IO_BUILTINS and head not in bound and head not in aliases
            qualified = ".".join([f"builtins.{head}" if builtin else aliases.get(head, head), *parts[1:]])
            if qualified in FORBIDDEN_NAMES:
                found.append(f"line {node.lineno}: uses {qualified}")
    return found


def _check_import(names: list[str], line: int, found: list[str]) -> None:
    """Appends ``line N: imports NAME`` for each imported dotted name at or under a forbidden
    module."""
    for name in names:
        parts = name.split(".")
        if any(".".join(parts[:i]) in FORBIDDEN_MODULES for i in range(1, len(parts) + 1)):
            found.append(f"line {line}: imports {name}")


def _pure_files() -> list[Path]:
    root = Path(__file__).resolve().parents[2]
    return [p for entry in PURE for p in ([root / entry] if entry.endswith(".py") else (root / entry).rglob("*.py"))]


def test_core_is_sans_io():
    """The pure core imports no proxy, database, web framework, event loop, thread, clock or
    file/network module, and reads no clock (``datetime.now``) and does no console or file I/O."""
    files = _pure_files()
    assert len(files) >= 8
    found = [f"{path.name} {what}" for path in files for what in impurities(path.read_text())]
    assert found == []


@pytest.mark.mutation
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from datetime import datetime\ndef f():\n    return datetime.now()\n", "uses datetime.datetime.now"),
        ("import datetime\nx = datetime.datetime.utcnow()\n", "uses datetime.datetime.utcnow"),
        ("from datetime import date as d\nx = d.today\n", "uses datetime.date.today"),
        ("import datetime as dt\nx = dt.datetime.today()\n", "uses datetime.datetime.today"),
        ("import time\n", "imports time"),
        ("from time import monotonic as clock\n", "imports time.monotonic"),
        ("import os.path\n", "imports os.path"),
        ("from urllib import request\n", "imports urllib.request"),
        ("def f(p):\n    return open(p).read()\n", "uses builtins.open"),
        ("import sys\nsys.stderr.write('x')\n", "uses sys.stderr"),
    ],
)
def test_purity_guard_flags_clocks_and_io(source, expected):
    """Mutation check: a module that reads a clock or does I/O, however it is imported, is
    flagged, so the guard above can fail."""
    assert [w.split(": ", 1)[1] for w in impurities(source)] == [expected]


@pytest.mark.mutation
@pytest.mark.parametrize("name", ["observer/reassembly.py", "observer/records.py", "observer/wire/sse.py"])
def test_purity_guard_flags_a_clock_added_to_the_core(name):
    """Mutation check: a real core module with one ``datetime.now()`` added (as an import of
    ``datetime`` and as the ``datetime`` class records.py already imports) is flagged."""
    source = (Path(__file__).resolve().parents[2] / name).read_text()
    assert impurities(source) == []
    assert impurities(source + "\nimport datetime\n_T = datetime.datetime.now()\n")[-1].endswith(
        "uses datetime.datetime.now"
    )
    assert impurities(source + "\nfrom datetime import datetime\n_T = datetime.now()\n")[-1].endswith(
        "uses datetime.datetime.now"
    )


def test_purity_guard_allows_pure_time_arithmetic():
    """Converting a given time (``datetime.fromtimestamp``) and a local variable that happens to
    be called ``now`` or ``open`` are not clock readings or I/O."""
    source = (
        "from datetime import datetime, timezone\n"
        "def f(now, open):\n"
        "    return datetime.fromtimestamp(now, tz=timezone.utc), open.now, now\n"
    )
    assert impurities(source) == []


def test_integers_beyond_64_bits_are_invalid_not_stored():
    """seq and token counts must fit the store's BIGINT: 2^63 is an invalid event, not a value."""
    body = (
        START
        + b'event: usage\ndata: {"v":"1.0","seq":1,"type":"usage","input_tokens":9223372036854775808,"output_tokens":3}\n\n'
        + b'event: stream.end\ndata: {"v":"1.0","seq":9223372036854775808,"type":"stream.end"}\n\n'
    )
    rec = observe("llm-stream-1.0", REQ, [body])
    assert rec["usage"] == {
        "input_tokens": None,
        "output_tokens": 3,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": True,
    }
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


def test_event_cap_stops_observation():
    body = START + b"".join(delta(i, "x") for i in range(1, 30)) + END
    rec = observe("llm-stream-1.0", REQ, [body], limits=Limits(max_stream_events=10))
    assert rec["text"] == "x" * 9
    assert [v["kind"] for v in rec["violations"]] == ["oversize_stream"]
    assert rec["outcome"] == "unreadable"
