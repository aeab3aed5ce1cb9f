"""The canonical event and audit record types: one definition used by wire -> store -> API.

Names follow the draft "A Standard Wire Format for LLM Inference Streaming" (draft §5.3 event
types and fields: ``stream.start``, ``content.delta``, ``seq``, ``stop_reason``, ``usage``) and
the record field names fixed by the skeleton issue (``GET /v1/exchanges/{id}``).

This module is pure: no I/O, no clock, no third-party imports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


class Outcome(enum.StrEnum):
    """How an observed exchange ended.

    - ``completed``: ``stream.end`` (or the dialect's equivalent) was seen.
    - ``error``: the stream carried an error event.
    - ``client_aborted``: the client went away before the end (mitmproxy ``error`` hook).
    - ``truncated``: the upstream closed (cleanly or not) before the end of the stream.
    - ``http_error``: the upstream answered with a non-2xx status; the body is recorded.
    - ``unreadable``: the response ended normally but the observer could not read it
      (undecodable content, not an event stream, observer failure); violations say why.
    - ``interrupted``: the observer shut down while the stream was still open.
    """

    COMPLETED = "completed"
    ERROR = "error"
    CLIENT_ABORTED = "client_aborted"
    TRUNCATED = "truncated"
    HTTP_ERROR = "http_error"
    UNREADABLE = "unreadable"
    INTERRUPTED = "interrupted"


class ViolationKind(enum.StrEnum):
    """Protocol and lifecycle violations recorded against an exchange.

    Sources: WHATWG HTML "event stream interpretation" (wire kinds), draft §5.2-§5.4
    (lifecycle), draft §8.2 (``undeclared_tool``), draft §8.4 (``seq_exhausted``).
    """

    SEQ_GAP = "seq_gap"
    SEQ_REPEAT = "seq_repeat"
    MISSING_STREAM_START = "missing_stream_start"
    TYPE_MISMATCH = "type_mismatch"
    INVALID_JSON = "invalid_json"
    EVENT_AFTER_END = "event_after_end"
    MISSING_STREAM_END = "missing_stream_end"
    UNDECLARED_TOOL = "undeclared_tool"
    SEQ_EXHAUSTED = "seq_exhausted"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNTERMINATED_FINAL_EVENT = "unterminated_final_event"
    OVERSIZE_EVENT = "oversize_event"
    OBSERVER_ERROR = "observer_error"
    REUSED_TOOL_INDEX = "reused_tool_index"
    REQUEST_ID_MISMATCH = "request_id_mismatch"
    INVALID_EVENT = "invalid_event"
    INVALID_REQUEST = "invalid_request"
    CONTENT_DECODING_ERROR = "content_decoding_error"
    OVERSIZE_REQUEST = "oversize_request"
    OVERSIZE_STREAM = "oversize_stream"
    UNEXPECTED_CONTENT_TYPE = "unexpected_content_type"
    UNSTORABLE_CHARACTER = "unstorable_character"
    INVALID_UTF8 = "invalid_utf8"
    OVERSIZE_RECORD = "oversize_record"
    INCOMPLETE_REQUEST = "incomplete_request"  # the exchange ended before the request body was received


@dataclass(slots=True, frozen=True)
class Violation:
    """One recorded violation: ``kind`` (a ``ViolationKind`` value), the stream ``seq`` it
    concerns (``None`` when it is not tied to an event), and a human-readable ``detail``."""

    kind: str
    seq: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "seq": self.seq, "detail": self.detail}


@dataclass(slots=True)
class Block:
    """One content block of the response: ``index`` as on the wire, ``type`` (``"text"``),
    its concatenated ``text`` and the ``stop_reason`` of its ``content.stop`` (draft §5.3)."""

    index: int
    type: str = "text"
    text: str = ""
    stop_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "type": self.type, "text": self.text, "stop_reason": self.stop_reason}


@dataclass(slots=True)
class ToolCall:
    """One tool invocation requested by the model (draft §5.3 ``tool.call``).

    ``arguments`` is the JSON-encoded argument string exactly as streamed (never re-serialised);
    ``declared`` says whether ``name`` was among the request's declared tools (draft §8.2).
    """

    index: int | None
    id: str | None
    name: str | None
    arguments: str = ""
    declared: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "declared": self.declared,
        }


@dataclass(slots=True)
class Usage:
    """Token usage (draft §5.3 ``usage``): counts in tokens, ``None`` when not reported —
    never a made-up 0. ``reported`` is true once any usage event arrived."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    reported: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "reported": self.reported}


@dataclass(slots=True)
class ErrorInfo:
    """A generation error carried by the stream (draft §5.3 ``error``): ``code`` and ``message``."""

    code: str | None
    message: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}


@dataclass(slots=True)
class RequestFacts:
    """What the request said, as recorded: the request envelope of draft §4.2 with binary parts
    reduced to type and size.

    ``messages``: list of ``{"role", "content", ...}`` (anything else kept as sent and flagged
    ``invalid_request``); string content kept as is, typed parts
    kept with ``text`` parts verbatim and ``image``/``document``/``audio`` parts as
    ``{"type", "media_type", "data_bytes"}`` (decoded size in bytes, base64 payload dropped).
    ``tools``: the declared tool objects. ``parameters`` and ``metadata``: as sent.
    ``extensions``: the namespaced extension keys (values not interpreted, draft §8.3).
    ``tool_names``: names of the declared tools, normalised by the dialect from its own tool
    shape (for ``declared`` and ``undeclared_tool``, draft §8.2). ``end_user``: the end-user
    identifier the request carried, where the vendor has one (``enduser.id``). ``request_id``:
    the client's own correlation id where the dialect defines one (draft §4.6
    ``metadata.request_id``; vendor metadata is free-form and defines none).
    """

    version: str | None = None
    stream: bool | None = None
    model: str | None = None
    messages: list[Any] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    extensions: list[str] = field(default_factory=list)
    body_bytes: int = 0
    tool_names: list[str] = field(default_factory=list)
    end_user: str | None = None
    request_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "stream": self.stream,
            "model": self.model,
            "messages": self.messages,
            "tools": self.tools,
            "parameters": self.parameters,
            "metadata": self.metadata,
            "extensions": self.extensions,
            "body_bytes": self.body_bytes,
            "tool_names": self.tool_names,
            "end_user": self.end_user,
            "request_id": self.request_id,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestFacts:
        """The inverse of ``to_dict``; keys missing from older records take their defaults."""
        return cls(
            version=d.get("version"),
            stream=d.get("stream"),
            model=d.get("model"),
            messages=d.get("messages", []),
            tools=d.get("tools", []),
            parameters=d.get("parameters", {}),
            metadata=d.get("metadata", {}),
            extensions=d.get("extensions", []),
            body_bytes=d.get("body_bytes", 0),
            tool_names=d.get("tool_names", []),
            end_user=d.get("end_user"),
            request_id=d.get("request_id"),
        )


def rfc3339(ts: datetime | None) -> str | None:
    """Formats an aware datetime as RFC 3339 UTC with microseconds and a ``Z`` suffix."""
    if ts is None:
        return None
    return ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def utc_from_epoch(epoch_s: float | None) -> datetime | None:
    """Converts seconds since the Unix epoch to an aware UTC datetime (``None`` passes through)."""
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc)


@dataclass(slots=True)
class Exchange:
    """The audit record of one observed LLM request/response exchange.

    Field names are fixed (users and tests depend on them); ``to_dict`` gives the JSON shape of
    ``GET /v1/exchanges/{id}``. Times: ``started_at``/``ended_at`` aware UTC datetimes
    (serialised RFC 3339), ``ttft_s`` seconds from the request's start to the first generated
    text. ``response_body`` holds the (capped) body of a non-2xx answer; ``transport_error`` the
    proxy's raw error message when the connection failed (mitmproxy ``flow.error.msg``).
    """

    id: str
    dialect: str
    host: str
    path: str
    method: str
    http_version: str
    started_at: datetime
    scheme: str = "http"
    port: int | None = None
    status_code: int | None = None
    ended_at: datetime | None = None
    ttft_s: float | None = None
    request_id: str | None = None
    request: RequestFacts = field(default_factory=RequestFacts)
    model: str | None = None
    blocks: list[Block] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    stop_reason_raw: str | None = None
    error: ErrorInfo | None = None
    outcome: str = Outcome.TRUNCATED
    violations: list[Violation] = field(default_factory=list)
    response_body: str | None = None
    transport_error: str | None = None
    response_bytes: int = 0
    events: int = 0

    @property
    def request_model(self) -> str | None:
        """The model the client asked for (``request.model``)."""
        return self.request.model

    @property
    def text(self) -> str:
        """All text blocks joined in ``index`` order."""
        return "".join(b.text for b in sorted(self.blocks, key=lambda b: b.index) if b.type == "text")

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record (``GET /v1/exchanges/{id}``)."""
        return {
            "id": self.id,
            "dialect": self.dialect,
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "method": self.method,
            "http_version": self.http_version,
            "status_code": self.status_code,
            "started_at": rfc3339(self.started_at),
            "ended_at": rfc3339(self.ended_at),
            "ttft_s": self.ttft_s,
            "request_id": self.request_id,
            "request": self.request.to_dict(),
            "request_model": self.request_model,
            "model": self.model,
            "text": self.text,
            "blocks": [b.to_dict() for b in sorted(self.blocks, key=lambda b: b.index)],
            "tool_calls": [t.to_dict() for t in self.tool_calls],
            "usage": self.usage.to_dict(),
            "stop_reason": self.stop_reason,
            "stop_reason_raw": self.stop_reason_raw,
            "error": self.error.to_dict() if self.error else None,
            "outcome": str(self.outcome),
            "violations": [v.to_dict() for v in self.violations],
            "response_body": self.response_body,
            "transport_error": self.transport_error,
            "response_bytes": self.response_bytes,
            "events": self.events,
        }
