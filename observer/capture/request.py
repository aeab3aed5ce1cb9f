"""Reading an observed request: its record skeleton, its body (decoded with bounded work) into
``RequestFacts`` with credentials redacted, and the bounded copy of a streamed upload. Pure
functions of plain values: no mitmproxy; the one clock (a streamed upload's arrival times) is
an argument of ``RequestTap``."""

from __future__ import annotations

import bisect
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from observer.dialects.base import Dialect, RequestView
from observer.errors import ObserverError
from observer.limits import Limits
from observer.records import Exchange, RequestFacts, Violation, ViolationKind, utc_from_epoch
from observer.redact import MAX_CHARS, MAX_FIELDS, redact_path, redact_request
from observer.wire.content import LIMIT_CODE, make_decoder

if TYPE_CHECKING:
    from observer.capture.held import HeldBudget

#: The UUID 5 namespace of record ids derived from mitmproxy flow ids (``flow_record_id``).
FLOW_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:llm-stream-observer:ingest")


def flow_record_id(flow_id: str) -> str:
    """The record id of the mitmproxy flow ``flow_id`` (a UUID 4 per flow, kept in flow dumps):
    a UUID 5, so that a flow recorded live and later ingested from a ``mitmdump -w`` dump of the
    same run is one record, stored once (trial finding: the README's dump-and-ingest lines stored
    every exchange twice)."""
    return str(uuid.uuid5(FLOW_NAMESPACE, f"mitmproxy-flow:{flow_id}"))


def skeleton(
    dialect: Dialect,
    *,
    scheme: str,
    host: str,
    port: int | None,
    path: str,
    method: str,
    http_version: str,
    started_at_s: float,
    removed: list[str] | None = None,
    record_id: str | None = None,
) -> Exchange:
    """A new record with the exchange's HTTP facts, its id ``record_id`` (default a fresh UUID 4);
    credentials in the path's query redacted (``observer.redact.redact_path``; the values
    removed are appended to ``removed``); ``started_at_s`` epoch seconds."""
    return Exchange(
        id=record_id or str(uuid.uuid4()),
        dialect=dialect.name,
        scheme=scheme,
        host=host,
        port=port,
        path=redact_path(path, removed),
        method=method,
        http_version=http_version,
        started_at=utc_from_epoch(started_at_s),
    )


@dataclass(slots=True)
class RequestRead:
    """What reading a request body gave: ``facts`` (``None`` when the body was not parsed, then
    ``body_bytes`` is its size), the ``violations`` found, the credential values removed
    (``secrets``: kept in memory only, to scrub echoes of them from the record), and whether the
    body is not the dialect's request at all (``not_llm``: ``not_llm_request``, metadata only)."""

    facts: RequestFacts | None
    violations: list[Violation] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)
    body_bytes: int = 0
    not_llm: bool = False


def read_request(
    dialect: Dialect, view: RequestView, raw: bytes, content_encoding: str | None, limits: Limits
) -> RequestRead:
    """Reads a request body as sent (``raw``, still content-encoded): decoded with bounded work
    and output (``max_request_bytes``, ``max_decode_ratio``: a compressed bomb must not stall the
    proxy loop), parsed by ``dialect``, credentials redacted. Never raises on bad input: a body
    that cannot be decoded gives ``content_decoding_error``, one over the limit
    ``oversize_request``."""
    limit = limits.max_request_bytes
    try:
        decoder = make_decoder(content_encoding, max_ratio=limits.max_decode_ratio, max_output_bytes=limit)
        body = decoder.feed(raw) + decoder.close()
    except ObserverError as exc:
        kind = ViolationKind.OVERSIZE_REQUEST if exc.code == LIMIT_CODE else ViolationKind.CONTENT_DECODING_ERROR
        return RequestRead(None, [Violation(kind, None, f"request body not parsed: {exc}")], body_bytes=len(raw))
    if len(body) > limit:
        violation = Violation(ViolationKind.OVERSIZE_REQUEST, None, f"request body of {len(body)} bytes not parsed")
        return RequestRead(None, [violation], body_bytes=len(body))
    facts, violations = dialect.parse_request(body, view)
    violations = list(violations)
    if any(v.kind == ViolationKind.NOT_LLM_REQUEST for v in violations):  # metadata only: nothing of the body
        return RequestRead(None, violations, body_bytes=len(body), not_llm=True)
    return RequestRead(facts, violations, redacted(facts, violations))


def redacted(facts: RequestFacts, violations: list[Violation]) -> list[str]:
    """Redacts the request's credentials in place (``observer.redact.redact_request``) and
    returns the values removed; a part too big to check is dropped with an ``oversize_request``
    violation appended to ``violations``."""
    removed, dropped = redact_request(facts)
    for name in dropped:
        violations.append(
            Violation(
                ViolationKind.OVERSIZE_REQUEST,
                None,
                f"request {name}: more than {MAX_FIELDS} values or {MAX_CHARS} characters; "
                "not kept (not checked for credentials in bounded time)",
            )
        )
    return removed


def spec_tool_names(dialect: Dialect, request: RequestFacts) -> tuple[str, ...] | None:
    """``ResponseSpec.tool_names`` of ``request`` read by ``dialect``: its declared tool names,
    or ``None`` when the dialect's requests never declare tools (its ``declares_tools`` is
    False, or its ``declares_tools(request)`` says so of this one, e.g. the AI SDK UI request:
    tools live on the app's server), so that each tool call's ``declared`` is unknown rather
    than ``undeclared_tool`` (``observer.reassembly``)."""
    declares = getattr(dialect, "declares_tools", True)
    if callable(declares):
        declares = declares(request)
    return tuple(request.tool_names) if declares else None


def response_id_of(dialect: Dialect, headers: Mapping[str, str]) -> str | None:
    """``ResponseSpec.response_id``: the value of the response header ``dialect`` names as its
    response's id (``response_id_header``, ``observer.dialects.base.Dialect``), ``None`` when it
    names none or the header is absent or empty. ``headers``: the response's, any case."""
    name = getattr(dialect, "response_id_header", None)
    value = headers.get(name) if name else None
    return value or None


def declared_too_large(length: str, limits: Limits) -> Violation | None:
    """The ``oversize_request`` violation of a request whose declared ``Content-Length`` is
    over ``max_request_bytes`` (it is streamed on, not parsed), else ``None``."""
    if length.isdigit() and int(length) > limits.max_request_bytes:
        return Violation(ViolationKind.OVERSIZE_REQUEST, None, f"request body of {length} bytes not parsed")
    return None


def incomplete_request(seen_bytes: int | None) -> Violation:
    """The violation of an exchange that ended before its request body was complete
    (``seen_bytes``: what a streamed upload had passed on, or ``None`` when unknown)."""
    got = "" if seen_bytes is None else f" ({seen_bytes} bytes received)"
    return Violation(
        ViolationKind.INCOMPLETE_REQUEST, None, f"exchange ended before the request body was complete{got}; not parsed"
    )


MAX_UPLOAD_MARKS = 1 << 14  # arrival times a streamed upload keeps (``RequestTap``)


class RequestTap:
    """The ``flow.request.stream`` callable of an observed request whose size is not declared
    (chunked upload): forwards every chunk unchanged and keeps a copy of at most ``max_bytes``
    for the record, so an endless upload is never buffered by the proxy (trial finding: a
    400 MB chunked upload was held whole), with each chunk's arrival time (``clock()``, epoch
    seconds; the first ``MAX_UPLOAD_MARKS`` chunks): a multi-turn stream's later turn reads the
    upload as it was when that turn ended (``body(until_s)``) and starts at the client's next
    message (``first_after``). Never raises.

    With a ``budget`` (a held body, ``capture.held.HeldBudget``), each chunk kept is reserved
    in it first; one that does not fit stops the copy (``starved``: dropped, as when it
    outgrows ``max_bytes``); the copy's bytes go back to it when the copy is dropped
    (``release``) or adopted (``detach``)."""

    __slots__ = ("_budget", "_buf", "_clock", "_ends", "_max", "_times", "over", "starved", "total_bytes")

    def __init__(
        self, max_bytes: int, clock: Callable[[], float] | None = None, budget: HeldBudget | None = None
    ) -> None:
        self._buf = bytearray()
        self._max = max_bytes
        self._clock = clock or time.time
        self._budget = budget  # while set, it has len(self._buf) bytes reserved for this copy
        self._times: list[float] = []  # arrival time of each kept chunk, in order
        self._ends: list[int] = []  # bytes kept once that chunk was in
        self.over = False
        self.starved = False
        self.total_bytes = 0

    def __call__(self, data: bytes) -> bytes:
        if data:
            self.total_bytes += len(data)
            if not self.over:
                if len(self._buf) + len(data) > self._max:
                    self.release()
                elif self._budget is not None and not self._budget.reserve(len(data)):
                    self.starve()
                else:
                    self._buf += data
                    if len(self._times) < MAX_UPLOAD_MARKS:
                        self._times.append(self._clock())
                        self._ends.append(len(self._buf))
        return data

    def release(self) -> None:
        """Drops the copy and keeps none of the chunks still to come (they are still passed on
        and counted), its bytes given back to its budget: a held body whose response was not
        LLM traffic (``capture.held``), or one that outgrew ``max_bytes``."""
        self.over = True
        self.detach()
        self._buf = bytearray()
        self._times, self._ends = [], []

    def starve(self) -> None:
        """``release`` for want of budget: the held copies of all flows are at
        ``max_held_request_bytes`` (``overflow`` says so)."""
        self.starved = True
        self.release()

    def detach(self) -> None:
        """Gives the copy's bytes back to its budget and copies on without one: a held body
        adopted as the record's request (``capture.held.adopt``), kept per flow from then on as
        any observed upload's copy is (at most ``max_bytes``)."""
        budget, self._budget = self._budget, None
        if budget is not None:
            budget.give_back(len(self._buf))

    def body(self, until_s: float | None = None) -> bytes | None:
        """The kept request body, or ``None`` when it outgrew ``max_bytes``; with ``until_s``
        (epoch seconds) only the chunks that had arrived by then (all of them past the first
        ``MAX_UPLOAD_MARKS`` chunks' times)."""
        if self.over:
            return None
        if until_s is None or len(self._times) >= MAX_UPLOAD_MARKS:
            return bytes(self._buf)
        n = bisect.bisect_right(self._times, until_s)
        return bytes(self._buf[: self._ends[n - 1]]) if n else b""

    def first_after(self, at_s: float) -> float | None:
        """The arrival time of the first chunk after ``at_s`` (epoch seconds), or ``None``."""
        i = bisect.bisect_right(self._times, at_s)
        return self._times[i] if i < len(self._times) else None

    def overflow(self, limits: Limits) -> Violation:
        """The ``oversize_request`` violation of an upload that outgrew the copy, or whose copy
        was dropped for want of budget (``starved``: naming ``max_held_request_bytes``)."""
        if self.starved:
            return Violation(
                ViolationKind.OVERSIZE_REQUEST,
                None,
                "request body not parsed: its copy was dropped, the request bodies held at once across all flows"
                f" reached max_held_request_bytes ({limits.max_held_request_bytes} bytes)",
            )
        return Violation(
            ViolationKind.OVERSIZE_REQUEST, None, f"request body over {limits.max_request_bytes} bytes not parsed"
        )


__all__ = [
    "RequestRead",
    "RequestTap",
    "declared_too_large",
    "incomplete_request",
    "read_request",
    "redacted",
    "response_id_of",
    "skeleton",
    "spec_tool_names",
]
