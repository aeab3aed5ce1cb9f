"""Test helpers: run a wire fixture through the whole sans-IO pipeline in a given chunking.

Fixture layout (``tests/fixtures/wire/<dialect name>/``), per case:
``<case>.<sse|ndjson|json|txt>`` the response body exactly as on the wire; ``<case>.request.json``
the request body (optional); ``<case>.expected.json`` the expected record subset, written by
hand; ``<case>.meta.json`` (optional) ``{"path", "status", "content_type", "content_encoding",
"request_headers", "response_headers", "end"}`` when the defaults do not fit; a folder's
``_defaults.meta.json`` gives defaults for all its cases.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from observer.dialects.base import RequestView
from observer.dialects.registry import default_registry
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.records import Exchange
from observer.response import ResponseSpec, StreamEnd, assemble
from observer.tap import StreamObserver

FIXTURES = Path(__file__).parent / "fixtures" / "wire"
T0 = 1_749_292_800.0  # request start, epoch seconds
BODY_TYPES = {".sse": "text/event-stream", ".ndjson": "application/x-ndjson", ".json": "application/json",
              ".txt": "text/plain"}  # fmt: skip


@dataclass
class Case:
    """One wire fixture: bodies, the hand-written expectation and how it was exchanged."""

    dialect: str
    name: str
    body: bytes
    request: bytes
    expected: dict[str, Any]
    path: str = "/v1/stream"
    status: int = 200
    content_type: str = "text/event-stream"
    content_encoding: str | None = None
    request_headers: dict[str, str] = field(default_factory=dict)
    response_headers: dict[str, str] = field(default_factory=dict)
    end: EndCause = EndCause.EOF


def load(dialect: str, name: str) -> Case:
    d = FIXTURES / dialect
    bodies = [p for p in d.glob(f"{name}.*") if p.suffix in BODY_TYPES and not p.name.endswith((".request.json",
              ".expected.json", ".meta.json"))]  # fmt: skip
    assert len(bodies) == 1, f"{dialect}/{name}: expected one body file, found {bodies}"
    body = bodies[0]
    req = d / f"{name}.request.json"
    meta_path = d / f"{name}.meta.json"
    defaults_path = d / "_defaults.meta.json"
    meta = json.loads(defaults_path.read_text()) if defaults_path.exists() else {}
    meta.update(json.loads(meta_path.read_text()) if meta_path.exists() else {})
    return Case(
        dialect=dialect,
        name=name,
        body=body.read_bytes(),
        request=req.read_bytes() if req.exists() else b"",
        expected=json.loads((d / f"{name}.expected.json").read_text(encoding="utf-8")),
        path=meta.get("path", "/v1/stream"),
        status=meta.get("status", 200),
        content_type=meta.get("content_type", BODY_TYPES[body.suffix]),
        content_encoding=meta.get("content_encoding"),
        request_headers=meta.get("request_headers", {}),
        response_headers=meta.get("response_headers", {}),
        end=EndCause(meta.get("end", "eof")),
    )


def load_case(dialect: str, case: str) -> tuple[bytes, bytes, dict[str, Any]]:
    """(response body bytes, request body bytes, hand-written expected record subset)."""
    c = load(dialect, case)
    return c.body, c.request, c.expected


def cases(dialect: str) -> list[str]:
    return sorted(p.name.removesuffix(".expected.json") for p in (FIXTURES / dialect).glob("*.expected.json"))


def dialect_dirs() -> list[str]:
    """Fixture folders named after a registered dialect."""
    names = set(default_registry().names)
    return sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name in names)


def view_of(case: Case) -> RequestView:
    headers = {"content-type": "application/json", **{k.lower(): v for k, v in case.request_headers.items()}}
    return RequestView("POST", "127.0.0.1", case.path, headers)


def observe_case(case: Case, chunks: Iterable[bytes], *, limits: Limits = Limits()) -> dict[str, Any]:
    """Feeds ``chunks`` as the response of ``case`` and returns the record dict."""
    return observe(
        case.dialect, case.request, chunks, status=case.status, content_type=case.content_type,
        content_encoding=case.content_encoding, end=case.end, limits=limits, path=case.path,
        request_headers=case.request_headers,
    )  # fmt: skip


def observe(
    dialect_name: str,
    request_body: bytes,
    chunks: Iterable[bytes],
    *,
    status: int = 200,
    content_type: str = "text/event-stream",
    content_encoding: str | None = None,
    end: EndCause = EndCause.EOF,
    limits: Limits = Limits(),
    path: str = "/v1/stream",
    request_headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Feeds ``chunks`` as the response of ``request_body`` (sent as ``POST path``) and returns
    the record dict."""
    dialect = default_registry().get(dialect_name)
    view = RequestView("POST", "127.0.0.1", path, {"content-type": "application/json", **(request_headers or {})})
    facts, violations = dialect.parse_request(request_body, view)
    ex = Exchange(
        id="test", dialect=dialect.name, host="127.0.0.1", path=path, method="POST",
        http_version="HTTP/1.1", started_at=datetime.fromtimestamp(T0, tz=timezone.utc), status_code=status,
        request=facts,
    )  # fmt: skip
    spec = ResponseSpec(dialect.name, status, content_type, content_encoding, T0, path, tuple(facts.tool_names),
                        facts.request_id, facts.stream, limits)  # fmt: skip
    obs = StreamObserver(dialect, spec)
    t = T0
    for chunk in chunks:
        t += 0.01
        obs.feed(chunk, t)
    return assemble(ex, list(violations), obs.finish(StreamEnd(end, t + 0.01))).to_dict()


def assert_matches(record: dict[str, Any], expected: dict[str, Any]) -> None:
    """Every key of ``expected`` equals the record's; a violation ``detail`` of ``"*"`` matches any."""
    for key, want in expected.items():
        got = record[key]
        if key == "violations":
            assert [(v["kind"], v["seq"]) for v in got] == [(v["kind"], v["seq"]) for v in want], got
            for g, w in zip(got, want, strict=True):
                if w["detail"] != "*":
                    assert g["detail"] == w["detail"]
        else:
            assert got == want, f"{key}: {got!r} != {want!r}"


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates and out-of-range ignored)."""
    cuts = sorted({p for p in points if 0 < p < len(data)})
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
