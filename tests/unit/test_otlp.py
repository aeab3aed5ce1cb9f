"""OTLP export (issue 14 item 7): records through the addon become spans that a local OTLP/HTTP
receiver gets, with the gen_ai.* attributes written here by hand from the record (OpenTelemetry
semconv "Gen AI client spans"); content only when asked for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mitmproxy.test import taddons
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from observer.capture.hooks import LLMAudit
from tests.unit.test_addon import REQUEST, Sink, llm_flow, run_stream

BODY = (Path(__file__).parent.parent / "fixtures" / "wire" / "llm-stream-1.0" / "complete_example.sse").read_bytes()


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[bytes]]]:
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            bodies.append(self.rfile.read(int(self.headers["content-length"])))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", bodies
    finally:
        server.shutdown()


def spans(bodies: list[bytes]) -> list:
    out = []
    for body in bodies:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        for rs in req.resource_spans:
            service = {a.key: a.value.string_value for a in rs.resource.attributes}["service.name"]
            for ss in rs.scope_spans:
                out.extend((service, s) for s in ss.spans)
    return out


def attrs(span) -> dict:
    out = {}
    for a in span.attributes:
        v = a.value
        kind = v.WhichOneof("value")
        out[a.key] = [x.string_value for x in v.array_value.values] if kind == "array_value" else getattr(v, kind)
    return out


@pytest.mark.parametrize("content", [False, True])
def test_records_reach_an_otlp_receiver_as_gen_ai_spans(receiver, content):
    endpoint, bodies = receiver
    addon = LLMAudit(sink=Sink(), worker=False)
    with taddons.context(addon) as tctx:
        tctx.configure(addon, observer_otlp_endpoint=endpoint, observer_otlp_content=content)
        addon.running()
        f = llm_flow()
        run_stream(addon, f, [BODY])
        addon.response(f)
        addon.done()  # flushes the exporter
    ((service, span),) = spans(bodies)
    assert service == "llm-stream-observer"
    assert span.name == "chat example-model"  # the request's model (complete_example.request.json)
    assert span.kind == 3  # SPAN_KIND_CLIENT
    got = attrs(span)
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llm-stream-1",
        "gen_ai.request.model": "example-model",
        "gen_ai.response.model": "example-model",
        "gen_ai.response.id": "550e8400-e29b-41d4-a716-446655440000",
        "gen_ai.response.finish_reasons": ["end_turn"],
        "gen_ai.usage.input_tokens": 42,
        "gen_ai.usage.output_tokens": 8,
        "server.address": "llm.example",
        "server.port": 22,
        "http.response.status_code": 200,
        "observer.dialect": "llm-stream-1.0",
        "observer.outcome": "completed",
    }
    assert {k: got[k] for k in expected} == expected
    assert "error.type" not in got and "observer.violations" not in got
    if content:
        assert '"What is shown in this image?"' in got["gen_ai.input.messages"]
        assert "iVBORw0KGgo" not in got["gen_ai.input.messages"]  # (the record keeps binary parts' sizes only)
        assert (
            got["gen_ai.output.messages"]
            == '[{"role": "assistant", "text": "The weather in Vienna is 24C and sunny."}]'
        )
    else:
        assert "gen_ai.input.messages" not in got and "gen_ai.output.messages" not in got
    assert (span.end_time_unix_nano - span.start_time_unix_nano) >= 0
    assert REQUEST  # (the request of the fixture: tests.unit.test_addon)
