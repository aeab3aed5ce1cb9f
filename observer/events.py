"""Canonical stream events: the draft's event taxonomy (draft §5.3) as frozen dataclasses.

Dialect adapters map their wire messages onto these; ``observer.reassembly.Reassembler``
turns them into one ``Exchange``. ``seq`` is the wire sequence number when the dialect has one
(the standard does, draft §5.2), else ``None``. Pure module: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StreamStart:
    """``stream.start``: the endpoint accepted the request; ``model`` generates the response."""

    seq: int | None
    model: str | None
    request_id: str | None = None


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """``content.delta``: ``text`` appended to content block ``index``. ``block_type`` is
    ``"text"`` (the answer; joined into the record's ``text``), ``"reasoning"`` (thinking,
    reasoning summaries) or ``"refusal"``; adapters give each its own block index."""

    seq: int | None
    index: int
    text: str
    block_type: str = "text"


@dataclass(frozen=True, slots=True)
class ContentStop:
    """``content.stop``: block ``index`` ended; ``stop_reason`` canonical, ``stop_reason_raw`` as sent."""

    seq: int | None
    index: int
    stop_reason: str | None
    stop_reason_raw: str | None


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    """``tool.call``: a complete tool invocation request; ``arguments`` is the JSON string as sent."""

    seq: int | None
    index: int | None
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of a streamed tool call (OpenAI ``tool_calls`` deltas, Anthropic
    ``input_json_delta``, Responses ``function_call_arguments.delta``, AI SDK
    ``tool-input-delta``). Fragments with the same ``key`` (opaque, chosen by the adapter) are
    one call, recorded at its first fragment's position: ``index``, ``id`` and ``name`` are
    taken from the first fragment that carries each (never overwritten), ``arguments``
    fragments are appended in order."""

    seq: int | None
    key: str
    index: int | None
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class StopEvent:
    """Why the whole message stopped (vendor stop/finish reasons that are not tied to one
    content block): ``stop_reason`` canonical (draft §5.3 values where the mapping is exact,
    else the vendor's), ``stop_reason_raw`` as sent. ``choice``: the choice this reason ends
    when the response has several (OpenAI ``choices[].index`` with ``n > 1``, Gemini
    ``candidates[].index``), whose text is the ``text`` block of index ``text_block`` (``None``:
    the same index as the choice, as OpenAI's); ``choice`` ``None``: the message (a dialect
    without choices). Gemini writes candidate ``c``'s answer to block ``2c`` (its thoughts to
    ``2c + 1``), so its stop events say ``text_block=2c``."""

    seq: int | None
    stop_reason: str | None
    stop_reason_raw: str | None
    choice: int | None = None
    text_block: int | None = None


@dataclass(frozen=True, slots=True)
class ChoiceOpen:
    """A choice of the response seen for the first time (OpenAI ``choices[].index``, Gemini
    ``candidates[].index``), whose text is the ``text`` block of index ``text_block`` (OpenAI:
    ``choice``; Gemini: ``2 * choice``). With ``StopEvent.choice`` it gives the record's
    ``choices``: a choice that never stopped (a stream cut short, a choice without its
    ``finish_reason``) is listed too, its stop reasons ``None``. Metadata of the response like
    ``ResponseIdentity``: not counted in the record's ``events``."""

    seq: int | None
    choice: int
    text_block: int


@dataclass(frozen=True, slots=True)
class ModelEvent:
    """The model that generated the response, when a dialect learns it outside a
    ``stream.start`` (e.g. every OpenAI chunk's ``model``); empty names are ignored."""

    seq: int | None
    model: str


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """``usage``: token counts (tokens; ``None`` = not in this event). Later values replace
    earlier ones, each count on its own (the draft allows several usage events; each carries
    the totals so far).

    Beyond the draft's two counts (draft §5.3), what vendors report, named after the
    OpenTelemetry ``gen_ai.usage.*`` attributes: ``cache_read_input_tokens`` (input tokens
    read from a prompt cache), ``cache_creation_input_tokens`` (input tokens written to one),
    ``reasoning_output_tokens`` (output tokens spent on reasoning), ``total_tokens`` (the
    total as the vendor sent it, never computed), and ``details``: other counts the vendor
    reports, ``((group, name, value), ...)`` with ``group`` ``"input"``, ``"output"``,
    ``"cache_read"``, ``"cache_creation"`` or ``"duration_ns"`` and ``name`` a modality
    (``"text"``, ``"audio"``, ``"image"``, ...) or the vendor's own lower-cased name (see
    each dialect); a later value of one (group, name) replaces the earlier one."""

    seq: int | None
    input_tokens: int | None
    output_tokens: int | None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    reasoning_output_tokens: int | None = None
    total_tokens: int | None = None
    details: tuple[tuple[str, str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ResponseIdentity:
    """Which response the vendor said this was: ``response_id`` (``gen_ai.response.id``:
    OpenAI ``chatcmpl-…``/``resp_…``, Anthropic ``msg_…``, Gemini ``responseId``, Bedrock's
    request id where the body carries none), ``system_fingerprint`` (OpenAI's backend
    configuration, ``openai.response.system_fingerprint``) and ``service_tier`` (the tier that
    served it, ``openai.response.service_tier`` / Anthropic ``usage.service_tier``). ``None`` =
    not in this event; a later value replaces an earlier one (a Responses stream's
    ``response.created`` echoes the requested tier, its final ``response`` the tier that served)."""

    seq: int | None
    response_id: str | None = None
    system_fingerprint: str | None = None
    service_tier: str | None = None


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """``error``: a generation error with machine ``code`` and human ``message``."""

    seq: int | None
    code: str | None
    message: str | None


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """``stream.end``: clean termination of the stream."""

    seq: int | None
    request_id: str | None = None


CanonicalEvent = (
    StreamStart
    | ContentDelta
    | ContentStop
    | ToolCallEvent
    | ToolCallDelta
    | StopEvent
    | ChoiceOpen
    | ModelEvent
    | UsageEvent
    | ResponseIdentity
    | ErrorEvent
    | StreamEnd
)
