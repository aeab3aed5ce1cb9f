"""The toy Connect server of ``tests/e2e/test_connect_e2e.py``: an ASGI app with a Cursor-shaped
bidi ``Run`` and a Windsurf-shaped server-streaming ``GetChatMessage``, served by hypercorn
(TLS, h2)::

    hypercorn --certfile C --keyfile K --bind 127.0.0.1:PORT --graceful-timeout 1 \\
        tests.e2e.connect_toy.server:app

Every handler bounds its own lifetime (``LIFETIME_S``): hypercorn does not exit while a bidi
handler is live (binary-formats §10), so a stream the client never resets still ends.

``Run`` by the run request's ``conversation_id``:

- ``"turn"``: routed model, text deltas, a streamed tool call, ``turn_ended`` with usage, then
  heartbeats every ``HEARTBEAT_S`` until the client resets the stream (or the lifetime ends);
- ``"reset-mid-turn"``: two text deltas, then heartbeats only (no ``turn_ended``);
- ``"two-turns"``: the ``"turn"`` turn, then, when the client sends its next
  ``conversation_action`` on the same stream, a second turn (routed model, ``TURN2_TEXT``,
  ``turn_ended`` with ``USAGE2``), then heartbeats as above.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from connectrpc.code import Code
from connectrpc.errors import ConnectError

from tests.e2e.connect_toy import agent_toy_pb2 as a
from tests.e2e.connect_toy import chat_toy_pb2 as c
from tests.e2e.connect_toy.agent_toy_connect import AgentServiceASGIApplication
from tests.e2e.connect_toy.chat_toy_connect import ApiServerServiceASGIApplication

LIFETIME_S = 20.0
HEARTBEAT_S = 0.2
TURN_TEXT = ("Hello", " from", " the toy.")
ARGS = ('{"city":', '"Paris"}')
USAGE = (120, 6)
ROUTED_MODEL = "toy-routed-model"
TURN2_TEXT = ("Rain", " tomorrow.")
USAGE2 = (150, 4)
WINDSURF_TEXT = ("Bonjour", " !")
QUOTA_MODEL = "toy-over-quota"  # GetChatMessage with this model fails after its first delta
QUOTA_MESSAGE = "quota exceeded: 100% used"


def _update(**fields: object) -> a.AgentServerMessage:
    return a.AgentServerMessage(interaction_update=a.InteractionUpdate(**fields))


class Agent:
    async def run(
        self, request: AsyncIterator[a.AgentClientMessage], ctx: object
    ) -> AsyncIterator[a.AgentServerMessage]:
        deadline = time.monotonic() + LIFETIME_S
        first = await asyncio.wait_for(anext(request), LIFETIME_S)
        case = first.run_request.conversation_id
        if case == "reset-mid-turn":
            for text in TURN_TEXT[:2]:
                yield _update(text_delta=a.TextDelta(text=text))
        else:
            yield _update(routed_model=a.RoutedModel(display_name=ROUTED_MODEL))
            for text in TURN_TEXT:
                yield _update(text_delta=a.TextDelta(text=text))
            for part in ARGS:
                yield _update(partial_tool_call=a.PartialToolCall(call_id="call_1", args_text_delta=part))
            yield _update(tool_call_started=a.ToolCallStarted(call_id="call_1"))
            yield _update(turn_ended=a.TurnEnded(input_tokens=USAGE[0], output_tokens=USAGE[1]))
        if case == "two-turns":
            await asyncio.wait_for(anext(request), LIFETIME_S)  # the client's next turn
            yield _update(routed_model=a.RoutedModel(display_name=ROUTED_MODEL))
            for text in TURN2_TEXT:
                yield _update(text_delta=a.TextDelta(text=text))
            yield _update(turn_ended=a.TurnEnded(input_tokens=USAGE2[0], output_tokens=USAGE2[1]))
        while time.monotonic() < deadline:  # the stream stays open, as Cursor's does
            await asyncio.sleep(HEARTBEAT_S)
            yield _update(heartbeat=a.Heartbeat())


class Chat:
    async def get_chat_message(
        self, request: c.GetChatMessageRequest, ctx: object
    ) -> AsyncIterator[c.GetChatMessageResponse]:
        yield c.GetChatMessageResponse(message_id="msg_1", delta_text=WINDSURF_TEXT[0])
        if request.chat_model_uid == QUOTA_MODEL:  # the error ends the stream (Connect: END_STREAM; gRPC: trailers)
            raise ConnectError(Code.RESOURCE_EXHAUSTED, QUOTA_MESSAGE)
        await asyncio.sleep(0.05)
        yield c.GetChatMessageResponse(delta_text=WINDSURF_TEXT[1])
        yield c.GetChatMessageResponse(
            tool_call=c.ToolCall(id="call_1", name="get_weather", arguments_json='{"city":"Paris"}')
        )
        yield c.GetChatMessageResponse(stop_reason=10, usage=c.ModelUsageStats(input_tokens=12, output_tokens=7))


_agent = AgentServiceASGIApplication(Agent())
_chat = ApiServerServiceASGIApplication(Chat())


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    """Routes by path prefix to the two Connect applications."""
    if scope["type"] == "http" and scope["path"].startswith(_chat.path):
        return await _chat(scope, receive, send)
    return await _agent(scope, receive, send)
