"""The response side of an exchange: what its parser is given (``ResponseSpec``), how the
transport ended (``StreamEnd``), what the parser returns (``ResponseFacts``), and the one place
a record is assembled from the request side and the response side (``assemble``).

The parser, in the proxy process or in the worker (``observer.capture``), sees only the
``ResponseSpec``: no prompts, no request body, nothing a credential could hide in beyond the
declared tool names and the client's correlation id. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields, make_dataclass
from typing import Any

from observer.limits import DEFAULT_LIMITS, Limits
from observer.reassembly import EndCause
from observer.records import ErrorInfo, Exchange, Outcome, Violation, utc_from_epoch


@dataclass(frozen=True, slots=True)
class ResponseSpec:
    """What parsing one response needs: ``dialect`` (registry name), the response's
    ``status_code``, ``content_type`` and ``content_encoding`` (header values as sent, or
    ``None``), ``started_at_s`` (the request's start, epoch seconds: ``ttft_s`` counts from it),
    ``path`` (the request path, credentials redacted: per-endpoint framings), the request's
    declared ``tool_names`` (draft §8.2 ``undeclared_tool``; ``None`` when the dialect's requests
    do not declare tools, ``declares_tools = False``: each call's ``declared`` is then unknown,
    ``null``, never an ``undeclared_tool``), its correlation ``request_id``
    (draft §4.6), whether it asked for a stream (``request_stream``; ``None``: it did not say),
    the ``limits``, and the per-message encoding of an enveloped stream (``message_encoding``:
    the ``connect-content-encoding`` or ``grpc-encoding`` response header as sent, ``None`` when
    absent or not given; ``observer.wire.frames.EnvelopeFramer``), and ``response_id``: the value
    of the response header the dialect names as its response's id (``response_id_header``:
    Bedrock's ``x-amzn-requestid``), ``None`` without one; the record's ``response_id`` unless the
    body names one (``observer.tap``)."""

    dialect: str
    status_code: int
    content_type: str | None = None
    content_encoding: str | None = None
    started_at_s: float = 0.0
    path: str = ""
    tool_names: tuple[str, ...] | None = ()
    request_id: str | None = None
    request_stream: bool | None = None
    limits: Limits = DEFAULT_LIMITS
    message_encoding: str | None = None
    response_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the journal keeps it with an open exchange); ``from_dict`` inverts it."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["tool_names"] = None if self.tool_names is None else list(self.tool_names)
        d["limits"] = {f.name: getattr(self.limits, f.name) for f in fields(self.limits)}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResponseSpec:
        """Raises ``TypeError``/``KeyError`` on a dict ``to_dict`` did not make."""
        names = d["tool_names"]
        return cls(**{**d, "tool_names": None if names is None else tuple(names), "limits": Limits(**d["limits"])})

    @property
    def media_type(self) -> str:
        """The ``Content-Type`` without parameters, lower-cased ("" when absent), RFC 9110 §8.3.1."""
        return (self.content_type or "").split(";", 1)[0].strip().lower()


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """How the transport ended: ``cause``, the clock reading when it was noticed (``now_s``) and
    the end time to record (``ended_at_s``, default ``now_s``), both epoch seconds, the
    proxy's raw error message (``transport_error``, mitmproxy ``flow.error.msg``), and the
    response's HTTP trailers as ``(name, value)`` pairs (``trailers``; for a gRPC response
    without a body, its ``grpc-*`` headers: a trailers-only response). The trailers reach the
    adapter's ``on_trailers`` (gRPC's status) and are never stored."""

    cause: EndCause
    now_s: float
    ended_at_s: float | None = None
    transport_error: str | None = None
    trailers: tuple[tuple[str, str], ...] = ()

    @property
    def at_s(self) -> float:
        """The end time to record (epoch seconds)."""
        return self.ended_at_s if self.ended_at_s is not None else self.now_s


# The response side of the record: the ``Exchange`` fields a response's parse decides.
RESPONSE_FIELDS = (
    "ended_at",
    "ttft_s",
    "request_id",
    "model",
    "response_id",
    "system_fingerprint",
    "service_tier",
    "blocks",
    "choices",
    "tool_calls",
    "usage",
    "stop_reason",
    "stop_reason_raw",
    "error",
    "outcome",
    "violations",
    "response_body",
    "transport_error",
    "response_bytes",
    "events",
    "last_event_id",
)


def _response_field(f: Field) -> tuple[str, object, Field]:
    if f.default_factory is not MISSING:
        return f.name, f.type, field(default_factory=f.default_factory)
    return f.name, f.type, field(default=f.default)


# What one response's parse found: ``observer.records.Exchange``'s ``RESPONSE_FIELDS``, with
# their names, types and defaults taken from that one declaration (a dataclass made from it, so
# the two cannot drift); ``assemble`` copies each into the record by name.
ResponseFacts = make_dataclass(
    "ResponseFacts",
    [_response_field(f) for f in fields(Exchange) if f.name in RESPONSE_FIELDS],
    slots=True,
    module=__name__,
)
ResponseFacts.__doc__ = "What one response's parse found: the response-side fields of ``observer.records.Exchange``."


def no_response_facts(end: StreamEnd, request_id: str | None) -> ResponseFacts:
    """The facts of an exchange that ended before any response headers arrived.

    A client that went away while waiting gives ``client_aborted``, an observer shutdown
    ``interrupted``; otherwise (upstream unreachable, refused, reset) ``error`` with code
    ``no_response``: no response existed, so nothing was truncated. ``request_id`` is the
    request's own correlation id."""
    facts = ResponseFacts(
        ended_at=utc_from_epoch(end.now_s), transport_error=end.transport_error, request_id=request_id
    )
    if end.cause is EndCause.CLIENT_ABORTED:
        facts.outcome = Outcome.CLIENT_ABORTED
    elif end.cause is EndCause.SHUTDOWN:
        facts.outcome = Outcome.INTERRUPTED
    else:
        facts.error = ErrorInfo("no_response", end.transport_error)
        facts.outcome = Outcome.ERROR
    return facts


def unread_facts(
    end: StreamEnd, status_code: int | None, request_id: str | None, response_bytes: int = 0
) -> ResponseFacts:
    """The facts of an exchange whose response the observer did not read: a request on an LLM
    host that is not LLM traffic (``not_llm_request``, metadata only). Without a response (no
    status), as ``no_response_facts``; a client abort ``client_aborted``, a shutdown
    ``interrupted``; else ``http_error`` for a non-2xx status and ``unreadable`` for a 2xx one
    (what it said is not known, by design). ``response_bytes``: the body's size as received."""
    if status_code is None or end.cause in (EndCause.CLIENT_ABORTED, EndCause.SHUTDOWN):
        facts = no_response_facts(end, request_id)
        facts.response_bytes = response_bytes
        return facts
    facts = ResponseFacts(
        ended_at=utc_from_epoch(end.at_s),
        transport_error=end.transport_error,
        request_id=request_id,
        response_bytes=response_bytes,
    )
    facts.outcome = Outcome.UNREADABLE if 200 <= status_code < 300 else Outcome.HTTP_ERROR
    return facts


def assemble(skeleton: Exchange, request_violations: list[Violation], facts: ResponseFacts) -> Exchange:
    """The record: ``skeleton`` (HTTP and request facts, status) with every response field of
    ``facts`` copied in by name; violations are the request's, then the response's. Mutates
    and returns ``skeleton``."""
    for name in RESPONSE_FIELDS:
        setattr(skeleton, name, getattr(facts, name))
    skeleton.violations = [*request_violations, *facts.violations]
    return skeleton


__all__ = ["RESPONSE_FIELDS", "ResponseFacts", "ResponseSpec", "StreamEnd", "assemble", "no_response_facts"]
