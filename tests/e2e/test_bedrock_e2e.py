"""The official AWS SDK for Python (boto3 / botocore ``bedrock-runtime``) streaming through
``observer run`` to a local TLS upstream that replays the Bedrock wire fixtures
(``tests/e2e/replay_upstream.py``: one event-stream frame per piece, 50 ms apart).

boto3 is pointed at the upstream with ``endpoint_url`` and at the proxy with
``Config(proxies=...)``, trusting only the proxy's CA (``verify=``); dummy credentials (the
upstream checks no SigV4 signature); the fixture is chosen by an ``x-upstream-case`` header added
on botocore's ``before-sign`` event. Checked: what botocore's own event-stream decoder gave the
application (text, tool use, usage, stop reason, the exception) equals the record the observer
stored, and both equal the fixture's hand-written expectation."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import quote

import pytest

from tests.e2e.replay_upstream import ReplayUpstream, fixture_response
from tests.e2e.servers import NewRecords
from tests.wirefeed import assert_matches

boto3 = pytest.importorskip("boto3")
botocore_config = pytest.importorskip("botocore.config")
botocore_exceptions = pytest.importorskip("botocore.exceptions")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

GAP_MS = 50.0
MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"


@pytest.fixture(scope="module")
def replay() -> Any:
    with ReplayUpstream(default_gap_ms=GAP_MS) as up:
        yield up


def client(replay: ReplayUpstream, proxy: Any, case: str) -> Any:
    """A ``bedrock-runtime`` client through the proxy to the replay upstream, every request
    asking for fixture ``case``."""
    c = boto3.client(
        "bedrock-runtime",
        region_name="eu-central-1",
        endpoint_url=f"https://127.0.0.1:{replay.https_port}",
        aws_access_key_id="AKIAOBSERVERTEST0000",
        aws_secret_access_key="observer-test-secret",
        verify=str(proxy.ca_path),
        config=botocore_config.Config(
            proxies={"https": proxy.proxy_url}, retries={"max_attempts": 1, "mode": "standard"}, read_timeout=30
        ),
    )
    tid = uuid.uuid4().hex[:12]

    def add_headers(request: Any, **_: Any) -> None:
        request.headers["x-upstream-case"] = case
        request.headers["x-test-id"] = tid

    c.meta.events.register("before-sign.bedrock-runtime.*", add_headers)
    return c


def test_converse_stream_with_a_tool_call(replay: ReplayUpstream, recorded: Any) -> None:
    fx = fixture_response("bedrock.converse", "text_and_tool")
    request = json.loads(fx.request)
    new = NewRecords(recorded.api)
    c = client(replay, recorded, fx.id)
    response = c.converse_stream(modelId=MODEL, **request)
    text, tool_input, tool, stop, usage = "", "", {}, None, None
    for event in response["stream"]:
        if "contentBlockDelta" in event:
            delta = event["contentBlockDelta"]["delta"]
            text += delta.get("text", "")
            tool_input += delta.get("toolUse", {}).get("input", "")
        elif "contentBlockStart" in event:
            tool = event["contentBlockStart"]["start"]["toolUse"]
        elif "messageStop" in event:
            stop = event["messageStop"]["stopReason"]
        elif "metadata" in event:
            usage = event["metadata"]["usage"]
    (record,) = new.wait(1)
    # botocore sends the model id URL-encoded (":" as %3A); the record keeps the path as sent, and
    # the model decoded
    assert (
        record["dialect"] == "bedrock.converse" and record["path"] == f"/model/{quote(MODEL, safe='')}/converse-stream"
    )
    assert record["request_model"] == MODEL
    assert (record["text"], record["stop_reason_raw"]) == (text, stop) == ("Hello wörld", "tool_use")
    (call,) = record["tool_calls"]
    assert (call["id"], call["name"], call["arguments"]) == (tool["toolUseId"], tool["name"], tool_input)
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["declared"] is True
    assert (record["usage"]["input_tokens"], record["usage"]["output_tokens"]) == (
        usage["inputTokens"],
        usage["outputTokens"],
    )
    assert record["request"]["messages"] == request["messages"]
    # ConverseStream's events name no id: the response's is AWS's request id, which boto3 reads
    # from the x-amzn-requestid header too (issue 16 item 2).
    assert record["response_id"] == response["ResponseMetadata"]["RequestId"] == fx.response_headers["x-amzn-requestid"]
    assert_matches(record, fx.expected)


def test_an_exception_mid_stream_is_the_records_error(replay: ReplayUpstream, recorded: Any) -> None:
    fx = fixture_response("bedrock.converse", "exception_mid_stream")
    new = NewRecords(recorded.api)
    c = client(replay, recorded, fx.id)
    response = c.converse_stream(modelId=MODEL, **json.loads(fx.request))
    text = ""
    with pytest.raises(botocore_exceptions.EventStreamError) as raised:
        for event in response["stream"]:
            text += event.get("contentBlockDelta", {}).get("delta", {}).get("text", "")
    (record,) = new.wait(1)
    assert raised.value.response["Error"]["Code"] == record["error"]["code"] == "throttlingException"
    assert raised.value.response["Error"]["Message"] == record["error"]["message"]
    assert record["text"] == text == "Hello" and record["outcome"] == "error"
    assert_matches(record, fx.expected)


def test_invoke_model_with_response_stream_of_an_anthropic_model(replay: ReplayUpstream, recorded: Any) -> None:
    fx = fixture_response("bedrock.invoke", "anthropic_stream")
    new = NewRecords(recorded.api)
    c = client(replay, recorded, fx.id)
    response = c.invoke_model_with_response_stream(modelId=MODEL, body=fx.request, contentType="application/json")
    inner = [json.loads(event["chunk"]["bytes"]) for event in response["body"]]
    text = "".join(e["delta"]["text"] for e in inner if e["type"] == "content_block_delta")
    (record,) = new.wait(1)
    assert record["dialect"] == "bedrock.invoke"
    assert record["text"] == text == "Bonjour !"
    assert record["model"] == inner[0]["message"]["model"]
    # The model's own message id wins over AWS's request id (boto3's RequestId, the header's).
    assert record["response_id"] == inner[0]["message"]["id"] != response["ResponseMetadata"]["RequestId"]
    assert response["ResponseMetadata"]["RequestId"] == fx.response_headers["x-amzn-requestid"]
    metrics = inner[-1]["amazon-bedrock-invocationMetrics"]
    assert (record["usage"]["input_tokens"], record["usage"]["output_tokens"]) == (
        metrics["inputTokenCount"],
        metrics["outputTokenCount"],
    )
    assert_matches(record, fx.expected)
