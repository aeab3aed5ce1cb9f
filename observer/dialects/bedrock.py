"""Amazon Bedrock runtime: ``Converse`` / ``ConverseStream`` (``bedrock.converse``) and
``InvokeModel`` / ``InvokeModelWithResponseStream`` (``bedrock.invoke``), on
``bedrock-runtime.{region}.amazonaws.com``.

Sources: AWS Bedrock API reference "ConverseStream" (request ``messages``, ``system``,
``inferenceConfig``, ``toolConfig``, ``additionalModelRequestFields``, ``requestMetadata``;
response stream ``ConverseStreamOutput``: ``messageStart``, ``contentBlockStart``,
``contentBlockDelta``, ``contentBlockStop``, ``messageStop``, ``metadata`` and the exceptions
``internalServerException``, ``modelStreamErrorException``, ``validationException``,
``throttlingException``, ``serviceUnavailableException``), "Converse" (the same message as one
JSON body: ``output.message``, ``stopReason``, ``usage``), "InvokeModelWithResponseStream"
(``chunk`` events, ``PayloadPart.bytes``: base64 of the model's own JSON; plus
``modelTimeoutException``), botocore's ``bedrock-runtime/2023-09-30`` service model (the URL
paths ``/model/{modelId}/converse-stream`` etc.), the AWS event-stream encoding
(``observer.wire.eventstream``); shared reference binary-formats §8 and vendor-wire-formats §4
("Bedrock-hosted Anthropic") and §8.

The framing (``Framing.EVENT_STREAM``, ``observer.wire.frames.EventStreamFramer``) gives one
message per event-stream frame: ``event`` is the ``:event-type`` header (``messageStart``, ...,
``chunk``), ``exception:<:exception-type>`` for a modelled exception and
``error:<:error-code>`` for an unmodelled error (its ``data`` then ``{"message": ...}`` from the
``:error-message`` header); ``data`` is the frame's payload (JSON).

Decisions:

- The model is the URL's ``{modelId}`` (URL-decoded: a model id, an inference-profile id such
  as ``us.anthropic.claude-...`` or an ARN); the stream never names it, so the record's response
  ``model`` stays ``None`` and ``request.model`` holds it.
- Converse content blocks are recorded as sent, but ``image`` / ``document`` / ``video``
  ``source.bytes`` (base64) become ``source.data_bytes`` (decoded size); ``system`` is a leading
  ``{"role": "system", "content": [...]}`` message, as for Anthropic.
- Converse usage (``CONVERSE_USAGE``): input, output, total, cache read and write counts as
  sent (``inputTokens`` excludes the cached ones); ``serviceTier.type`` is the ``service_tier``.
  ``metrics.latencyMs`` is not kept, nor the ``x-amzn-requestid`` header (adapters see no headers).
- Converse stop reasons: ``end_turn``, ``tool_use``, ``max_tokens``, ``stop_sequence`` are the
  canonical names already; ``guardrail_intervened`` and ``content_filtered`` are
  ``content_filter``; any other is kept as sent. The stream ends cleanly (``StreamEnd``) at
  ``metadata`` after ``messageStop``, or at the body's end after ``messageStop`` when no
  ``metadata`` came (then usage is not reported); without ``messageStop`` it is truncated.
- InvokeModel: the body is the model provider's own request and response format. Anthropic's
  (``anthropic_version`` ``bedrock-2023-05-31``, ``messages``) is read as the
  ``anthropic.messages`` dialect reads it, the decoded ``chunk`` payloads mapped by its adapter;
  the final chunk's ``amazon-bedrock-invocationMetrics`` (``METRICS_USAGE``: input, output,
  cache read and write counts) gives usage when the model's own events gave none. Other providers'
  bodies are read for what is common: the prompt (``prompt`` / ``inputText`` / ``messages``),
  text (``outputText``, ``generation``, ``completion``, ``outputs[].text``), stop reason
  (``completionReason``, ``stop_reason``, ``outputs[].stop_reason``), usage from the invocation
  metrics; the model-specific rest is not interpreted.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any
from urllib.parse import unquote

import orjson

from observer.dialects.anthropic import AnthropicAdapter, read_messages_request
from observer.dialects.base import AdapterBase, DialectBase, Message, RequestView
from observer.dialects.toolkit import Out, base64_decoded_size, check_messages, not_llm_request, vendor_object
from observer.dialects.usage import UsageMap, read_usage
from observer.events import (
    ContentDelta,
    ErrorEvent,
    ResponseIdentity,
    StopEvent,
    StreamEnd,
    StreamStart,
    ToolCallDelta,
    ToolCallEvent,
    UsageEvent,
)
from observer.records import RequestFacts, Violation, ViolationKind
from observer.response import ResponseSpec
from observer.wire.frames import Framing, JSONFrame

V = ViolationKind

EVENT_STREAM = "application/vnd.amazon.eventstream"
_PATH = re.compile(r"^/model/(?P<model>[^/]+)/(?P<op>converse|converse-stream|invoke|invoke-with-response-stream)$")
CONVERSE_OPS = frozenset({"converse", "converse-stream"})
INVOKE_OPS = frozenset({"invoke", "invoke-with-response-stream"})
STREAM_OPS = frozenset({"converse-stream", "invoke-with-response-stream"})
CONVERSE_PARAMETERS = (
    "inferenceConfig",
    "additionalModelRequestFields",
    "additionalModelResponseFieldPaths",
    "guardrailConfig",
    "performanceConfig",
    "promptVariables",
    "serviceTier",
)
STOP_REASONS = {"guardrail_intervened": "content_filter", "content_filtered": "content_filter"}
BINARY_BLOCKS = ("image", "document", "video")


def bedrock_path(path: str) -> tuple[str, str] | None:
    """``(modelId URL-decoded, operation)`` of a Bedrock runtime path (no query), else ``None``."""
    m = _PATH.match(path)
    if m is None:
        return None
    return unquote(m.group("model")), m.group("op")


class _BedrockBase(DialectBase):
    """What both Bedrock dialects share: the path, the model in it, the event-stream framing."""

    ops: frozenset[str] = frozenset()
    #: The AWS request id of the response (``ResponseMetadata.RequestId`` in boto3): the
    #: ``response_id`` when the events name none (Converse never does; an Anthropic model's
    #: ``message.id`` inside InvokeModel does, and wins).
    response_id_header = "x-amzn-requestid"

    def matches(self, request: RequestView) -> bool:
        if request.method.upper() != "POST":
            return False
        found = bedrock_path(request.path_only)
        return found is not None and found[1] in self.ops

    def framing(self, spec: ResponseSpec) -> Framing | None:
        if spec.media_type == EVENT_STREAM:
            return Framing.EVENT_STREAM
        return super().framing(spec)


class BedrockConverseDialect(_BedrockBase):
    """``POST /model/{modelId}/converse-stream`` (event stream) and ``/converse`` (one JSON)."""

    name = "bedrock.converse"
    ops = CONVERSE_OPS

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        """Reads a Converse request. Shape (else ``not_llm_request``): a JSON object with a
        ``messages`` array (the model is in the path). Never raises."""
        doc, why = vendor_object(body)
        if doc is None:
            return not_llm_request(body, why)
        if not isinstance(doc.get("messages"), list):
            return not_llm_request(body, "no messages array")
        found = bedrock_path(request.path_only)
        violations: list[Violation] = []
        facts = RequestFacts(body_bytes=len(body), model=found[0] if found else None)
        facts.stream = found is not None and found[1] in STREAM_OPS
        messages: list[Any] = []
        system = doc.get("system")
        if system is not None:
            if not isinstance(system, list):
                violations.append(Violation(V.INVALID_REQUEST, None, "system is not an array"))
            messages.append({"role": "system", "content": system})
        check_messages(doc["messages"], violations)
        messages.extend(strip_bytes(m) for m in doc["messages"])
        facts.messages = messages
        facts.tools, facts.tool_names = _converse_tools(doc.get("toolConfig"), violations)
        facts.parameters = {k: doc[k] for k in CONVERSE_PARAMETERS if k in doc}
        if isinstance(doc.get("toolConfig"), dict) and "toolChoice" in doc["toolConfig"]:
            facts.parameters["toolChoice"] = doc["toolConfig"]["toolChoice"]
        metadata = doc.get("requestMetadata")
        if isinstance(metadata, dict):
            facts.metadata = metadata
        elif metadata is not None:
            violations.append(Violation(V.INVALID_REQUEST, None, "requestMetadata is not an object"))
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> ConverseAdapter:
        return ConverseAdapter()


def _converse_tools(config: Any, violations: list[Violation]) -> tuple[list[dict[str, Any]], list[str]]:
    """``toolConfig.tools`` as sent and the names of their ``toolSpec``s."""
    if config is None:
        return [], []
    if not isinstance(config, dict):
        violations.append(Violation(V.INVALID_REQUEST, None, "toolConfig is not an object"))
        return [], []
    tools = config.get("tools")
    if not isinstance(tools, list):
        if tools is not None:
            violations.append(Violation(V.INVALID_REQUEST, None, "toolConfig.tools is not an array"))
        return [], []
    kept = [t for t in tools if isinstance(t, dict)]
    names = [
        t["toolSpec"]["name"]
        for t in kept
        if isinstance(t.get("toolSpec"), dict) and isinstance(t["toolSpec"].get("name"), str)
    ]
    return kept, names


def strip_bytes(value: Any) -> Any:
    """``value`` with every ``{"image"|"document"|"video": {"source": {"bytes": "<base64>"}}}``
    source reduced to ``{"data_bytes": N}`` plus its other keys (at any depth: inside
    ``toolResult`` content too); everything else as sent."""
    if isinstance(value, list):
        return [strip_bytes(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in BINARY_BLOCKS and isinstance(item, dict) and isinstance(item.get("source"), dict):
            source = item["source"]
            if isinstance(source.get("bytes"), str):
                source = {k: v for k, v in source.items() if k != "bytes"} | {
                    "data_bytes": base64_decoded_size(source["bytes"])
                }
            out[key] = {k: (source if k == "source" else strip_bytes(v)) for k, v in item.items()}
        else:
            out[key] = strip_bytes(item)
    return out


class ConverseAdapter(AdapterBase):
    """Maps a ConverseStream response (or a Converse JSON body) onto canonical events.

    Checks: a payload that is not a JSON object, or a block index that is not a non-negative
    integer (``invalid_event``); a ``contentBlockStop`` for an index that no ``contentBlockStart``
    or ``contentBlockDelta`` opened (a text block has no start: its first delta opens it),
    ``block_not_started``; an unknown event type is skipped (the API may add members)."""

    def __init__(self) -> None:
        self._tool_blocks: set[int] = set()
        self._opened: set[int] = set()  # block indexes a start or delta opened
        self._stopped = False
        self._ended = False

    def on_message(self, message: Message) -> Out:
        try:
            obj = orjson.loads(message.data)
        except orjson.JSONDecodeError as exc:
            return [Violation(V.INVALID_JSON, None, f"event {message.event!r}: {exc}")]
        return self.on_object(message, obj)

    def on_object(self, message: Message, obj: Any) -> Out:
        name = message.event
        out: Out = []
        if not isinstance(obj, dict):
            return [Violation(V.INVALID_EVENT, None, f"event {name!r}: payload is not a JSON object")]
        if not name:  # the whole Converse body (Framing.JSON)
            self._whole(obj, out)
            return out
        if name.startswith(("exception:", "error:")):
            code = name.partition(":")[2] or None
            text = obj.get("message")
            out.append(ErrorEvent(None, code, text if isinstance(text, str) else None))
            return out
        handler = _CONVERSE_HANDLERS.get(name)
        if handler is not None:
            handler(self, obj, out)
        return out

    def on_close(self) -> Out:
        """A stream that stopped (``messageStop``) but sent no ``metadata`` still ended cleanly."""
        if self._stopped and not self._ended:
            self._ended = True
            return [StreamEnd(None)]
        return []

    def _message_start(self, obj: dict[str, Any], out: Out) -> None:
        out.append(StreamStart(None, None, None))

    def _block_start(self, obj: dict[str, Any], out: Out) -> None:
        index = _index(obj, out)
        start = obj.get("start")
        if index is not None:
            self._opened.add(index)
        if index is None or not isinstance(start, dict):
            return
        tool = start.get("toolUse")
        if isinstance(tool, dict):
            self._tool_blocks.add(index)
            tid, name = tool.get("toolUseId"), tool.get("name")
            out.append(
                ToolCallDelta(
                    None,
                    str(index),
                    index,
                    tid if isinstance(tid, str) else None,
                    name if isinstance(name, str) else None,
                    "",
                )
            )

    def _block_delta(self, obj: dict[str, Any], out: Out) -> None:
        index = _index(obj, out)
        delta = obj.get("delta")
        if index is None:
            return
        self._opened.add(index)
        if not isinstance(delta, dict):
            out.append(Violation(V.INVALID_EVENT, None, "contentBlockDelta: delta is not an object"))
            return
        if isinstance(delta.get("text"), str):
            out.append(ContentDelta(None, index, delta["text"], "text"))
        elif isinstance(delta.get("toolUse"), dict):
            arguments = delta["toolUse"].get("input")
            if isinstance(arguments, str):
                out.append(ToolCallDelta(None, str(index), index, None, None, arguments))
            else:
                out.append(Violation(V.INVALID_EVENT, None, "contentBlockDelta: toolUse.input is not a string"))
        elif isinstance(delta.get("reasoningContent"), dict):
            text = delta["reasoningContent"].get("text")
            if isinstance(text, str):
                out.append(ContentDelta(None, index, text, "reasoning"))
            # signature, redactedContent: nothing the record holds
        # citation, image, toolResult deltas: nothing the record holds

    def _block_stop(self, obj: dict[str, Any], out: Out) -> None:
        """``contentBlockStop``: nothing the record holds, but one for an index never opened is
        ``block_not_started`` (the stop reason is ``messageStop``'s, unaffected)."""
        index = _index(obj, out)
        if index is not None and index not in self._opened:
            detail = f"contentBlockStop for contentBlockIndex {index}, which no contentBlockStart or contentBlockDelta opened"
            out.append(Violation(V.BLOCK_NOT_STARTED, None, detail))

    def _message_stop(self, obj: dict[str, Any], out: Out) -> None:
        self._stopped = True
        reason = obj.get("stopReason")
        if isinstance(reason, str):
            out.append(StopEvent(None, STOP_REASONS.get(reason, reason), reason))

    def _metadata(self, obj: dict[str, Any], out: Out) -> None:
        _converse_usage(obj.get("usage"), out)
        _service_tier(obj, out)
        if self._stopped and not self._ended:
            self._ended = True
            out.append(StreamEnd(None))

    def _whole(self, obj: dict[str, Any], out: Out) -> None:
        """A Converse response body: its message's content blocks at their array positions,
        stop reason, usage, end."""
        out.append(StreamStart(None, None, None))
        output = obj.get("output")
        message = output.get("message") if isinstance(output, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        for index, block in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(block, dict):
                continue
            if isinstance(block.get("text"), str):
                out.append(ContentDelta(None, index, block["text"], "text"))
            elif isinstance(block.get("toolUse"), dict):
                tool = block["toolUse"]
                tid, name = tool.get("toolUseId"), tool.get("name")
                arguments = orjson.dumps(tool["input"]).decode() if "input" in tool else ""
                out.append(
                    ToolCallEvent(
                        None,
                        index,
                        tid if isinstance(tid, str) else None,
                        name if isinstance(name, str) else None,
                        arguments,
                    )
                )
            elif isinstance(block.get("reasoningContent"), dict):
                text = block["reasoningContent"].get("reasoningText")
                text = text.get("text") if isinstance(text, dict) else None
                out.append(ContentDelta(None, index, text if isinstance(text, str) else "", "reasoning"))
        reason = obj.get("stopReason")
        if isinstance(reason, str):
            out.append(StopEvent(None, STOP_REASONS.get(reason, reason), reason))
        _converse_usage(obj.get("usage"), out)
        _service_tier(obj, out)
        out.append(StreamEnd(None))
        self._ended = True


def _index(obj: dict[str, Any], out: Out) -> int | None:
    index = obj.get("contentBlockIndex")
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < 2**63:
        return index
    out.append(Violation(V.INVALID_EVENT, None, "contentBlockIndex is not a non-negative integer"))
    return None


def _count(usage: dict[str, Any], key: str, out: Out) -> int | None:
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    out.append(Violation(V.INVALID_EVENT, None, f"usage.{key} is not a non-negative integer"))
    return None


#: Converse ``TokenUsage`` (Bedrock API reference, "TokenUsage"): ``inputTokens`` (cache
#: reads and writes excluded), ``outputTokens``, ``totalTokens``, ``cacheReadInputTokens``,
#: ``cacheWriteInputTokens``.
CONVERSE_USAGE = UsageMap(
    input=("inputTokens",),
    output=("outputTokens",),
    cache_read=("cacheReadInputTokens",),
    cache_creation=("cacheWriteInputTokens",),
    total=("totalTokens",),
)
#: InvokeModel's ``amazon-bedrock-invocationMetrics`` (Bedrock user guide, "Monitor model
#: invocation"): ``inputTokenCount``, ``outputTokenCount``, ``cacheReadInputTokenCount``,
#: ``cacheWriteInputTokenCount`` (the latencies are not usage).
METRICS_USAGE = UsageMap(
    input=("inputTokenCount",),
    output=("outputTokenCount",),
    cache_read=("cacheReadInputTokenCount",),
    cache_creation=("cacheWriteInputTokenCount",),
)


def _converse_usage(usage: Any, out: Out) -> None:
    read_usage(usage, CONVERSE_USAGE, None, out)


def _service_tier(obj: dict[str, Any], out: Out) -> None:
    """Converse ``serviceTier.type`` (``default``, ``priority``, ``flex``) as the ``service_tier``."""
    tier = obj.get("serviceTier")
    tier = tier.get("type") if isinstance(tier, dict) else None
    if isinstance(tier, str) and tier:
        out.append(ResponseIdentity(None, service_tier=tier))


_CONVERSE_HANDLERS = {
    "messageStart": ConverseAdapter._message_start,
    "contentBlockStart": ConverseAdapter._block_start,
    "contentBlockDelta": ConverseAdapter._block_delta,
    "contentBlockStop": ConverseAdapter._block_stop,
    "messageStop": ConverseAdapter._message_stop,
    "metadata": ConverseAdapter._metadata,
    # unknown members: nothing to record
}


class BedrockInvokeDialect(_BedrockBase):
    """``POST /model/{modelId}/invoke-with-response-stream`` (event stream of ``chunk``s) and
    ``/invoke`` (the model's JSON body)."""

    name = "bedrock.invoke"
    ops = INVOKE_OPS

    def parse_request(self, body: bytes, request: RequestView) -> tuple[RequestFacts, list[Violation]]:
        """Reads an InvokeModel body: Anthropic's Messages body as ``anthropic.messages`` reads
        it (the path's model); another provider's ``prompt`` / ``inputText`` as one user
        message, or its ``messages`` as sent. Shape (else ``not_llm_request``): a JSON object
        with ``messages``, ``prompt`` or ``inputText``. Never raises."""
        doc, why = vendor_object(body)
        if doc is None:
            return not_llm_request(body, why)
        found = bedrock_path(request.path_only)
        model = found[0] if found else None
        stream = found is not None and found[1] in STREAM_OPS
        if isinstance(doc.get("messages"), list) and "anthropic_version" in doc:
            facts, violations = read_messages_request(body, model)
            facts.stream = stream  # the operation says it; Bedrock's Anthropic body has no stream flag
            return facts, violations
        violations: list[Violation] = []
        facts = RequestFacts(body_bytes=len(body), model=model, stream=stream)
        if isinstance(doc.get("messages"), list):
            check_messages(doc["messages"], violations)
            facts.messages = [strip_bytes(m) for m in doc["messages"]]
        elif isinstance(doc.get("prompt"), str):
            facts.messages = [{"role": "user", "content": doc["prompt"]}]
        elif isinstance(doc.get("inputText"), str):
            facts.messages = [{"role": "user", "content": doc["inputText"]}]
        else:
            return not_llm_request(body, "no messages, prompt or inputText")
        facts.parameters = {k: v for k, v in doc.items() if k not in ("messages", "prompt", "inputText")}
        return facts, violations

    def new_adapter(self, spec: ResponseSpec) -> InvokeAdapter:
        return InvokeAdapter()


class InvokeAdapter(AdapterBase):
    """Maps an InvokeModelWithResponseStream response (or an InvokeModel body) onto canonical
    events: each ``chunk``'s ``bytes`` base64-decoded to the model's own JSON event; an
    Anthropic event (a ``type`` field) goes to the Anthropic adapter, any other to the common
    reading of the module docstring. The final ``amazon-bedrock-invocationMetrics`` gives
    usage when none came otherwise. Checks: a ``chunk`` without base64 ``bytes``, or bytes that
    are not a JSON object (``invalid_event``)."""

    def __init__(self) -> None:
        self._anthropic = AnthropicAdapter()
        self._usage_seen = False
        self._started = False
        self._generic_stopped = False
        self._ended = False

    def on_message(self, message: Message) -> Out:
        try:
            obj = orjson.loads(message.data)
        except orjson.JSONDecodeError as exc:
            return [Violation(V.INVALID_JSON, None, f"event {message.event!r}: {exc}")]
        return self.on_object(message, obj)

    def on_object(self, message: Message, obj: Any) -> Out:
        name = message.event
        if not isinstance(obj, dict):
            return [Violation(V.INVALID_EVENT, None, f"event {name!r}: payload is not a JSON object")]
        if not name:  # an InvokeModel body (Framing.JSON): the model's own answer
            return self._inner(obj, whole=True)
        if name.startswith(("exception:", "error:")):
            text = obj.get("message")
            return [ErrorEvent(None, name.partition(":")[2] or None, text if isinstance(text, str) else None)]
        if name != "chunk":
            return []
        raw = obj.get("bytes")
        if not isinstance(raw, str):
            return [Violation(V.INVALID_EVENT, None, "chunk: no base64 bytes")]
        try:
            inner = orjson.loads(base64.b64decode(raw, validate=True))
        except (binascii.Error, ValueError) as exc:
            return [Violation(V.INVALID_EVENT, None, f"chunk: bytes are not base64 JSON ({type(exc).__name__})")]
        if not isinstance(inner, dict):
            return [Violation(V.INVALID_EVENT, None, "chunk: bytes are not a JSON object")]
        return self._inner(inner, whole=False)

    def on_close(self) -> Out:
        out = self._anthropic.on_close()
        if self._generic_stopped and not self._ended:
            self._ended = True
            out.append(StreamEnd(None))
        return out

    def _inner(self, inner: dict[str, Any], *, whole: bool) -> Out:
        out: Out = []
        metrics = inner.get("amazon-bedrock-invocationMetrics")
        if isinstance(inner.get("type"), str):
            events = self._anthropic.on_object(JSONFrame("", 0), inner)
            self._usage_seen |= any(isinstance(e, UsageEvent) for e in events)
            self._ended |= any(isinstance(e, StreamEnd) for e in events)
            if isinstance(metrics, dict) and not self._usage_seen:
                _metrics_usage(metrics, events)
            return events
        self._generic(inner, out, whole)
        if isinstance(metrics, dict) and not self._usage_seen:
            _metrics_usage(metrics, out)
        if whole and not self._ended:
            self._ended = True
            out.append(StreamEnd(None))
        return out

    def _generic(self, inner: dict[str, Any], out: Out, whole: bool) -> None:
        """A non-Anthropic model's event or body: its text, stop reason and token counts."""
        if not self._started:
            self._started = True
            out.append(StreamStart(None, None, None))
        for key in ("outputText", "generation", "completion"):
            if isinstance(inner.get(key), str):
                out.append(ContentDelta(None, 0, inner[key], "text"))
        outputs = inner.get("outputs")
        reason = inner.get("completionReason") or inner.get("stop_reason")
        for item in outputs if isinstance(outputs, list) else ():
            if isinstance(item, dict):
                if isinstance(item.get("text"), str):
                    out.append(ContentDelta(None, 0, item["text"], "text"))
                reason = reason or item.get("stop_reason")
        if isinstance(reason, str) and reason:
            self._generic_stopped = True
            out.append(StopEvent(None, _generic_stop(reason), reason))
        counts = (
            _plain_count(inner, ("inputTextTokenCount", "prompt_token_count")),
            _plain_count(inner, ("totalOutputTextTokenCount", "generation_token_count")),
        )
        if counts != (None, None):
            self._usage_seen = True
            out.append(UsageEvent(None, *counts))


def _plain_count(obj: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _generic_stop(reason: str) -> str:
    """Common providers' stop reasons to canonical names: ``FINISH`` / ``stop`` / ``end_turn``
    (Titan, Llama, Mistral) ``end_turn``; ``LENGTH`` / ``length`` ``max_tokens``;
    ``CONTENT_FILTERED`` ``content_filter``; others as sent."""
    lowered = reason.lower()
    if lowered in ("finish", "stop", "end_turn"):
        return "end_turn"
    if lowered in ("length", "max_tokens"):
        return "max_tokens"
    if lowered in ("content_filtered", "content_filter"):
        return "content_filter"
    return reason


def _metrics_usage(metrics: dict[str, Any], out: Out) -> None:
    read_usage(metrics, METRICS_USAGE, None, out, where="amazon-bedrock-invocationMetrics")
