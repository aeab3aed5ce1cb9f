"""Test helpers: run a wire fixture through the whole sans-IO pipeline in a given chunking.

Fixture layout (``tests/fixtures/wire/<dialect name>/``), per case:
``<case>.<sse|ndjson|json|txt>`` the response body exactly as on the wire; ``<case>.request.json``
the request body (optional); ``<case>.expected.json`` the expected record subset, written by
hand; ``<case>.meta.json`` (optional) ``{"path", "status", "content_type", "content_encoding",
"request_headers", "response_headers", "end"}`` when the defaults do not fit; a folder's
``_defaults.meta.json`` gives defaults for all its cases.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from hypothesis import strategies as st

from observer.capture.request import response_id_of, spec_tool_names
from observer.dialects.base import Dialect, RequestView, StreamAdapter
from observer.dialects.registry import default_registry
from observer.limits import DEFAULT_LIMITS, Limits
from observer.reassembly import EndCause
from observer.records import Exchange
from observer.response import ResponseSpec, StreamEnd, assemble
from observer.tap import StreamObserver
from observer.wire.frames import text_message

FIXTURES = Path(__file__).parent / "fixtures" / "wire"
T0 = 1_749_292_800.0  # request start, epoch seconds
BODY_TYPES = {
    ".sse": "text/event-stream",
    ".ndjson": "application/x-ndjson",
    ".json": "application/json",
    ".txt": "text/plain",
    ".eventstream": "application/vnd.amazon.eventstream",
    ".connect": "application/connect+proto",
}


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
    bodies = [
        p
        for p in d.glob(f"{name}.*")
        if p.suffix in BODY_TYPES and not p.name.endswith((".request.json", ".expected.json", ".meta.json"))
    ]
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


def observe_case(case: Case, chunks: Iterable[bytes], *, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Feeds ``chunks`` as the response of ``case`` and returns the record dict (``observe``)."""
    return observe(
        case.dialect,
        case.request,
        chunks,
        status=case.status,
        content_type=case.content_type,
        content_encoding=case.content_encoding,
        end=case.end,
        limits=limits,
        path=case.path,
        request_headers=case.request_headers,
        response_headers=case.response_headers,
    )


def observe(
    dialect_name: str,
    request_body: bytes,
    chunks: Iterable[bytes],
    *,
    status: int = 200,
    content_type: str = "text/event-stream",
    content_encoding: str | None = None,
    end: EndCause = EndCause.EOF,
    limits: Limits = DEFAULT_LIMITS,
    path: str = "/v1/stream",
    request_headers: dict[str, str] | None = None,
    general: bool = False,
    response_headers: dict[str, str] | None = None,
) -> Any:
    """Feeds ``chunks`` as the response of ``request_body`` (sent as ``POST path``) and returns
    the record dict, or for a stream cut into turns (``observer.tap``: Cursor) the list of its
    turns' records; ``general`` maps every message through ``on_message`` (:func:`general_only`)."""
    dialect: Dialect = default_registry().get(dialect_name)
    if general:
        dialect = general_only(dialect)
    headers = {"content-type": "application/json", **{k.lower(): v for k, v in (request_headers or {}).items()}}
    view = RequestView("POST", "127.0.0.1", path, headers)
    facts, violations = dialect.parse_request(request_body, view)
    ex = Exchange(
        id="test",
        dialect=dialect.name,
        host="127.0.0.1",
        path=path,
        method="POST",
        http_version="HTTP/1.1",
        started_at=datetime.fromtimestamp(T0, tz=timezone.utc),
        status_code=status,
        request=facts,
        request_last_event_id=headers.get("last-event-id"),  # as the proxy's sender reads it
    )
    spec = ResponseSpec(
        dialect.name,
        status,
        content_type,
        content_encoding,
        T0,
        path,
        spec_tool_names(dialect, facts),
        facts.request_id,
        facts.stream,
        limits,
        response_id=response_id_of(dialect, {k.lower(): v for k, v in (response_headers or {}).items()}),
    )
    obs = StreamObserver(dialect, spec)
    t = T0
    for chunk in chunks:
        t += 0.01
        obs.feed(chunk, t)
    facts = obs.finish(StreamEnd(end, t + 0.01))
    turns = [f for _, f in obs.take_turns()] + ([] if obs.tail_empty else [facts])
    records = [assemble(copy.copy(ex), list(violations), f).to_dict() for f in turns]
    return records[0] if len(records) == 1 else records


class _GeneralAdapter:
    """An adapter with only the required ``StreamAdapter`` methods, delegated to ``inner``: no
    ``fast``, ``on_object`` or ``on_binary``, so the tap maps every framed message with
    ``on_message``; what is not a lane (``multi_turn`` and ``next_turn``, ``on_trailers``)
    is ``inner``'s."""

    __slots__ = ("on_message", "on_lost", "on_close", "multi_turn", "next_turn", "on_trailers")

    def __init__(self, inner: StreamAdapter) -> None:
        self.on_message = inner.on_message
        self.on_lost = inner.on_lost
        self.on_close = inner.on_close
        self.multi_turn = getattr(inner, "multi_turn", False)
        self.next_turn = getattr(inner, "next_turn", None)
        self.on_trailers = getattr(inner, "on_trailers", None)


class _GeneralDialect:
    """``dialect`` with every adapter wrapped in ``_GeneralAdapter``; all else delegated."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self.name = dialect.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dialect, name)

    def new_adapter(self, spec: ResponseSpec) -> StreamAdapter:
        return _GeneralAdapter(self._dialect.new_adapter(spec))


def general_only(dialect: Dialect) -> Dialect:
    """``dialect`` as the tap sees a dialect without fast lanes: its adapters expose only
    ``on_message``/``on_lost``/``on_close`` (``observer.dialects.base.StreamAdapter``), so the
    record is what the general mapping alone gives, whatever ``observer.tap`` does inside."""
    return _GeneralDialect(dialect)  # type: ignore[return-value]


def response_bytes(record: dict[str, Any] | list) -> int:
    """The response bytes of a record, or the sum over a multi-turn stream's records."""
    return sum(r["response_bytes"] for r in record) if isinstance(record, list) else record["response_bytes"]


def assert_matches(record: dict[str, Any] | list, expected: dict[str, Any] | list) -> None:
    """Every key of ``expected`` equals the record's; a violation ``detail`` of ``"*"`` matches any.
    A list (a multi-turn stream's records, one per turn) matches a list of as many, in order."""
    if isinstance(expected, list):
        assert isinstance(record, list) and len(record) == len(expected), record
        for got_one, want_one in zip(record, expected, strict=True):
            assert_matches(got_one, want_one)
        return
    assert isinstance(record, dict), f"{len(record)} records (a multi-turn stream), one expected"
    for key, want in expected.items():
        got = record[key]
        if key == "violations":
            assert [(v["kind"], v["seq"]) for v in got] == [(v["kind"], v["seq"]) for v in want], got
            for g, w in zip(got, want, strict=True):
                if w["detail"] != "*":
                    assert g["detail"] == w["detail"]
        else:
            assert got == want, f"{key}: {got!r} != {want!r}"


# -- feeding: one body whole, one byte at a time and in random splits ----------------------------

CUT_POINTS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=40)  # for ``split_at``


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    """``data`` cut at offset ``p % (len(data) + 1)`` for each of ``points`` (any order; equal
    offsets and the ends give no empty chunk), so every drawn point cuts even a short body."""
    cuts = sorted({p % (len(data) + 1) for p in points} - {0, len(data)})
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def bytewise(data: bytes) -> list[bytes]:
    """``data`` one byte per chunk."""
    return [data[i : i + 1] for i in range(len(data))]


class Decoder(Protocol):
    """The sans-IO decoders' shape (``observer/wire``): ``feed(chunk)`` then ``close()``, each
    returning what it completed (a list of messages and violations, or plain bytes)."""

    def feed(self, data: bytes) -> Any: ...

    def close(self) -> Any: ...


def feed(decoder: Decoder, chunks: Iterable[bytes], *, close: bool = True) -> Any:
    """Everything ``decoder`` returns for ``chunks`` (then ``close()`` unless ``close`` is
    false), joined: one list, or one ``bytes`` for a content decoder."""
    outs = [decoder.feed(chunk) for chunk in chunks]
    if close:
        outs.append(decoder.close())
    if outs and isinstance(outs[0], bytes | bytearray):
        return b"".join(outs)
    return [item for out in outs for item in out]


def feed_each_way(new_decoder: Callable[[], Decoder], data: bytes, points: Iterable[int], *, close: bool = True) -> Any:
    """What fresh decoders from ``new_decoder()`` return for ``data`` fed whole, one byte at a
    time and cut at ``points`` (:func:`split_at`); asserts that the three are equal (h11's rule:
    output never depends on chunking) and returns it."""
    whole = feed(new_decoder(), [data], close=close)
    assert feed(new_decoder(), bytewise(data), close=close) == whole, "one byte at a time differs from whole"
    chunks = split_at(data, points)
    assert feed(new_decoder(), chunks, close=close) == whole, f"cut into {[len(c) for c in chunks]} differs from whole"
    return whole


def text_form(items: list) -> list:
    """A framer's output in its text form, as dialect adapters' ``on_message`` reads it:
    each message through ``observer.wire.frames.text_message`` (an ``invalid_utf8`` violation
    right after a message that needed replacing), violations unchanged."""
    out: list = []
    for item in items:
        if item.__class__ is tuple:
            text, bad = text_message(item)
            out.append(text)
            if bad is not None:
                out.append(bad)
        else:
            out.append(item)
    return out


class TextForm:
    """A framer whose ``feed``/``close`` return :func:`text_form` of its output (the other
    attributes are the framer's)."""

    def __init__(self, framer: Any) -> None:
        self._framer = framer

    def feed(self, data: bytes) -> list:
        return text_form(self._framer.feed(data))

    def close(self) -> list:
        return text_form(self._framer.close())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._framer, name)
