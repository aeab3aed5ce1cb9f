"""Test helpers: run a wire fixture through the whole sans-IO pipeline in a given chunking."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from observer.dialects.base import RequestView
from observer.dialects.registry import default_registry
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.records import Exchange
from observer.tap import StreamObserver

FIXTURES = Path(__file__).parent / "fixtures" / "wire"
T0 = 1_749_292_800.0  # request start, epoch seconds


def load_case(dialect: str, case: str) -> tuple[bytes, bytes, dict[str, Any]]:
    """(response body bytes, request body bytes, hand-written expected record subset)."""
    d = FIXTURES / dialect
    return (
        (d / f"{case}.sse").read_bytes(),
        (d / f"{case}.request.json").read_bytes(),
        json.loads((d / f"{case}.expected.json").read_text(encoding="utf-8")),
    )


def cases(dialect: str) -> list[str]:
    return sorted(p.name.removesuffix(".expected.json") for p in (FIXTURES / dialect).glob("*.expected.json"))


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
        request=facts, violations=list(violations),
    )  # fmt: skip
    obs = StreamObserver(
        dialect, ex, view=view, status_code=status, content_type=content_type, content_encoding=content_encoding, limits=limits
    )
    t = T0
    for chunk in chunks:
        t += 0.01
        obs.feed(chunk, t)
    return obs.finish(end, now_s=t + 0.01).to_dict()


def assert_matches(record: dict[str, Any], expected: dict[str, Any]) -> None:
    """Every key of ``expected`` equals the record's; a violation ``detail`` of ``"*"`` matches any."""
    for key, want in expected.items():
        got = record[key]
        if key == "violations":
            assert [(v["kind"], v["seq"]) for v in got] == [(v["kind"], v["seq"]) for v in want], got
            for g, w in zip(got, want):
                if w["detail"] != "*":
                    assert g["detail"] == w["detail"]
        else:
            assert got == want, f"{key}: {got!r} != {want!r}"


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    """``data`` cut at the given offsets (any order, duplicates and out-of-range ignored)."""
    cuts = sorted({p for p in points if 0 < p < len(data)})
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
