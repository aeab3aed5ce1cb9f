"""Real Connect peers through ``observer run``: the ``connectrpc`` client (pyqwest, HTTP/2 with
TLS, trusting only the proxy's CA) against the toy ``connectrpc`` services of
``tests/e2e/connect_toy`` served by hypercorn on 127.0.0.1 (TLS, h2).

- a Cursor-shaped bidi ``agent.v1.AgentService/Run``: text deltas, a streamed tool call and
  ``turn_ended`` with usage, then heartbeats on a stream left open until the client resets it:
  the record is ``completed`` (the turn ended) with what the client received;
- the same ``Run`` reset by the client mid-turn: ``client_aborted`` with the text that arrived;
- a Windsurf-shaped server stream ``exa.api_server_pb.ApiServerService/GetChatMessage`` ending
  with END_STREAM; its request's ``api_key`` and ``user_jwt`` (Metadata 1.3, 1.21) are never
  stored.

Connect clients compress every envelope with gzip (binary-formats §1.2). The server bounds its own
lifetime (``connect_toy/server.py``); hypercorn runs in its own process group, killed at
teardown."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.e2e.harness import ManagedProcess, free_port, port_open, tool
from tests.e2e.servers import NewRecords

pytest.importorskip("connectrpc")
pyqwest = pytest.importorskip("pyqwest")
pytest.importorskip("hypercorn")

from tests.e2e.connect_toy import agent_toy_pb2 as a  # noqa: E402
from tests.e2e.connect_toy import chat_toy_pb2 as c  # noqa: E402
from tests.e2e.connect_toy import server as toy  # noqa: E402
from tests.e2e.connect_toy.agent_toy_connect import AgentServiceClient  # noqa: E402
from tests.e2e.connect_toy.chat_toy_connect import ApiServerServiceClient  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

API_KEY = "sk-ws-01-E2ESECRETAPIKEYabcdef0123456789"
USER_JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJlMmUtdXNlciJ9.ZTJlLXNpZ25hdHVyZS12YWx1ZQ"
STEP_S = 10.0  # bound of every wait on the stream


class ToyConnectServer(ManagedProcess):
    """hypercorn serving ``connect_toy.server:app`` with TLS (h2 and h1) on a free port."""

    name = "hypercorn"

    def __init__(self) -> None:
        super().__init__()
        from tests.e2e.upstream import make_certs

        self.port = free_port()
        self._certs = tempfile.TemporaryDirectory(prefix="e2e-connect-certs-")
        _, self.cert, self.key = make_certs(self._certs.name)

    def build_argv(self) -> list[str]:
        return [
            tool("hypercorn"),
            "--certfile",
            self.cert,
            "--keyfile",
            self.key,
            "--bind",
            f"127.0.0.1:{self.port}",
            "--graceful-timeout",
            "1",
            "tests.e2e.connect_toy.server:app",
        ]

    def ready(self) -> bool:
        return port_open(self.port)

    def stop(self, timeout: float = 3.0) -> int | None:
        return super().stop(timeout)

    def cleanup(self) -> None:
        super().cleanup()
        self._certs.cleanup()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def toy_server() -> Iterator[ToyConnectServer]:
    with ToyConnectServer() as server:
        yield server  # type: ignore[misc]


def http_client(proxy: Any) -> Any:
    """A pyqwest client speaking HTTP/2 through the proxy, trusting only its CA."""
    with open(proxy.ca_path, "rb") as f:
        ca = f.read()
    transport = pyqwest.HTTPTransport(tls_ca_cert=ca, http_version=pyqwest.HTTPVersion.HTTP2, proxy=proxy.proxy_url)
    return pyqwest.Client(transport)


def run_request(case: str) -> a.AgentClientMessage:
    action = a.ConversationAction(user_message_action=a.UserMessageAction(user_message=a.UserMessage(text="Hi toy")))
    return a.AgentClientMessage(
        run_request=a.AgentRunRequest(
            action=action, model_details=a.ModelDetails(model_id="toy-model"), conversation_id=case
        )
    )


async def bidi_turn(server: ToyConnectServer, proxy: Any, case: str, stop_after_texts: int | None) -> dict[str, Any]:
    """Runs ``Run`` through the proxy and resets the stream: after ``turn_ended`` and two
    heartbeats, or after ``stop_after_texts`` text deltas. Returns what the client received."""
    done = asyncio.Event()

    async def requests() -> AsyncIterator[a.AgentClientMessage]:
        yield run_request(case)
        await asyncio.wait_for(done.wait(), 3 * STEP_S)  # the upload stays open, as Cursor's does

    got: dict[str, Any] = {"text": "", "args": "", "usage": None, "model": None, "heartbeats": 0}
    client = AgentServiceClient(server.url, http_client=http_client(proxy))
    stream = client.run(requests())
    deadline = time.monotonic() + 3 * STEP_S
    try:
        texts = 0
        while time.monotonic() < deadline:
            message = await asyncio.wait_for(anext(stream), STEP_S)
            u = message.interaction_update
            if u.HasField("text_delta"):
                got["text"] += u.text_delta.text
                texts += 1
                if stop_after_texts is not None and texts >= stop_after_texts:
                    break
            elif u.HasField("partial_tool_call"):
                got["args"] += u.partial_tool_call.args_text_delta
            elif u.HasField("routed_model"):
                got["model"] = u.routed_model.display_name
            elif u.HasField("turn_ended"):
                got["usage"] = (u.turn_ended.input_tokens, u.turn_ended.output_tokens)
            elif u.HasField("heartbeat"):
                got["heartbeats"] += 1
                if got["usage"] is not None and got["heartbeats"] >= 2:
                    break  # the turn ended and the stream is still open: reset it, as Cursor does
    finally:
        done.set()
        await stream.aclose()  # type: ignore[attr-defined]
        await client.close()
    return got


def test_cursor_run_left_open_after_turn_ended_then_reset(toy_server: ToyConnectServer, recorded: Any) -> None:
    new = NewRecords(recorded.api)
    got = asyncio.run(bidi_turn(toy_server, recorded, "turn", None))
    assert got["text"] == "".join(toy.TURN_TEXT) and got["usage"] == toy.USAGE and got["heartbeats"] >= 2
    (record,) = new.wait(1)
    assert record["dialect"] == "connect.cursor" and record["path"] == "/agent.v1.AgentService/Run"
    assert record["http_version"] == "HTTP/2.0"
    assert record["outcome"] == "completed", record
    assert record["text"] == got["text"]
    assert record["model"] == got["model"] == toy.ROUTED_MODEL
    assert (record["usage"]["input_tokens"], record["usage"]["output_tokens"]) == got["usage"]
    assert record["usage"]["reported"] is True
    assert (record["stop_reason"], record["stop_reason_raw"]) == ("end_turn", "turn_ended")
    (call,) = record["tool_calls"]
    assert (call["id"], call["arguments"]) == ("call_1", got["args"]) and json.loads(call["arguments"]) == {
        "city": "Paris"
    }
    assert record["request"]["model"] == "toy-model"
    assert record["request"]["messages"] == [{"role": "user", "content": "Hi toy"}]
    assert record["request"]["metadata"] == {"conversation_id": "turn"}
    assert "cancel" in (record["transport_error"] or "").lower(), record["transport_error"]


def test_cursor_run_reset_mid_turn(toy_server: ToyConnectServer, recorded: Any) -> None:
    new = NewRecords(recorded.api)
    got = asyncio.run(bidi_turn(toy_server, recorded, "reset-mid-turn", 2))
    assert got["text"] == "".join(toy.TURN_TEXT[:2])
    (record,) = new.wait(1)
    assert record["dialect"] == "connect.cursor"
    assert record["outcome"] == "client_aborted", record
    assert record["text"] == got["text"]
    assert record["usage"]["reported"] is False and record["stop_reason"] is None
    assert [v["kind"] for v in record["violations"]] == ["missing_stream_end"]


def test_windsurf_server_stream_ends_with_end_stream(toy_server: ToyConnectServer, recorded: Any) -> None:
    new = NewRecords(recorded.api)
    request = c.GetChatMessageRequest(
        metadata=c.Metadata(ide_name="windsurf", api_key=API_KEY, user_jwt=USER_JWT),
        chat_messages=[c.ChatMessagePrompt(message_id="m1", source=1, prompt="Weather in Paris?")],
        chat_model_uid="toy-windsurf-model",
    )

    async def call() -> list[c.GetChatMessageResponse]:
        client = ApiServerServiceClient(toy_server.url, http_client=http_client(recorded))
        try:
            out = []
            stream = client.get_chat_message(request)
            deadline = time.monotonic() + 3 * STEP_S
            while time.monotonic() < deadline:
                try:
                    out.append(await asyncio.wait_for(anext(stream), STEP_S))
                except StopAsyncIteration:
                    return out
            raise AssertionError("the stream did not end")
        finally:
            await client.close()

    messages = asyncio.run(call())
    (record,) = new.wait(1)
    assert record["dialect"] == "connect.windsurf"
    assert record["outcome"] == "completed", record
    assert record["text"] == "".join(m.delta_text for m in messages) == "".join(toy.WINDSURF_TEXT)
    (call_,) = record["tool_calls"]
    assert (call_["id"], call_["name"], call_["arguments"]) == ("call_1", "get_weather", '{"city":"Paris"}')
    assert (record["usage"]["input_tokens"], record["usage"]["output_tokens"]) == (12, 7)
    assert (record["stop_reason"], record["stop_reason_raw"]) == ("tool_use", "10")
    assert record["request"]["model"] == "toy-windsurf-model"
    assert record["request"]["messages"] == [{"role": "user", "content": "Weather in Paris?"}]
    assert record["request"]["metadata"] == {"ide_name": "windsurf"}
    stored = json.dumps(recorded.api.detail(record["id"]))
    assert API_KEY not in stored and USER_JWT not in stored
