"""The canonical event and audit record types: one definition used by wire -> store -> API.

Names follow the draft "A Standard Wire Format for LLM Inference Streaming" (draft §5.3 event
types and fields: ``stream.start``, ``content.delta``, ``seq``, ``stop_reason``, ``usage``) and
the record field names fixed by the skeleton issue (``GET /v1/exchanges/{id}``).

The record classes are the one declaration of the record's shape: ``to_dict``/``from_dict``
(the JSON of the journal's records and of the API), the store's rows (``observer.store.rows``) and
the API schemas' check (``tests/unit/test_schemas.py``) are derived from their fields
(``observer.shape``).

This module is pure: no I/O, no clock, no third-party imports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from observer.shape import ADDED, AS_STR, Shaped, derived, rfc3339, shaped, sorted_by

__all__ = [
    "Block",
    "ErrorInfo",
    "Exchange",
    "Outcome",
    "Provenance",
    "RequestFacts",
    "ToolCall",
    "Usage",
    "Violation",
    "ViolationKind",
    "rfc3339",
    "utc_from_epoch",
]


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
    NOT_LLM_REQUEST = "not_llm_request"  # an LLM host and path, but not the dialect's request shape: metadata only
    # Binary framings (observer.wire: AWS event stream, Connect/gRPC envelopes, SignalR MessagePack):
    CHECKSUM_MISMATCH = "checksum_mismatch"  # a frame whose CRC does not match its bytes (AWS event stream)
    MALFORMED_FRAME = "malformed_frame"  # a frame that cannot be read (bad length, flags, header, varint)
    SCHEMA_UNKNOWN = "schema_unknown"  # a protobuf message of an endpoint without a field map: strings found only
    # Recovered framings (issue 16, item 4): content kept, the deviation on record:
    NONCONFORMANT_FRAMING = (
        "nonconformant_framing"  # several JSON documents in one SSE event's data: each read as its own event
    )
    NONSTANDARD_FIELD = (
        "nonstandard_field"  # an SSE field WHATWG ignores (e.g. llama.cpp's `error:`): surfaced or named
    )
    LONE_SURROGATE = "lone_surrogate"  # a JSON string escape of half a UTF-16 pair: replaced by U+FFFD
    BLOCK_NOT_STARTED = "block_not_started"  # a block's or item's stop/done for an index that never started


@shaped
@dataclass(slots=True, frozen=True)
class Violation(Shaped):
    """One recorded violation: ``kind`` (a ``ViolationKind`` value), the stream ``seq`` it
    concerns (``None`` when it is not tied to an event), and a human-readable ``detail``."""

    kind: str = field(metadata=AS_STR)
    seq: int | None = None
    detail: str = ""


@shaped
@dataclass(slots=True)
class Block(Shaped):
    """One content block of the response: ``index`` as on the wire, ``type`` (``"text"``),
    its concatenated ``text`` and the ``stop_reason`` of its ``content.stop`` (draft §5.3)."""

    index: int
    type: str = "text"
    text: str = ""
    stop_reason: str | None = None


@shaped
@dataclass(slots=True)
class ToolCall(Shaped):
    """One tool invocation requested by the model (draft §5.3 ``tool.call``).

    ``arguments`` is the JSON-encoded argument string exactly as streamed (never re-serialised);
    ``declared`` says whether ``name`` was among the request's declared tools (draft §8.2);
    ``None`` when that is unknown: the dialect's requests do not declare tools (the AI SDK UI
    request: the app declares them on its server).
    """

    index: int | None
    id: str | None
    name: str | None
    arguments: str = ""
    declared: bool | None = False


@shaped
@dataclass(slots=True)
class Usage(Shaped):
    """Token usage (draft §5.3 ``usage``): counts in tokens, each ``None`` when the vendor did
    not report it — never a made-up 0, never computed from the others. ``reported`` is true
    once any usage event arrived.

    Beyond the draft's ``input_tokens``/``output_tokens`` (OpenTelemetry
    ``gen_ai.usage.input_tokens``/``output_tokens``), as the vendor reported them:
    ``cache_read_input_tokens`` (``gen_ai.usage.cache_read.input_tokens``: input read from a
    prompt cache), ``cache_creation_input_tokens`` (``gen_ai.usage.cache_creation.input_tokens``:
    input written to one), ``reasoning_output_tokens`` (output spent on reasoning),
    ``total_tokens`` (the vendor's total, as sent) and ``details``: other counts (``None``
    when there are none), ``{group: {name: int}}`` with group ``input``/``output``/``cache_read``/``cache_creation``
    (name a modality: ``text``, ``audio``, ``image``, ``video``, ``document``, or the vendor's
    own count, e.g. ``accepted_prediction``) or ``duration_ns`` (Ollama's timings, nanoseconds).
    Whether ``input_tokens`` includes the cached tokens is the vendor's convention, kept as
    sent: OpenAI and Gemini include them, Anthropic and Bedrock do not (each dialect says).
    The added counts are keyword-only: ``Usage(in, out, reported)`` reads as it always did."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = field(default=None, kw_only=True, metadata=ADDED)
    cache_creation_input_tokens: int | None = field(default=None, kw_only=True, metadata=ADDED)
    reasoning_output_tokens: int | None = field(default=None, kw_only=True, metadata=ADDED)
    total_tokens: int | None = field(default=None, kw_only=True, metadata=ADDED)
    details: dict[str, dict[str, int]] | None = field(default=None, kw_only=True, metadata=ADDED)
    reported: bool = False


@shaped
@dataclass(slots=True)
class ErrorInfo(Shaped):
    """A generation error carried by the stream (draft §5.3 ``error``): ``code`` and ``message``."""

    code: str | None
    message: str | None


@shaped(lenient=True)
@dataclass(slots=True)
class RequestFacts(Shaped):
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

    ``from_dict`` gives keys missing from older records their defaults (``lenient``).
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


@shaped
@dataclass(slots=True, frozen=True)
class Provenance(Shaped):
    """Where a record that was not observed live comes from: ``source`` ``"offline_ingest"``
    (``observer ingest`` read the exchange from a saved capture and ran it through the capture
    path), ``file`` (the file's absolute path when it was read), ``file_sha256`` (hex SHA-256 of
    its bytes), ``file_format`` (``"mitmproxy"``: a flow dump, ``mitmdump -w``; ``"har"``: an
    HTTP Archive), ``flow_id`` (the flow's id in a dump; ``"entry-<n>"``, 0-based, in a HAR,
    whose entries have none) and ``ingested_at`` (when, UTC)."""

    source: str
    file: str
    file_sha256: str
    file_format: str
    flow_id: str
    ingested_at: datetime


def utc_from_epoch(epoch_s: float | None) -> datetime | None:
    """Converts seconds since the Unix epoch to an aware UTC datetime (``None`` passes through)."""
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc)


@shaped
@dataclass(slots=True)
class Exchange(Shaped):
    """The audit record of one observed LLM request/response exchange.

    Field names are fixed (users and tests depend on them); ``to_dict`` gives the JSON shape of
    ``GET /v1/exchanges/{id}``, keys in field order (``scheme``, ``port`` and ``status_code`` are
    keyword-only so that they can stand where the record shows them). Times: ``started_at``/
    ``ended_at`` aware UTC datetimes (serialised RFC 3339), ``ttft_s`` seconds from the request's
    start to the first generated text. ``response_body`` holds the (capped) body of a non-2xx
    answer; ``transport_error`` the proxy's raw error message when the connection failed
    (mitmproxy ``flow.error.msg``). ``provenance``: ``None`` for a record observed live, where
    an ingested one came from (``Provenance``). Who sent it (``observer.identity``):
    ``client_address`` (the client's IP, or its keyed pseudonym, per the ``client_address``
    setting; ``None`` when off or unknown), ``proxy_user`` (the user the proxy authenticated,
    mitmproxy ``proxyauth``; never the password) and ``key_fingerprint`` (``"hmac-sha256:…"`` of
    the API credential the request carried; the credential itself is never kept). ``response_id``, ``system_fingerprint``,
    ``service_tier``: which response the vendor said it was (``observer.events.ResponseIdentity``;
    ``None`` when it did not say). Resumed streams (WHATWG HTML §9.2 "server-sent events":
    a reconnecting client sends the last event ID it saw in ``Last-Event-ID``):
    ``request_last_event_id`` is that header of the request (``None``: not a resumption),
    ``last_event_id`` the ``id`` of the response's last SSE event (``None``: the stream set
    none), so a later exchange that resumes this one can be found (the store's ``resumes_id``).
    ``choices``: one ``{"index", "text", "stop_reason",
    "stop_reason_raw"}`` per choice when the response had several (OpenAI ``n > 1``, Gemini
    ``candidateCount``), in index order, each choice's text being its ``text`` block; for a
    single answer ``None`` (the record's ``text`` and ``stop_reason`` are that). ``from_dict`` (the
    journal's replay) needs every key but those marked ``ADDED`` (``provenance``, the sender and
    response identity fields, ``choices``: added later, journal entries of older versions lack them).
    """

    id: str
    dialect: str
    scheme: str = field(default="http", kw_only=True)
    host: str
    port: int | None = field(default=None, kw_only=True)
    path: str
    method: str
    http_version: str
    client_address: str | None = field(default=None, kw_only=True, metadata=ADDED)
    proxy_user: str | None = field(default=None, kw_only=True, metadata=ADDED)
    key_fingerprint: str | None = field(default=None, kw_only=True, metadata=ADDED)
    status_code: int | None = field(default=None, kw_only=True)
    started_at: datetime
    ended_at: datetime | None = None
    ttft_s: float | None = None
    request_id: str | None = None
    request: RequestFacts = field(default_factory=RequestFacts)
    model: str | None = None
    response_id: str | None = field(default=None, metadata=ADDED)
    system_fingerprint: str | None = field(default=None, metadata=ADDED)
    service_tier: str | None = field(default=None, metadata=ADDED)
    blocks: list[Block] = field(default_factory=list, metadata=sorted_by("index"))
    choices: list[dict[str, Any]] | None = field(default=None, metadata=ADDED)
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    stop_reason: str | None = None
    stop_reason_raw: str | None = None
    error: ErrorInfo | None = None
    outcome: str = field(default=Outcome.TRUNCATED, metadata=AS_STR)
    violations: list[Violation] = field(default_factory=list)
    response_body: str | None = None
    transport_error: str | None = None
    response_bytes: int = 0
    events: int = 0
    provenance: Provenance | None = field(default=None, metadata=ADDED)
    request_last_event_id: str | None = field(default=None, metadata=ADDED)
    last_event_id: str | None = field(default=None, metadata=ADDED)

    @derived(after="request")
    def request_model(self) -> str | None:
        """The model the client asked for (``request.model``)."""
        return self.request.model

    @derived(after="model")
    def text(self) -> str:
        """All text blocks joined in ``index`` order."""
        return "".join(b.text for b in sorted(self.blocks, key=lambda b: b.index) if b.type == "text")

    @derived(after="blocks")
    def reasoning(self) -> str:
        """All reasoning blocks (thinking, reasoning summaries) joined in ``index`` order."""
        return "".join(b.text for b in sorted(self.blocks, key=lambda b: b.index) if b.type == "reasoning")
