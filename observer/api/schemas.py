"""Public response schemas of the query API (what OpenAPI documents).

Separate from the table models (``observer.store.models``). ``ExchangeOut`` and the models it
nests mirror ``observer.records.Exchange.to_dict()`` key for key, written here with their
descriptions; ``tests/unit/test_schemas.py`` derives the expected keys and types from the record
classes and fails on any difference (a record field missing here). ``ExchangeSummary`` is
derived: the ``ExchangeOut`` fields that ``observer.store.rows.SUMMARY_KEYS`` lists, in that
order. Times are RFC 3339 UTC strings with microseconds exactly as ``observer.shape.rfc3339``
writes them.
"""

from __future__ import annotations

from copy import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model

from observer.store.rows import SUMMARY_KEYS

_TIME = {"format": "date-time", "examples": ["2025-06-01T12:00:00.123456Z"]}


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(_Schema):
    code: str = Field(description="Stable snake_case error code", examples=["not_found"])
    message: str = Field(description="Human-readable explanation")


class ErrorResponse(_Schema):
    """The one error shape of the API (every 4xx and 5xx)."""

    error: ErrorDetail


class Health(_Schema):
    status: str = Field(examples=["ok"])


class Readiness(_Schema):
    status: str = Field(examples=["ready"], description="ready, or not_ready")
    database: str = Field(examples=["ok"], description="ok, or unreachable")
    proxies: dict[str, str] = Field(
        default_factory=dict,
        examples=[{"proxy-a-8080": "ok"}],
        description="Each proxy writing metrics here (last day): ok, or what is wrong",
    )


class UsageOut(_Schema):
    input_tokens: int | None = Field(description="gen_ai.usage.input_tokens; null when not reported")
    output_tokens: int | None = Field(description="gen_ai.usage.output_tokens; null when not reported")
    cache_read_input_tokens: int | None = Field(
        description="gen_ai.usage.cache_read.input_tokens: input read from a prompt cache; null when not reported"
    )
    cache_creation_input_tokens: int | None = Field(
        description="gen_ai.usage.cache_creation.input_tokens: input written to a prompt cache; null when not reported"
    )
    reasoning_output_tokens: int | None = Field(description="Output tokens spent on reasoning; null when not reported")
    total_tokens: int | None = Field(description="The vendor's total as sent (never computed); null when not sent")
    details: dict[str, dict[str, int]] | None = Field(
        description="Other reported counts, {group: {name: tokens}}: groups input, output, cache_read,"
        " cache_creation (names are modalities or the vendor's counts) and duration_ns (nanoseconds)"
    )
    reported: bool = Field(description="A usage event was seen")


class ChoiceOut(_Schema):
    index: int
    text: str | None = Field(description="The choice's text block; null for a role without the content permission")
    stop_reason: str | None
    stop_reason_raw: str | None


class ErrorInfoOut(_Schema):
    code: str | None
    message: str | None


class BlockOut(_Schema):
    index: int
    type: str
    text: str | None = Field(description="null for a role without the content permission")
    stop_reason: str | None


class ToolCallOut(_Schema):
    index: int | None
    id: str | None
    name: str | None
    arguments: str | None = Field(
        description="JSON-encoded arguments exactly as streamed; null for a role without the content permission"
    )
    declared: bool | None = Field(
        description="The name was among the request's declared tools (draft §8.2); null where the request"
        " cannot declare them (an AI SDK UI request: its tools live on the app's server)"
    )


class ViolationOut(_Schema):
    kind: str = Field(examples=["seq_gap"])
    seq: int | None = Field(description="Stream seq concerned; may exceed 2^53 (draft §8.4)")
    detail: str


class RequestOut(_Schema):
    version: str | None
    stream: bool | None
    model: str | None = Field(description="gen_ai.request.model")
    messages: list[Any] | None = Field(
        description="As sent; binary parts reduced to type and data_bytes; null for a role without the content"
        " permission"
    )
    tools: list[dict[str, Any]] | None = Field(
        description="Declared tools as sent; null for a role without the content permission"
    )
    parameters: dict[str, Any]
    metadata: dict[str, Any] | None = Field(description="As sent; null for a role without the content permission")
    extensions: list[str]
    body_bytes: int
    tool_names: list[str] = Field(description="Declared tool names, normalised from the dialect's tool shape")
    end_user: str | None = Field(description="enduser.id: the end-user identifier the request carried")
    request_id: str | None = Field(description="The client's own correlation id (draft §4.6 metadata.request_id)")


class ProvenanceOut(_Schema):
    """Where an ingested record came from (``observer ingest``; ``observer.records.Provenance``)."""

    source: str = Field(description="offline_ingest: read from a saved capture, not observed live")
    file: str = Field(description="The file's absolute path when it was read")
    file_sha256: str = Field(description="SHA-256 (hex) of the file's bytes")
    file_format: str = Field(description="mitmproxy (a flow dump, mitmdump -w) or har (HTTP Archive)")
    flow_id: str = Field(description="The flow's id in the dump; entry-<n> (0-based) in a HAR")
    ingested_at: str = Field(json_schema_extra=_TIME)


class KeyOwnerOut(_Schema):
    owner: str
    team: str | None


class ExchangeOut(_Schema):
    """The full audit record of one exchange (``observer.records.Exchange.to_dict()``)."""

    id: str
    dialect: str
    scheme: str = Field(description="url.scheme")
    host: str = Field(description="server.address")
    port: int | None = Field(description="server.port")
    path: str
    method: str
    http_version: str
    client_address: str | None = Field(
        description="client.address as the proxy saw it, or its keyed pseudonym (setting client_address); null when off"
    )
    proxy_user: str | None = Field(description="The user the proxy authenticated (mitmproxy proxyauth)")
    key_fingerprint: str | None = Field(
        description="hmac-sha256 fingerprint of the request's API credential (never the credential)"
    )
    status_code: int | None
    started_at: str = Field(json_schema_extra=_TIME)
    ended_at: str | None = Field(json_schema_extra=_TIME)
    ttft_s: float | None = Field(description="Seconds from request start to first generated text")
    request_id: str | None
    request: RequestOut
    request_model: str | None = Field(description="gen_ai.request.model")
    model: str | None = Field(description="gen_ai.response.model")
    text: str | None = Field(
        description="All text blocks joined in index order; null for a role without the content permission"
    )
    response_id: str | None = Field(description="gen_ai.response.id: the vendor's response or message id")
    system_fingerprint: str | None = Field(description="openai.response.system_fingerprint")
    service_tier: str | None = Field(description="The service tier that served the response, as sent")
    blocks: list[BlockOut]
    reasoning: str | None = Field(
        description="All reasoning blocks joined in index order; null for a role without the content permission"
    )
    choices: list[ChoiceOut] | None = Field(
        description="Per-choice results when the response had several choices (n > 1); null for one answer"
    )
    tool_calls: list[ToolCallOut]
    usage: UsageOut
    stop_reason: str | None
    stop_reason_raw: str | None
    error: ErrorInfoOut | None
    outcome: str = Field(examples=["completed"])
    violations: list[ViolationOut]
    response_body: str | None
    transport_error: str | None
    response_bytes: int
    events: int
    provenance: ProvenanceOut | None = Field(
        description="null for a record observed live; where an ingested one came from (observer ingest)"
    )
    request_last_event_id: str | None = Field(
        description="The request's Last-Event-ID header (a client resuming an event stream); null: not a resumption"
    )
    last_event_id: str | None = Field(description="The id of the response's last SSE event; null: the stream set none")
    conversation_id: str | None = Field(
        description="gen_ai.conversation.id: the id of the conversation's first exchange (linked by the store)"
    )
    resumes_id: str | None = Field(
        description="The exchange this one resumes: same host, its last_event_id = this request's Last-Event-ID"
    )
    key_owner: KeyOwnerOut | None = Field(
        description="Who holds the credential of key_fingerprint (observer key-owner add); null when unknown"
    )
    content_withheld: bool = Field(
        description="True when this role may not read content: text, block text, tool arguments, request messages"
        " and response_body are then null"
    )


def _summary_schema() -> type[_Schema]:
    """``ExchangeSummary``: the ``ExchangeOut`` fields ``SUMMARY_KEYS`` lists, in that order,
    plus the summary's own ``end_user`` (the column copied from ``request.end_user``)."""
    own: dict[str, Any] = {"end_user": (str | None, Field(description="enduser.id (as the request carried it)"))}
    fields = {
        key: own[key] if key in own else (ExchangeOut.model_fields[key].annotation, copy(ExchangeOut.model_fields[key]))
        for key in SUMMARY_KEYS
    }
    model: type[_Schema] = create_model(  # type: ignore[call-overload]
        "ExchangeSummary",
        __base__=_Schema,
        __module__=__name__,
        __doc__="One item of ``GET /v1/exchanges``: the record without request, content and violations.",
        **fields,
    )
    return model


ExchangeSummary = _summary_schema()


class ExchangePage(_Schema):
    items: list[ExchangeSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")
    recorded_position: str | None = Field(
        description="With ?recorded_after=: pass it as recorded_after next time (the same when nothing new); else null"
    )


class ConversationOut(_Schema):
    id: str = Field(description="gen_ai.conversation.id: its first exchange's id")
    exchanges: list[ExchangeSummary] = Field(description="Oldest first")


_SUM = "Sum in tokens of {} over the exchanges that reported it (a count not reported adds nothing; 0 when none did)"
_REPORTED = "Exchanges that reported {}, whose counts the sum adds (0: none reported it, unlike a sum of 0)"


class StatsGroup(BaseModel):
    """One group: its key (named as ``group_by``: model, day, user, dialect or host) and counts.
    Per token class (the record's ``usage`` names, after OpenTelemetry ``gen_ai.usage.*``) a sum
    and ``<class>_reported``, the exchanges whose count it sums (``observer.store.query.stats``)."""

    model_config = ConfigDict(extra="allow")
    exchanges: int = Field(description="Exchanges of the group")
    input_tokens: int = Field(description=_SUM.format("gen_ai.usage.input_tokens"))
    input_tokens_reported: int = Field(description=_REPORTED.format("input_tokens"))
    output_tokens: int = Field(description=_SUM.format("gen_ai.usage.output_tokens"))
    output_tokens_reported: int = Field(description=_REPORTED.format("output_tokens"))
    cache_read_input_tokens: int = Field(
        description=_SUM.format("gen_ai.usage.cache_read.input_tokens (input read from a prompt cache)")
    )
    cache_read_input_tokens_reported: int = Field(description=_REPORTED.format("cache_read_input_tokens"))
    cache_creation_input_tokens: int = Field(
        description=_SUM.format("gen_ai.usage.cache_creation.input_tokens (input written to a prompt cache)")
    )
    cache_creation_input_tokens_reported: int = Field(description=_REPORTED.format("cache_creation_input_tokens"))
    reasoning_output_tokens: int = Field(
        description=_SUM.format("reasoning_output_tokens (output tokens spent on reasoning)")
    )
    reasoning_output_tokens_reported: int = Field(description=_REPORTED.format("reasoning_output_tokens"))
    usage_not_reported: int = Field(description="Exchanges without a usage report (their tokens are unknown)")


class StatsOut(_Schema):
    group_by: str
    filters: dict[str, Any] = Field(description="The filters applied, as given")
    groups: list[StatsGroup]


class ViolationCountOut(_Schema):
    count: int = Field(description="Violations of this kind")
    exchanges: int = Field(description="Exchanges with at least one violation of this kind")


class ConformanceGroup(BaseModel):
    """One group of the conformance report (``observer.store.conformance``): its key (``host``:
    scheme, host, port, dialect and endpoint; ``dialect``; ``day``) and its counts, each share
    derived from its count (null when its denominator is 0)."""

    model_config = ConfigDict(extra="allow")
    exchanges: int = Field(description="Exchanges of the group")
    completed: int = Field(
        description="Outcome completed: the stream ended with stream.end or the dialect's equivalent"
    )
    completed_share: float = Field(description="completed / exchanges")
    usage_reported: int = Field(description="Exchanges with a usage report")
    usage_reported_share: float = Field(description="usage_reported / exchanges")
    conformant: int = Field(description="Exchanges without any violation")
    conformant_share: float = Field(description="conformant / exchanges")
    seq_checked: int = Field(
        description="Exchanges with events of a dialect whose events carry a sequence number (seq_dialects)"
    )
    seq_monotonic: int | None = Field(
        description="Of seq_checked, those without seq_gap or seq_repeat (draft §5.2); null when seq_checked is 0"
    )
    seq_monotonic_share: float | None = Field(description="seq_monotonic / seq_checked; null when seq_checked is 0")
    violations: dict[str, ViolationCountOut] = Field(description="Per violation kind recorded in the group")


class ConformanceOut(_Schema):
    group_by: str
    filters: dict[str, Any] = Field(description="The filters applied, as given")
    seq_dialects: list[str] = Field(description="The dialects whose sequence numbers are checked")
    groups: list[ConformanceGroup]


class AccessLogEntry(_Schema):
    """One API call (``observer.store.access``)."""

    seq: int
    at: str = Field(json_schema_extra=_TIME)
    principal: str | None = Field(description="Token name; bootstrap; null when no valid token was given")
    role: str | None
    client: str | None = Field(description="client.address")
    method: str
    endpoint: str = Field(description="http.route, e.g. /v1/exchanges/{exchange_id}")
    path: str
    params: dict[str, Any] = Field(description="query, path and body parameters; authorization: why none was valid")
    status: int
    rows: int | None
    ids: list[str] | None
    record_hash: str = Field(description="Chain hash (hex)")


class AccessLogPage(_Schema):
    items: list[AccessLogEntry]
    next_before_seq: int | None = Field(description="Pass as ?before_seq= for the next page; null on the last page")


class IncidentSummary(_Schema):
    """An incident (``observer.store.incidents``) without its notes and exchanges."""

    id: str
    title: str
    category: str = Field(examples=["serious_harm_to_health"])
    status: str = Field(examples=["open"])
    aware_at: str = Field(json_schema_extra=_TIME)
    deadline: str | None = Field(
        json_schema_extra=_TIME, description="Report deadline: aware_at + 2, 10 or 15 days (Art. 73); null: none"
    )
    created_at: str = Field(json_schema_extra=_TIME)
    created_by: str
    updated_at: str = Field(json_schema_extra=_TIME)
    updated_by: str


class IncidentNoteOut(_Schema):
    position: int
    at: str = Field(json_schema_extra=_TIME)
    author: str
    text: str


class IncidentLinkOut(_Schema):
    exchange_id: str
    linked_at: str = Field(json_schema_extra=_TIME)
    linked_by: str
    hold_id: str = Field(description="The legal hold it was put under when linked")


class IncidentOut(IncidentSummary):
    notes: list[IncidentNoteOut]
    exchanges: list[IncidentLinkOut]


class HoldScopeOut(_Schema):
    since: str | None
    until: str | None
    user: str | None
    host: str | None
    exchange_ids: list[str] | None


class HoldOut(_Schema):
    """A legal hold (``observer.store.holds``)."""

    id: str
    reason: str
    created_at: str = Field(json_schema_extra=_TIME)
    created_by: str
    scope: HoldScopeOut
    released_at: str | None = Field(json_schema_extra=_TIME)
    released_by: str | None
    release_reason: str | None


class ExportFileOut(_Schema):
    name: str
    holds: str | None
    rows: int | None
    bytes: int | None
    sha256: str | None


class ExportJobOut(_Schema):
    """An export job (``observer.api.exportjobs``): running, done, failed or incomplete."""

    id: str
    status: str = Field(examples=["running"])
    format: str
    filter: dict[str, Any]
    created_at: str = Field(json_schema_extra=_TIME)
    created_by: str
    total: int | None = Field(description="Records to export (known once counted)")
    done: int = Field(description="Records written so far")
    records: int | None = Field(description="Records in the finished export (its manifest)")
    error: str | None
    files: list[ExportFileOut] = Field(description="Download each at /v1/exports/{id}/files/{name}")


class RetentionOut(_Schema):
    retention_days: int
    retention_override: bool
    cutoff: str = Field(json_schema_extra=_TIME, description="Records started before it are past retention")
    oldest_record: str | None = Field(json_schema_extra=_TIME)
    due: int = Field(description="Past the cutoff and not held: a purge now removes them")
    held: int = Field(description="Past the cutoff, kept for a legal hold")
    active_holds: int


class PurgeOut(_Schema):
    dry_run: bool
    cutoff: str = Field(json_schema_extra=_TIME)
    records: int = Field(description="Removed (or, dry, that would be)")
    held: int
    by_writer: dict[str, int]
    unchained: int
    event_seq: int | None = Field(description="The purge's store event; null when dry")


class AlertOut(_Schema):
    id: str
    fired_at: str = Field(description="RFC 3339 UTC")
    rule: str = Field(description="The rule's name in the alerts file")
    kind: str = Field(description="observer.alerting.rules.RULE_KINDS")
    severity: str = Field(description="info, warning or critical")
    summary: str
    proxy: str = Field(description="The proxy process that fired it")
    exchange_id: str | None = Field(description="The record it is about (record rules)")
    details: dict[str, Any] = Field(description="Counts and ids: never record content")
    deliveries: dict[str, str] = Field(description="Webhook name -> pending, delivered, or failed: why")


class AlertPage(_Schema):
    items: list[AlertOut]


class ReplayOut(_Schema):
    """One exchange replayed in the draft standard's format (``GET /v1/exchanges/{id}/replay``;
    ``observer.standard_replay``)."""

    id: str
    dialect: str = Field(description="The dialect the exchange was recorded in", examples=["openai.chat"])
    status_code: int | None = Field(description="The HTTP status the recorded response came with")
    request: dict[str, Any] = Field(description="The application/llm-request+json request envelope (draft §4.2)")
    stream: str = Field(description="The text/event-stream of draft events, stream.start first (draft §5)")
