"""Each record as an OpenTelemetry span, exported over OTLP/HTTP (setting ``otlp_endpoint``; off
by default), for organisations that already run an observability stack.

The span (kind CLIENT, named ``chat <model>``) starts and ends when the exchange did, and carries
the GenAI semantic conventions' attributes (OpenTelemetry semconv "Gen AI client spans"):
``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name`` (the wire dialect's family:
``openai``, ``anthropic``, ``gemini``, ``ollama``, ``vercel``, ``llm-stream-1.0``; an
OpenAI-compatible server is ``openai`` here), ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.response.id`` (the vendor's response id, else its request id, when the stream named
one), ``openai.response.system_fingerprint`` / ``service_tier`` (when sent),
``gen_ai.response.finish_reasons``, ``gen_ai.usage.input_tokens`` / ``output_tokens`` /
``cache_read.input_tokens`` / ``cache_creation.input_tokens`` / ``reasoning.output_tokens``
(only when the vendor reported them: absent is never 0), ``server.address`` / ``server.port``,
``error.type`` for the outcomes ``error`` and ``http_error``; and the observer's own
``observer.record_id``, ``observer.dialect``, ``observer.outcome``, ``observer.violations``.
Prompts and completions (``gen_ai.input.messages``, ``gen_ai.output.messages``, as JSON) only with
``otlp_content = true``: they are the sensitive part (draft §8.1).

Spans are made on a thread of this module's (the proxy's loop only hands the record over:
``submit``, a bounded queue, a record dropped when it is full is counted) and exported by the
SDK's ``BatchSpanProcessor`` (its own thread, its own retries). ``OTEL_EXPORTER_OTLP_HEADERS`` and
the other ``OTEL_EXPORTER_OTLP_*`` variables configure the exporter as usual.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from typing import Any

from observer.records import Exchange, Outcome

log = logging.getLogger("observer.otlp")

QUEUE_MAX = 10000
_STOP = object()


def span_attributes(record: Exchange, content: bool) -> dict[str, Any]:
    """The span's attributes of ``record`` (module docstring); ``content``: with the prompt and
    the answer. Values are OpenTelemetry attribute types (str, int, bool, sequences of them)."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": record.dialect.split(".", 1)[0],
        "server.address": record.host,
        "observer.record_id": record.id,
        "observer.dialect": record.dialect,
        "observer.outcome": record.outcome,
    }
    optional = {
        "server.port": record.port,
        "gen_ai.request.model": record.request.model,
        "gen_ai.response.model": record.model,
        "gen_ai.response.id": record.response_id or record.request_id,
        "openai.response.system_fingerprint": record.system_fingerprint,
        "openai.response.service_tier": record.service_tier,
        "http.response.status_code": record.status_code,
    }
    attrs.update({k: v for k, v in optional.items() if v is not None})
    if record.stop_reason_raw or record.stop_reason:
        attrs["gen_ai.response.finish_reasons"] = [record.stop_reason_raw or record.stop_reason]
    if record.usage.reported:
        if record.usage.input_tokens is not None:
            attrs["gen_ai.usage.input_tokens"] = record.usage.input_tokens
        if record.usage.output_tokens is not None:
            attrs["gen_ai.usage.output_tokens"] = record.usage.output_tokens
        for name, value in (
            ("gen_ai.usage.cache_read.input_tokens", record.usage.cache_read_input_tokens),
            ("gen_ai.usage.cache_creation.input_tokens", record.usage.cache_creation_input_tokens),
            ("gen_ai.usage.reasoning.output_tokens", record.usage.reasoning_output_tokens),
        ):
            if value is not None:
                attrs[name] = value
    if record.outcome in (Outcome.ERROR, Outcome.HTTP_ERROR):
        attrs["error.type"] = (record.error.code if record.error and record.error.code else None) or (
            str(record.status_code) if record.outcome == Outcome.HTTP_ERROR else "error"
        )
    if record.violations:
        attrs["observer.violations"] = sorted({v.kind for v in record.violations})
    if content:
        attrs["gen_ai.input.messages"] = json.dumps(record.request.messages, ensure_ascii=False, default=str)
        output: dict[str, Any] = {"role": "assistant", "text": record.text}
        if record.tool_calls:
            output["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in record.tool_calls]
        attrs["gen_ai.output.messages"] = json.dumps([output], ensure_ascii=False)
    return attrs


class SpanExport:
    """The exporter: ``submit(record)`` from any thread, ``close()`` flushes (up to
    ``timeout_s``). ``exporter``: an SDK ``SpanExporter`` (tests: in-memory); default OTLP/HTTP to
    ``endpoint``."""

    def __init__(
        self, endpoint: str, *, content: bool = False, exporter: Any = None, service: str = "llm-stream-observer"
    ):
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=endpoint)
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("observer")
        self._content = content
        self._queue: queue.Queue = queue.Queue(QUEUE_MAX)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="observer-otlp", daemon=True)
        self._thread.start()

    def submit(self, record: Exchange) -> None:
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        while True:
            record = self._queue.get()
            if record is _STOP:
                return
            try:
                start = int(record.started_at.timestamp() * 1e9)
                end = int((record.ended_at or record.started_at).timestamp() * 1e9)
                name = f"chat {record.request.model or record.model or ''}".strip()
                span = self._tracer.start_span(
                    name, kind=SpanKind.CLIENT, start_time=start, attributes=span_attributes(record, self._content)
                )
                if record.outcome in (Outcome.ERROR, Outcome.HTTP_ERROR):
                    span.set_status(Status(StatusCode.ERROR))
                span.end(end_time=end)
            except Exception:  # noqa: BLE001 - a span must never stop the others
                log.warning("observer: record %s could not become a span", getattr(record, "id", "?"), exc_info=True)

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            log.warning("observer: OTLP: %d records still waiting at shutdown", self._queue.qsize())
        self._thread.join(timeout_s)
        self._provider.force_flush(int(timeout_s * 1000))
        self._provider.shutdown()


__all__ = ["SpanExport", "span_attributes"]
