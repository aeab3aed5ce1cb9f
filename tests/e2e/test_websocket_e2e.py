"""Issue 15 item 2, WebSocket observation, through a real ``observer run``: real SignalR clients
streaming ``chat`` from a local fake ChatHub (``tests/e2e/chathub.py``: aiohttp, negotiate +
WebSocket at ``/sydney/ChatHub``, JSON and MessagePack, permessage-deflate) through the proxy,
trusting only the proxy's CA; each turn gives one ``signalr.copilot`` record, found through the API.

- **pysignalr** (pinned in ``requirements-clients.lock``), in this process: its WebSocket
  (``websockets``) follows ``HTTPS_PROXY`` / ``HTTP_PROXY``, set for the test; its negotiate POST
  (aiohttp, ``trust_env`` off) does not and goes to the hub directly, so its TLS context trusts
  the hub's CA too (the proxy's CA for the socket). Checked: the record's text equals what the
  client received (the final StreamItem's bot message and the last ``update``), the request
  messages are the prompt, outcome ``completed``, one record per turn (two turns on one socket:
  two records), over JSON and MessagePack, ``wss`` and ``ws``; a Completion with an error and a
  ``result.value`` that is not ``Success`` give ``error`` records; a socket the server drops
  mid-turn gives a ``truncated`` record, one the client closes mid-turn a ``client_aborted`` one,
  each with the text that arrived; an ``access_token`` in the socket's URL is not stored.
- **The official @microsoft/signalr** Node client (``tests/node/signalr_chat.mjs``, pinned in
  ``tests/node/package.json``), JSON and ``@microsoft/signalr-protocol-msgpack``: signalr's own
  Node transports take no proxy, so the script passes the client's ``httpClient`` and
  ``WebSocket`` options (undici's fetch and WebSocket with a ``ProxyAgent``) and trusts the
  proxy's CA through ``NODE_EXTRA_CA_CERTS``; negotiate and socket both go through the proxy.
- A ChatHub on a host that is not an LLM host is tunnelled: the client (trusting only the hub's
  own CA) completes its turn, and nothing is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from tests.e2e.harness import REPO, ObserverProcess, observer_cli_available
from tests.e2e.servers import NewRecords

pytest.importorskip("aiohttp")
pysignalr_client = pytest.importorskip("pysignalr.client")
from pysignalr.protocol.json import JSONProtocol  # noqa: E402
from pysignalr.protocol.messagepack import MessagepackProtocol  # noqa: E402

from tests.e2e.chathub import ChatHubServer, ServerTurn, answer_for, cumulative  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

DIALECT = "signalr.copilot"
TONE = "Creative"
NODE_DIR = REPO / "tests" / "node"
TURN_TIMEOUT = 15.0


@pytest.fixture(scope="module")
def hub() -> Iterator[ChatHubServer]:
    with ChatHubServer(gap_s=0.03, slow_s=10.0) as h:
        yield h


@pytest.fixture
def via_proxy(recorded: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``recorded`` (the module's ``observer run``), with this process's proxy variables set to it
    (pysignalr's socket follows them)."""
    set_proxy_env(monkeypatch, recorded.proxy_url)
    return recorded


def set_proxy_env(monkeypatch: pytest.MonkeyPatch, proxy_url: str) -> None:
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        monkeypatch.setenv(k, proxy_url)
    for k in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)


def trusting(*ca_paths: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_paths[0])
    for p in ca_paths[1:]:
        ctx.load_verify_locations(cafile=p)
    return ctx


def chat_argument(prompt: str) -> dict[str, Any]:
    """``arguments[0]`` of a Sydney ``chat`` invocation (binary-formats.md §3.1), trimmed."""
    return {
        "source": "cib",
        "optionsSets": ["nlu_direct_response_filter", "deepleo"],
        "isStartOfSession": True,
        "tone": TONE,
        "message": {"author": "user", "inputMethod": "Keyboard", "text": prompt, "messageType": "Chat"},
        "conversationId": "conv-e2e",
    }


def unique(prompt: str) -> str:
    return f"{prompt} #{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------------------------
# pysignalr


@dataclass
class ClientTurn:
    """What the client application got for one ``chat``."""

    prompt: str
    updates: list[str] = field(default_factory=list)  # bot texts of the ``update`` invocations
    deltas: list[str] = field(default_factory=list)  # their ``writeAtCursor`` (M365), if any
    items: list[Any] = field(default_factory=list)  # StreamItems
    error: str | None = None
    completed: bool = False

    @property
    def final_text(self) -> str | None:
        """The bot message of the last StreamItem (what EdgeGPT / sydney.py show)."""
        for item in reversed(self.items):
            msgs = (item or {}).get("messages") or []
            if msgs and msgs[-1].get("author") == "bot":
                return msgs[-1]["text"]
        return None


async def pysignalr_session(
    url: str,
    protocol: str,
    ssl_ctx: ssl.SSLContext | None,
    prompts: list[str],
    stop_after_updates: int = 0,
    until_server_ends: ChatHubServer | None = None,
) -> list[ClientTurn]:
    """One pysignalr connection: ``chat`` for each prompt in turn (waiting for its Completion).
    ``stop_after_updates``: once the (last) turn has that many bot updates, stop the client
    (cancelling ``run()`` closes the socket, close code 1011). ``until_server_ends``: the turn is
    not waited for; once the hub has ended it (e.g. dropped the socket) the client is stopped."""
    proto = JSONProtocol() if protocol == "json" else MessagepackProtocol()
    client = pysignalr_client.SignalRClient(url, protocol=proto, ssl=ssl_ctx, retry_count=1, connection_timeout=10)
    turns: list[ClientTurn] = []
    opened = asyncio.Event()
    progress = asyncio.Event()

    async def on_open() -> None:
        opened.set()

    async def on_update(args: list[Any]) -> None:
        msgs = (args[0] or {}).get("messages") or []
        if turns and msgs and msgs[-1].get("author") == "bot" and not msgs[-1].get("messageType"):
            turns[-1].updates.append(msgs[-1]["text"])
            if "writeAtCursor" in args[0]:
                turns[-1].deltas.append(args[0]["writeAtCursor"])
            progress.set()

    client.on_open(on_open)
    client.on("update", on_update)
    task = asyncio.ensure_future(client.run())
    try:
        await asyncio.wait_for(opened.wait(), 10)
        for prompt in prompts:
            turn = ClientTurn(prompt)
            turns.append(turn)
            done = asyncio.Event()

            async def on_next(item: Any, turn: ClientTurn = turn) -> None:
                turn.items.append(item)

            async def on_complete(_: Any, turn: ClientTurn = turn, done: asyncio.Event = done) -> None:
                turn.completed = True
                done.set()

            async def on_error(message: Any, turn: ClientTurn = turn, done: asyncio.Event = done) -> None:
                turn.error = str(getattr(message, "error", message))
                done.set()

            await client.stream("chat", [chat_argument(prompt)], on_next, on_complete, on_error)
            if stop_after_updates:
                while len(turn.updates) < stop_after_updates:
                    progress.clear()
                    await asyncio.wait_for(progress.wait(), TURN_TIMEOUT)
                break
            if until_server_ends is not None:
                await asyncio.to_thread(until_server_ends.turn, prompt, TURN_TIMEOUT)
                await asyncio.sleep(0.2)  # the last messages reach the client
                break
            await asyncio.wait_for(done.wait(), TURN_TIMEOUT)
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 10)
    return turns


def run_pysignalr(*args: Any, **kwargs: Any) -> list[ClientTurn]:
    return asyncio.run(asyncio.wait_for(pysignalr_session(*args, **kwargs), 60))


def signalr_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["dialect"] == DIALECT]


def record_of(records: list[dict[str, Any]], prompt: str) -> dict[str, Any]:
    found = [r for r in records if (r.get("request") or {}).get("messages") == [{"role": "user", "content": prompt}]]
    assert len(found) == 1, f"expected one record of {prompt!r}, got {len(found)}: {summary(records)}"
    return found[0]


def summary(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["dialect"], r["path"], r["outcome"], r.get("text")) for r in records]


def assert_completed_turn(rec: dict[str, Any], turn: ClientTurn, server: ServerTurn) -> None:
    # what the client received is what the hub sent, and what the observer recorded
    assert turn.completed and turn.error is None
    assert turn.final_text == turn.updates[-1] == server.final_text == answer_for(server.prompt)
    assert turn.updates == server.updates == cumulative(answer_for(server.prompt))
    assert rec["dialect"] == DIALECT and rec["status_code"] == 101 and rec["method"] == "GET"
    assert rec["text"] == turn.final_text, summary([rec])
    assert rec["outcome"] == "completed" and rec["error"] is None
    assert rec["request"]["messages"] == [{"role": "user", "content": turn.prompt}]
    assert rec["request_model"] == TONE
    assert rec["path"].split("?")[0] == server.path_qs.split("?")[0]


@pytest.mark.parametrize(
    ("protocol", "tls"), [("json", True), ("messagepack", True), ("json", False), ("messagepack", False)]
)
def test_pysignalr_two_turns_on_one_socket_give_two_records(
    hub: ChatHubServer, via_proxy: Any, protocol: str, tls: bool
) -> None:
    prompts = [unique("Wie ist das Wetter in Wien?"), unique("Und morgen?")]
    new = NewRecords(via_proxy.api)
    ctx = trusting(via_proxy.ca_path, hub.ca_path) if tls else None
    turns = run_pysignalr(hub.url(tls=tls), protocol, ctx, prompts)
    assert [t.prompt for t in turns] == prompts
    records = new.wait(2)
    recs = signalr_records(records)
    assert len(recs) == len(records) == 2, summary(records)
    servers = [hub.turn(p) for p in prompts]
    assert servers[0].connection == servers[1].connection and {s.protocol for s in servers} == {protocol}
    for turn, server in zip(turns, servers, strict=True):
        assert_completed_turn(record_of(recs, turn.prompt), turn, server)
    assert recs[0]["scheme"] == ("https" if tls else "http")


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
@pytest.mark.parametrize("mode", ["error", "throttled"])
def test_a_failed_turn_is_an_error_record(hub: ChatHubServer, via_proxy: Any, protocol: str, mode: str) -> None:
    """``error``: a Completion with ``error`` after two updates (the client's stream errors);
    ``throttled``: a StreamItem whose ``result.value`` is ``Throttled``, then a void Completion."""
    prompt = unique(f"{mode} please")
    new = NewRecords(via_proxy.api)
    (turn,) = run_pysignalr(hub.url(tls=True), protocol, trusting(via_proxy.ca_path, hub.ca_path), [prompt])
    server = hub.turn(prompt)
    assert server.ended == mode and server.updates == cumulative(answer_for(prompt))[:2]
    if mode == "error":
        assert turn.error == "An unexpected error occurred (E-HUB-1)." and not turn.items
    else:
        assert turn.completed and turn.items[-1]["result"]["value"] == "Throttled"
    (rec,) = new.wait(1)
    assert rec["dialect"] == DIALECT and rec["outcome"] == "error", summary([rec])
    assert rec["text"] == turn.updates[-1] == server.updates[-1]
    assert rec["request"]["messages"] == [{"role": "user", "content": prompt}]
    assert rec["error"], rec


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_a_socket_the_server_drops_mid_turn_gives_a_truncated_record(
    hub: ChatHubServer, via_proxy: Any, protocol: str
) -> None:
    prompt = unique("drop it")
    new = NewRecords(via_proxy.api)
    (turn,) = run_pysignalr(
        hub.url(tls=True), protocol, trusting(via_proxy.ca_path, hub.ca_path), [prompt], until_server_ends=hub
    )
    server = hub.turn(prompt)
    assert server.ended == "dropped" and not turn.completed and turn.error is None
    assert turn.updates == server.updates == cumulative(answer_for(prompt))[:2]
    # pysignalr reconnects after the drop (a socket without a turn: no record)
    recs = new.wait(1)
    assert len(recs) == 1, summary(recs)
    (rec,) = recs
    assert rec["dialect"] == DIALECT and rec["outcome"] == "truncated", summary([rec])
    assert rec["text"] == turn.updates[-1]
    assert rec["request"]["messages"] == [{"role": "user", "content": prompt}]


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_a_hub_close_message_with_an_error_mid_turn_gives_an_error_record(
    hub: ChatHubServer, via_proxy: Any, protocol: str
) -> None:
    """The server sends a Close (type 7) with ``error`` after two updates and closes the socket."""
    prompt = unique("close with an error")
    new = NewRecords(via_proxy.api)
    (turn,) = run_pysignalr(
        hub.url(tls=True), protocol, trusting(via_proxy.ca_path, hub.ca_path), [prompt], until_server_ends=hub
    )
    server = hub.turn(prompt)
    assert server.ended == "close_error" and not turn.completed
    assert turn.updates == server.updates == cumulative(answer_for(prompt))[:2]
    recs = new.wait(1)
    assert len(recs) == 1, summary(recs)
    (rec,) = recs
    assert rec["dialect"] == DIALECT and rec["outcome"] == "error", summary([rec])
    assert rec["text"] == turn.updates[-1]
    assert rec["request"]["messages"] == [{"role": "user", "content": prompt}]
    assert "E-HUB-CLOSE" in json.dumps(rec["error"]), rec["error"]


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_a_socket_the_client_closes_mid_turn_gives_a_client_aborted_record(
    hub: ChatHubServer, via_proxy: Any, protocol: str
) -> None:
    prompt = unique("slow answer")
    new = NewRecords(via_proxy.api)
    (turn,) = run_pysignalr(
        hub.url(tls=True), protocol, trusting(via_proxy.ca_path, hub.ca_path), [prompt], stop_after_updates=2
    )
    server = hub.turn(prompt)
    assert server.ended in ("closed", "cancelled") and not turn.completed
    assert turn.updates == server.updates == cumulative(answer_for(prompt))[:2]
    (rec,) = new.wait(1)
    assert rec["dialect"] == DIALECT and rec["outcome"] == "client_aborted", summary([rec])
    assert rec["text"] == turn.updates[-1]
    assert rec["request"]["messages"] == [{"role": "user", "content": prompt}]


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_pysignalr_on_the_m365_hub_path_records_the_write_at_cursor_deltas(
    hub: ChatHubServer, via_proxy: Any, protocol: str
) -> None:
    """M365 Copilot's hub (``/m365Copilot/Chathub/{oid}@{tid}``, "chathub" in another case):
    the answer is the concatenated ``writeAtCursor`` deltas."""
    prompts = [unique("Fasse meine Mails zusammen"), unique("Und die Termine?")]
    new = NewRecords(via_proxy.api)
    turns = run_pysignalr(hub.url(tls=True, m365=True), protocol, trusting(via_proxy.ca_path, hub.ca_path), prompts)
    records = new.wait(2)
    recs = signalr_records(records)
    assert len(recs) == len(records) == 2, summary(records)
    for turn in turns:
        server = hub.turn(turn.prompt)
        assert server.mode == "m365" and server.path_qs.startswith("/m365Copilot/Chathub/0f9e-oid@72f9-tid?id=")
        assert "".join(turn.deltas) == turn.final_text and len(turn.deltas) == len(turn.updates) > 1
        rec = record_of(recs, turn.prompt)
        assert_completed_turn(rec, turn, server)
        assert rec["path"].split("?")[0] == "/m365Copilot/Chathub/0f9e-oid@72f9-tid"


def test_an_access_token_in_the_socket_url_is_not_stored(hub: ChatHubServer, via_proxy: Any) -> None:
    secret = "eyJ0eXAiOiJKV1Qi." + uuid.uuid4().hex
    prompt = unique("token")
    new = NewRecords(via_proxy.api)
    (turn,) = run_pysignalr(
        hub.url(tls=True, query=f"access_token={secret}&variants=a"),
        "json",
        trusting(via_proxy.ca_path, hub.ca_path),
        [prompt],
    )
    assert turn.completed
    server = hub.turn(prompt)
    assert secret in server.path_qs  # it was on the wire (the socket's request line)
    (rec,) = new.wait(1)
    assert rec["dialect"] == DIALECT and rec["text"] == turn.final_text
    assert rec["path"].startswith("/sydney/ChatHub?") and "access_token=" in rec["path"]
    assert secret not in json.dumps(rec, ensure_ascii=False)
    assert secret not in json.dumps(via_proxy.api.list(limit=50), ensure_ascii=False)


def test_a_chathub_on_a_host_off_the_list_is_tunnelled_and_not_recorded(
    hub: ChatHubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 127.0.0.1 not an LLM host, the proxy tunnels the socket: pysignalr, trusting only the
    hub's own CA, completes its turn, and the observer stores nothing."""
    ok, why = observer_cli_available()
    if not ok:
        pytest.skip(f"observer CLI not available: {why}")
    prompt = unique("not an llm host")
    with ObserverProcess(sets={"observer_llm_hosts_extra": ""}) as obs:
        set_proxy_env(monkeypatch, obs.proxy_url)
        (turn,) = run_pysignalr(hub.url(tls=True), "json", trusting(hub.ca_path), [prompt])
        assert turn.completed and turn.final_text == answer_for(prompt)
        assert hub.turn(prompt).ended == "completed"
        api = obs.api()
        try:
            assert api.all_items() == []
        finally:
            api.close()


# --------------------------------------------------------------------------------------------
# the official @microsoft/signalr Node client


def node_client_available() -> tuple[bool, str]:
    if shutil.which("node") is None:
        return False, "node is not installed"
    for pkg in ("@microsoft/signalr", "@microsoft/signalr-protocol-msgpack", "undici"):
        if not (NODE_DIR / "node_modules" / pkg / "package.json").exists():
            return False, f"{pkg} not installed in tests/node (`make install`: npm ci)"
    return True, ""


def run_node(proxy: Any, config: dict[str, Any], timeout: float = 30.0) -> list[dict[str, Any]]:
    ok, why = node_client_available()
    if not ok:
        pytest.skip(why)
    env = dict(os.environ, NODE_EXTRA_CA_CERTS=proxy.ca_path)
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NODE_OPTIONS"):
        env.pop(k, None)  # the script's own ProxyAgent, nothing implicit
    cfg = {"proxy": proxy.proxy_url, "tone": TONE, "timeoutMs": int(timeout * 1000) - 2000, **config}
    p = subprocess.run(
        ["node", str(NODE_DIR / "signalr_chat.mjs"), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(NODE_DIR),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.strip()]
    assert p.returncode == 0 and not any("error" in x and "prompt" not in x for x in lines), (
        f"node exited {p.returncode}\nstdout: {p.stdout[-3000:]}\nstderr: {p.stderr[-3000:]}"
    )
    return lines


def js_final_text(turn: dict[str, Any]) -> str | None:
    msgs = ((turn.get("item") or {}).get("messages")) or []
    return msgs[-1]["text"] if msgs and msgs[-1].get("author") == "bot" else None


@pytest.mark.parametrize(("protocol", "tls"), [("json", True), ("messagepack", True), ("messagepack", False)])
def test_the_official_js_client_two_turns_give_two_records(
    hub: ChatHubServer, recorded: Any, protocol: str, tls: bool
) -> None:
    prompts = [unique("Wie ist das Wetter in Wien?"), unique("Und übermorgen?")]
    new = NewRecords(recorded.api)
    negotiated = len(hub.negotiations)
    out = run_node(recorded, {"url": hub.url(tls=tls, ws=False), "protocol": protocol, "prompts": prompts})
    assert [t["prompt"] for t in out[:2]] == prompts and out[2] == {"closed": "ok"}
    assert len(hub.negotiations) == negotiated + 1  # negotiate (through the proxy), then the socket
    records = new.wait(2)
    recs = signalr_records(records)
    assert len(recs) == len(records) == 2, summary(records)
    servers = [hub.turn(p) for p in prompts]
    assert servers[0].connection == servers[1].connection and {s.protocol for s in servers} == {protocol}
    assert servers[0].path_qs.startswith("/sydney/ChatHub?id=tok-")
    for js, server in zip(out[:2], servers, strict=True):
        turn = ClientTurn(
            js["prompt"], updates=js["updates"], items=[js["item"]], error=js["error"], completed=js["error"] is None
        )
        assert js_final_text(js) == turn.final_text
        assert_completed_turn(record_of(recs, js["prompt"]), turn, server)
    assert recs[0]["scheme"] == ("https" if tls else "http")


def test_the_official_js_client_stopping_mid_turn_gives_a_client_aborted_record(
    hub: ChatHubServer, recorded: Any
) -> None:
    """``connection.stop()`` after two updates: the client sends a Close (type 7) and closes the
    socket (1005) while the turn is open."""
    prompt = unique("slow then stop")
    new = NewRecords(recorded.api)
    out = run_node(
        recorded,
        {"url": hub.url(tls=True, ws=False), "protocol": "json", "prompts": [prompt], "stopAfterUpdates": 2},
    )
    js = out[0]
    server = hub.turn(prompt)
    assert server.ended in ("closed", "cancelled")
    assert js["updates"] == server.updates == cumulative(answer_for(prompt))[:2] and js["item"] is None
    (rec,) = new.wait(1)
    assert rec["dialect"] == DIALECT and rec["outcome"] == "client_aborted", summary([rec])
    assert rec["text"] == js["updates"][-1]
    assert rec["request"]["messages"] == [{"role": "user", "content": prompt}]


@pytest.mark.parametrize("protocol", ["json", "messagepack"])
def test_the_official_js_client_cancelling_a_stream_gives_a_client_aborted_record_and_the_socket_goes_on(
    hub: ChatHubServer, recorded: Any, protocol: str
) -> None:
    """Disposing of the first turn's stream after two updates sends a CancelInvocation (type 5);
    the socket stays open and the next prompt on it completes: two records."""
    prompts = [unique("slow then cancel"), unique("and now in full")]
    new = NewRecords(recorded.api)
    out = run_node(
        recorded,
        {"url": hub.url(tls=True, ws=False), "protocol": protocol, "prompts": prompts, "cancelAfterUpdates": 2},
    )
    cancelled, full = out[0], out[1]
    assert cancelled["cancelled"] and cancelled["item"] is None and out[2] == {"closed": "ok"}
    servers = [hub.turn(p) for p in prompts]
    assert servers[0].ended == "cancelled" and servers[1].ended == "completed"
    assert servers[0].connection == servers[1].connection
    assert cancelled["updates"] == servers[0].updates == cumulative(answer_for(prompts[0]))[:2]
    records = new.wait(2)
    recs = signalr_records(records)
    assert len(recs) == len(records) == 2, summary(records)
    rec = record_of(recs, prompts[0])
    assert rec["outcome"] == "client_aborted" and rec["text"] == cancelled["updates"][-1], summary([rec])
    turn = ClientTurn(full["prompt"], updates=full["updates"], items=[full["item"]], completed=full["error"] is None)
    second = record_of(recs, prompts[1])
    assert_completed_turn(second, turn, servers[1])
    # the cancel ended the first turn, not the socket's close after the second
    assert iso(rec["ended_at"]) <= iso(second["started_at"]), (rec["ended_at"], second["started_at"])


def iso(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))
