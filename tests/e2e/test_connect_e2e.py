"""Real Connect peers through ``observer run``: the ``connectrpc`` client (pyqwest, HTTP/2 with
TLS, trusting only the proxy's CA) against the toy ``connectrpc`` services of
``tests/e2e/connect_toy`` served by hypercorn on 127.0.0.1 (TLS, h2).

- a Cursor-shaped bidi ``agent.v1.AgentService/Run``: text deltas, a streamed tool call and
  ``turn_ended`` with usage, then heartbeats on a stream left open until the client resets it:
  the record is ``completed`` with what the client received, and in the store at
  ``turn_ended``, while the stream is still open; a second turn on the same stream
  (``conversation_action``) is a record of its own;
- the same ``Run`` reset by the client mid-turn: ``client_aborted`` with the text that arrived;
- a Windsurf-shaped server stream ``exa.api_server_pb.ApiServerService/GetChatMessage`` in
  Connect (ending with END_STREAM) and in gRPC (ending with ``grpc-status`` in the HTTP/2
  trailers), cleanly and with an error; its request's ``api_key`` and ``user_jwt`` (Metadata
  1.3, 1.21) are never stored.

Connect clients compress every envelope with gzip (binary-formats §1.2). The server bounds its own
lifetime (``connect_toy/server.py``); hypercorn runs in its own process group, killed at
teardown."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.e2e.harness import ManagedProcess, free_port, port_open, tool
from tests.e2e.servers import NewRecords

pytest.importorskip("connectrpc")
pyqwest = pytest.importorskip("pyqwest")
pytest.importorskip("hypercorn")

from connectrpc.code import Code  # noqa: E402
from connectrpc.errors import ConnectError  # noqa: E402
from connectrpc.protocol import ProtocolType  # noqa: E402

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


def conversation_action(text: str) -> a.AgentClientMessage:
    action = a.ConversationAction(user_message_action=a.UserMessageAction(user_message=a.UserMessage(text=text)))
    return a.AgentClientMessage(conversation_action=action)


async def bidi(
    server: ToyConnectServer,
    proxy: Any,
    case: str,
    *,
    stop_after_texts: int | None = None,
    followups: tuple[str, ...] = (),
    on_turn_ended: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Runs ``Run`` through the proxy on one stream: after each ``turn_ended``, calls
    ``on_turn_ended(turn index)`` (in a thread, the stream still open) and sends the next of
    ``followups`` as a ``conversation_action``; after the last turn and two heartbeats, or after
    ``stop_after_texts`` text deltas, resets the stream. Returns what the client received, per turn."""
    queue: asyncio.Queue[a.AgentClientMessage | None] = asyncio.Queue()
    pending = list(followups)

    async def requests() -> AsyncIterator[a.AgentClientMessage]:
        yield run_request(case)
        while (message := await asyncio.wait_for(queue.get(), 3 * STEP_S)) is not None:
            yield message  # the upload stays open between turns, as Cursor's does

    def new_turn() -> dict[str, Any]:
        return {"text": "", "args": "", "usage": None, "model": None, "heartbeats": 0}

    turns = [new_turn()]
    client = AgentServiceClient(server.url, http_client=http_client(proxy))
    stream = client.run(requests())
    deadline = time.monotonic() + 4 * STEP_S
    try:
        texts = 0
        while time.monotonic() < deadline:
            got = turns[-1]
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
                if on_turn_ended is not None:
                    await asyncio.to_thread(on_turn_ended, len(turns) - 1)
                if pending:
                    await queue.put(conversation_action(pending.pop(0)))
                    turns.append(new_turn())
            elif u.HasField("heartbeat"):
                got["heartbeats"] += 1
                if got["usage"] is not None and got["heartbeats"] >= 2:
                    break  # the last turn ended and the stream is still open: reset it, as Cursor does
    finally:
        await queue.put(None)
        await stream.aclose()  # type: ignore[attr-defined]
        await client.close()
    return turns


def test_cursor_turn_is_recorded_when_it_ends_while_the_stream_stays_open(
    toy_server: ToyConnectServer, recorded: Any
) -> None:
    """The record is made at ``turn_ended``: it is in the store while the client still holds
    the stream open (the server sends heartbeats); the reset that follows adds no record."""
    new = NewRecords(recorded.api)
    seen: list[dict[str, Any]] = []
    (got,) = asyncio.run(bidi(toy_server, recorded, "turn", on_turn_ended=lambda i: seen.extend(new.wait(1))))
    assert got["text"] == "".join(toy.TURN_TEXT) and got["usage"] == toy.USAGE and got["heartbeats"] >= 2
    (record,) = seen  # found before the reset
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
    assert record["transport_error"] is None  # made before the stream ended
    time.sleep(1.0)
    assert new.wait(0, settle_s=0.5) == [], "the reset after the turn made a record"


def test_cursor_second_turn_on_the_same_stream_is_a_record_of_its_own(
    toy_server: ToyConnectServer, recorded: Any
) -> None:
    """``conversation_action`` on the open stream starts the next turn: each turn's record is
    in the store when its ``turn_ended`` arrives, the second with the follow-up as its last
    request message, starting when the follow-up arrived (after the first ended)."""
    new = NewRecords(recorded.api)
    seen: list[dict[str, Any]] = []
    first, second = asyncio.run(
        bidi(
            toy_server,
            recorded,
            "two-turns",
            followups=("And tomorrow?",),
            on_turn_ended=lambda i: seen.extend(new.wait(1)),
        )
    )
    assert first["text"] == "".join(toy.TURN_TEXT) and second["text"] == "".join(toy.TURN2_TEXT)
    one, two = seen
    assert (one["text"], one["outcome"], one["tool_calls"][0]["id"]) == (first["text"], "completed", "call_1")
    assert (two["text"], two["outcome"], two["tool_calls"]) == (second["text"], "completed", [])
    assert (two["usage"]["input_tokens"], two["usage"]["output_tokens"]) == toy.USAGE2
    assert two["model"] == toy.ROUTED_MODEL and two["stop_reason_raw"] == "turn_ended"
    assert one["request"]["messages"] == [{"role": "user", "content": "Hi toy"}]
    assert two["request"]["messages"] == [
        {"role": "user", "content": "Hi toy"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert one["ended_at"] < two["started_at"] < two["ended_at"] and one["id"] != two["id"]  # starts at its follow-up
    assert one["request"]["metadata"] == two["request"]["metadata"] == {"conversation_id": "two-turns"}
    time.sleep(1.0)
    assert new.wait(0, settle_s=0.5) == [], "the reset after the last turn made a record"


def test_cursor_run_reset_mid_turn(toy_server: ToyConnectServer, recorded: Any) -> None:
    new = NewRecords(recorded.api)
    (got,) = asyncio.run(bidi(toy_server, recorded, "reset-mid-turn", stop_after_texts=2))
    assert got["text"] == "".join(toy.TURN_TEXT[:2])
    (record,) = new.wait(1)
    assert record["dialect"] == "connect.cursor"
    assert record["outcome"] == "client_aborted", record
    assert record["text"] == got["text"]
    assert record["usage"]["reported"] is False and record["stop_reason"] is None
    assert [v["kind"] for v in record["violations"]] == ["missing_stream_end"]


def windsurf_call(
    server: ToyConnectServer, proxy: Any, protocol: ProtocolType, model: str
) -> tuple[list[c.GetChatMessageResponse], BaseException | None]:
    """``GetChatMessage`` through the proxy in ``protocol``: the messages received until the
    stream ended, and the error it ended with (``None`` when it ended cleanly)."""
    request = c.GetChatMessageRequest(
        metadata=c.Metadata(ide_name="windsurf", api_key=API_KEY, user_jwt=USER_JWT),
        chat_messages=[c.ChatMessagePrompt(message_id="m1", source=1, prompt="Weather in Paris?")],
        chat_model_uid=model,
    )

    async def call() -> tuple[list[c.GetChatMessageResponse], BaseException | None]:
        client = ApiServerServiceClient(server.url, http_client=http_client(proxy), protocol=protocol)
        out: list[c.GetChatMessageResponse] = []
        try:
            stream = client.get_chat_message(request)
            deadline = time.monotonic() + 3 * STEP_S
            while time.monotonic() < deadline:
                try:
                    out.append(await asyncio.wait_for(anext(stream), STEP_S))
                except StopAsyncIteration:
                    return out, None
                except ConnectError as exc:
                    return out, exc
            raise AssertionError("the stream did not end")
        finally:
            await client.close()

    return asyncio.run(call())


PROTOCOLS = pytest.mark.parametrize("protocol", [ProtocolType.CONNECT, ProtocolType.GRPC], ids=["connect", "grpc"])


@PROTOCOLS
def test_windsurf_server_stream_ends_with_its_protocols_end(
    protocol: ProtocolType, toy_server: ToyConnectServer, recorded: Any
) -> None:
    """Connect ends the stream with an END_STREAM envelope, gRPC with ``grpc-status: 0`` in the
    HTTP/2 trailers (grpc ``doc/PROTOCOL-HTTP2.md``): either way the record is ``completed``."""
    new = NewRecords(recorded.api)
    messages, error = windsurf_call(toy_server, recorded, protocol, "toy-windsurf-model")
    assert error is None
    (record,) = new.wait(1)
    assert record["dialect"] == "connect.windsurf"
    assert record["outcome"] == "completed", record
    assert [v["kind"] for v in record["violations"]] == ["undeclared_tool"]  # the toy request declares none
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


@PROTOCOLS
def test_windsurf_stream_error_is_recorded_with_its_code_and_message(
    protocol: ProtocolType, toy_server: ToyConnectServer, recorded: Any
) -> None:
    """The server fails the stream after one delta with ``RESOURCE_EXHAUSTED``: Connect sends it
    in the END_STREAM envelope's JSON, gRPC as ``grpc-status: 8`` and a percent-encoded
    ``grpc-message`` in the trailers; the client's error and the record's are the same."""
    new = NewRecords(recorded.api)
    messages, error = windsurf_call(toy_server, recorded, protocol, toy.QUOTA_MODEL)
    assert isinstance(error, ConnectError) and error.code is Code.RESOURCE_EXHAUSTED
    assert error.message == toy.QUOTA_MESSAGE
    (record,) = new.wait(1)
    assert record["outcome"] == "error", record
    assert record["error"] == {"code": "resource_exhausted", "message": toy.QUOTA_MESSAGE}
    assert record["text"] == "".join(m.delta_text for m in messages) == toy.WINDSURF_TEXT[0]
