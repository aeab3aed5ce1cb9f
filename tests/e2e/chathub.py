"""A fake Copilot "Sydney" ChatHub for the WebSocket end-to-end tests: an aiohttp server on
127.0.0.1 speaking the SignalR hub protocol (``../shared/reference/binary-formats.md`` §2, §3.1)
to real SignalR clients (pysignalr, the official ``@microsoft/signalr``).

One aiohttp application on its own event loop in a daemon thread, with two listeners: plain HTTP
and TLS (a throw-away CA and a leaf for 127.0.0.1 / localhost, ``tests/e2e/upstream.py``'s
``make_certs``; ``ca_path`` is the file a direct client trusts). Routes, under ``HUB_PATH``
(``/sydney/ChatHub``):

``POST {hub}/negotiate?negotiateVersion=1``
    ``{connectionToken, connectionId, negotiateVersion: 1, availableTransports: [WebSockets]}``.

``GET {hub}`` (WebSocket, permessage-deflate offered back when the client asks: ``compress``)
    The handshake ``{"protocol":"json"|"messagepack","version":1}␞`` (a text or binary message)
    is answered ``{}␞`` (text); then JSON records split on 0x1E, or MessagePack frames behind
    their VarInt length. Pings (6) and a client's Close (7) are ignored (the client closes the
    socket after it), a CancelInvocation (5) cancels the turn. A ``chat`` StreamInvocation (4), or Invocation (1) with an invocation id,
    is answered with a scripted Sydney turn (``script_for``): ``update`` invocations (no
    invocation id) with a Progress meta message first, then the bot's cumulative text, ``gap_s``
    apart; then one WebSocket message holding the ``type:2`` StreamItem (the user and the final
    bot message, ``result.value``) and the ``type:3`` Completion, as the real service sends them.

The same hub also answers at ``M365_HUB_PATH`` (``/m365Copilot/Chathub/{oid}@{tid}``, M365
Copilot's, §3.2): there every bot ``update`` carries the new text as an incremental
``writeAtCursor`` delta besides the cumulative ``messages[].text``.

The prompt (``arguments[0].message.text``) chooses the script by its first word:

- ``error ...``: two updates, then a Completion with ``error`` (no StreamItem);
- ``throttled ...``: two updates, then the StreamItem's ``result.value`` is ``"Throttled"``, then a void Completion;
- ``drop ...``: two updates, then the server drops the TCP connection (no close frame);
- ``close ...``: two updates, then a hub Close message (7) with an ``error``, and the server
  closes the socket (1000);
- ``slow ...``: two updates, then it waits (at most ``slow_s``) for the client to cancel or
  close; if nobody does, the turn completes;
- anything else: a complete turn.

Every turn is kept as a ``ServerTurn`` (what was sent, and how it ended) for the tests to compare
with what the client received and what the observer recorded. The server's lifetime is bounded
(``lifetime_s``: it stops by itself), every socket it holds is closed on ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
from aiohttp import WSMsgType, web

from tests.e2e.upstream import make_certs

HUB_PATH = "/sydney/ChatHub"
M365_HUB_PATH = "/m365Copilot/Chathub/{oid}@{tid}"
RS = "\x1e"
MODES = ("error", "throttled", "drop", "slow", "close")


def answer_for(prompt: str) -> str:
    return f"Hello, this is Bing. You asked: “{prompt}”. The weather in Vienna is sunny, 24 °C."


def cumulative(text: str, pieces: int = 4) -> list[str]:
    """``pieces`` growing prefixes of ``text`` (cut at spaces), the last one the whole text."""
    words = text.split(" ")
    cuts = sorted({max(1, round(len(words) * (i + 1) / pieces)) for i in range(pieces)})
    return [" ".join(words[:c]) for c in cuts]


def mode_of(prompt: str) -> str:
    first = prompt.strip().split(" ", 1)[0].lower() if prompt.strip() else ""
    return first if first in MODES else "complete"


@dataclass
class ServerTurn:
    """One ``chat`` invocation as the hub saw and answered it."""

    connection: int
    path_qs: str
    protocol: str
    invocation_id: str
    prompt: str
    tone: str | None
    mode: str
    updates: list[str] = field(default_factory=list)  # the cumulative bot texts sent, in order
    final_text: str | None = None  # the bot text of the type-2 item (None: no item sent)
    ended: str | None = None  # completed | error | throttled | dropped | cancelled | closed
    started: float = field(default_factory=time.monotonic)


# --------------------------------------------------------------------------------------------
# hub protocol encoding


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def read_frames(data: bytes) -> list[Any]:
    """MessagePack hub frames (VarInt length, body) of one WebSocket message."""
    out, i = [], 0
    while i < len(data):
        length, shift = 0, 0
        while True:
            b = data[i]
            i += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        out.append(msgpack.unpackb(data[i : i + length], raw=False))
        i += length
    return out


class HubCodec:
    """Encodes server messages / decodes client messages as JSON objects, for either protocol."""

    def __init__(self, protocol: str):
        self.protocol = protocol

    def decode(self, data: bytes | str) -> list[dict[str, Any]]:
        if self.protocol == "json":
            text = data.decode() if isinstance(data, bytes) else data
            return [json.loads(r) for r in text.split(RS) if r.strip()]
        raw = data.encode() if isinstance(data, str) else data
        out: list[dict[str, Any]] = []
        for m in read_frames(raw):
            t = m[0]
            if t in (1, 4):
                out.append({"type": t, "invocationId": m[2], "target": m[3], "arguments": m[4]})
            elif t == 5:
                out.append({"type": 5, "invocationId": m[2]})
            elif t == 7:
                out.append({"type": 7, "error": m[1] if len(m) > 1 else None})
            else:
                out.append({"type": t})
        return out

    def encode(self, *messages: dict[str, Any]) -> str | bytes:
        """One WebSocket message holding ``messages`` (text for JSON, binary for MessagePack)."""
        if self.protocol == "json":
            return "".join(json.dumps(m, separators=(",", ":"), ensure_ascii=False) + RS for m in messages)
        out = b""
        for m in messages:
            t = m["type"]
            if t == 1:
                arr: list[Any] = [1, {}, m.get("invocationId"), m["target"], m["arguments"], []]
            elif t == 2:
                arr = [2, {}, m["invocationId"], m["item"]]
            elif t == 3:
                if m.get("error") is not None:
                    arr = [3, {}, m["invocationId"], 1, m["error"]]
                else:
                    arr = [3, {}, m["invocationId"], 2]
            elif t == 6:
                arr = [6]
            elif t == 7:
                arr = [7, m.get("error"), bool(m.get("allowReconnect"))]
            else:
                raise ValueError(f"cannot encode {m!r}")
            body = msgpack.packb(arr, use_bin_type=True)
            out += varint(len(body)) + body
        return out


# --------------------------------------------------------------------------------------------
# the server


class ChatHubServer:
    """The fake ChatHub (module docstring); ``start()`` runs it in a daemon thread."""

    def __init__(self, gap_s: float = 0.03, slow_s: float = 10.0, lifetime_s: float = 300.0, compress: bool = True):
        self.gap_s = gap_s
        self.slow_s = slow_s
        self.lifetime_s = lifetime_s
        self.compress = compress
        self._tmp = tempfile.TemporaryDirectory(prefix="e2e-chathub-")
        self.ca_path, self._cert, self._key = make_certs(self._tmp.name)
        self.http_port = 0
        self.https_port = 0
        self.turns: list[ServerTurn] = []
        self.negotiations: list[str] = []  # path + query of every negotiate request
        self.connections: list[str] = []  # path + query of every WebSocket accepted
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._sockets: set[web.WebSocketResponse] = set()
        self._stopped = threading.Event()

    # ---- lifecycle

    def _app(self) -> web.Application:
        app = web.Application()
        for path in (HUB_PATH, M365_HUB_PATH):
            app.router.add_post(path + "/negotiate", self._negotiate)
            app.router.add_get(path, self._hub)
        return app

    async def _start_async(self) -> None:
        self._runner = web.AppRunner(self._app(), handle_signals=False, shutdown_timeout=2)
        await self._runner.setup()
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self._cert, self._key)
        plain = web.TCPSite(self._runner, "127.0.0.1", 0)
        tls = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ctx)
        await plain.start()
        await tls.start()
        self.http_port = plain._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.https_port = tls._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _stop_async(self) -> None:
        for ws in list(self._sockets):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.close(code=1001), 1)
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._runner.cleanup(), 5)

    def start(self, timeout: float = 10.0) -> ChatHubServer:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._start_async())
            except BaseException as e:  # noqa: BLE001 - reported to the starter
                failure.append(e)
                started.set()
                return
            started.set()
            loop.call_later(self.lifetime_s, loop.stop)  # bounded lifetime
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._stop_async())
                loop.close()
                self._stopped.set()

        self._thread = threading.Thread(target=run, name="e2e-chathub", daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise RuntimeError("chathub did not start")
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._tmp.cleanup()

    def __enter__(self) -> ChatHubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- helpers for tests

    def url(
        self, tls: bool = True, ws: bool = True, query: str = "", host: str = "127.0.0.1", m365: bool = False
    ) -> str:
        """The hub's URL (``m365``: the M365 Copilot hub path, ``M365_HUB_PATH``)."""
        scheme = ("wss" if tls else "ws") if ws else ("https" if tls else "http")
        port = self.https_port if tls else self.http_port
        path = M365_HUB_PATH.format(oid="0f9e-oid", tid="72f9-tid") if m365 else HUB_PATH
        return f"{scheme}://{host}:{port}{path}" + (f"?{query}" if query else "")

    def turn(self, prompt: str, timeout: float = 10.0, ended: bool = True) -> ServerTurn:
        """The (newest) turn with this prompt, once it has ended (bounded wait)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                found = [t for t in self.turns if t.prompt == prompt and (t.ended or not ended)]
            if found:
                return found[-1]
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {'ended ' if ended else ''}turn with prompt {prompt!r} on the hub")
            time.sleep(0.02)

    # ---- handlers

    async def _negotiate(self, request: web.Request) -> web.Response:
        n = next(self._ids)
        with self._lock:
            self.negotiations.append(request.path_qs)
        return web.json_response(
            {
                "connectionToken": f"tok-{n}",
                "connectionId": f"conn-{n}",
                "negotiateVersion": 1,
                "availableTransports": [{"transport": "WebSockets", "transferFormats": ["Text", "Binary"]}],
            }
        )

    async def _hub(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(compress=self.compress, autoping=True, heartbeat=None, max_msg_size=4 << 20)
        await ws.prepare(request)
        conn = next(self._ids)
        with self._lock:
            self.connections.append(request.path_qs)
        self._sockets.add(ws)
        turns: dict[str, tuple[ServerTurn, asyncio.Task]] = {}
        try:
            first = await asyncio.wait_for(ws.receive(), 10)
            if first.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                return ws
            raw = first.data.encode() if isinstance(first.data, str) else first.data
            hs, _, rest = raw.partition(RS.encode())
            protocol = json.loads(hs).get("protocol", "json")
            if protocol not in ("json", "messagepack"):
                await ws.send_str(json.dumps({"error": f"Requested protocol '{protocol}' is not available."}) + RS)
                return ws
            codec = HubCodec(protocol)
            await ws.send_str("{}" + RS)
            pending = [rest] if rest else []
            while True:
                if pending:
                    data: bytes | str = pending.pop(0)
                else:
                    msg = await ws.receive()
                    if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                        break
                    data = msg.data
                for m in codec.decode(data):
                    t = m.get("type")
                    if t in (1, 4) and m.get("target") == "chat" and m.get("invocationId") is not None:
                        arg = (m.get("arguments") or [{}])[0] or {}
                        prompt = str(((arg.get("message") or {}).get("text")) or "")
                        turn = ServerTurn(
                            conn,
                            request.path_qs,
                            protocol,
                            str(m["invocationId"]),
                            prompt,
                            arg.get("tone"),
                            "m365" if request.path.startswith("/m365Copilot/") else mode_of(prompt),
                        )
                        with self._lock:
                            self.turns.append(turn)
                        task = asyncio.ensure_future(self._run_turn(ws, request, codec, turn))
                        turns[turn.invocation_id] = (turn, task)
                    elif t == 5 and m.get("invocationId") in turns:
                        turn, task = turns[m["invocationId"]]
                        if not task.done():
                            task.cancel()
                            turn.ended = "cancelled"
                    # a Close (7) from the client (the JS client's stop()): it closes the
                    # socket itself next; the hub keeps reading (and so does not close first)
        except (TimeoutError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._sockets.discard(ws)
            for turn, task in turns.values():
                if not task.done():
                    task.cancel()
                    if turn.ended is None:
                        turn.ended = "closed"
        return ws

    async def _run_turn(
        self, ws: web.WebSocketResponse, request: web.Request, codec: HubCodec, turn: ServerTurn
    ) -> None:
        inv = turn.invocation_id
        answer = answer_for(turn.prompt)
        steps = cumulative(answer)

        def update(text: str, message_type: str | None = None) -> dict[str, Any]:
            msg: dict[str, Any] = {"text": text, "author": "bot", "messageId": f"m-{inv}"}
            if message_type:
                msg["messageType"] = message_type
            arg: dict[str, Any] = {"messages": [msg], "requestId": f"req-{inv}"}
            if turn.mode == "m365" and not message_type:  # the delta, and the cumulative text
                arg["writeAtCursor"] = text[len(turn.updates[-1]) :] if turn.updates else text
            return {"type": 1, "target": "update", "arguments": [arg]}

        async def send(*messages: dict[str, Any]) -> None:
            data = codec.encode(*messages)
            if isinstance(data, str):
                await ws.send_str(data)
            else:
                await ws.send_bytes(data)

        try:
            await send(update("Generating answers for you…", "Progress"))
            limit = 2 if turn.mode in MODES else len(steps)
            for text in steps[:limit]:
                await asyncio.sleep(self.gap_s)
                await send(update(text))
                turn.updates.append(text)
            await asyncio.sleep(self.gap_s)
            if turn.mode == "drop":
                turn.ended = "dropped"
                if request.transport is not None:
                    request.transport.abort()  # a TCP drop, no close frame
                return
            if turn.mode == "close":
                turn.ended = "close_error"
                await send(
                    {"type": 7, "error": "Connection closed with an error. (E-HUB-CLOSE)", "allowReconnect": False}
                )
                await ws.close()
                return
            if turn.mode == "error":
                await send({"type": 3, "invocationId": inv, "error": "An unexpected error occurred (E-HUB-1)."})
                turn.ended = "error"
                return
            if turn.mode == "slow":
                await asyncio.sleep(self.slow_s)  # the client cancels or closes meanwhile
                for text in steps[limit:]:
                    await send(update(text))
                    turn.updates.append(text)
            value = "Throttled" if turn.mode == "throttled" else "Success"
            final = steps[-1] if turn.mode != "throttled" else turn.updates[-1]
            item = {
                "messages": [
                    {"author": "user", "text": turn.prompt},
                    {"author": "bot", "text": final, "contentOrigin": "DeepLeo", "turnState": "Completed"},
                ],
                "firstNewMessageIndex": 1,
                "requestId": f"req-{inv}",
                "throttling": {"maxNumUserMessagesInConversation": 30, "numUserMessagesInConversation": 1},
                "result": {"value": value, "message": final},
            }
            turn.final_text = final
            await send({"type": 2, "invocationId": inv, "item": item}, {"type": 3, "invocationId": inv})
            turn.ended = "throttled" if value != "Success" else "completed"
        except asyncio.CancelledError:
            if turn.ended is None:
                turn.ended = "cancelled"
            raise
        except (ConnectionError, RuntimeError):
            if turn.ended is None:
                turn.ended = "closed"


if __name__ == "__main__":  # a manual check: python -m tests.e2e.chathub
    with ChatHubServer() as hub:
        print(json.dumps({"ws": hub.url(tls=False), "wss": hub.url(tls=True), "ca": hub.ca_path}), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            hub._stopped.wait(hub.lifetime_s + 5)
