"""Per-message latency added by WebSocket observation (issue 15), against the same proxy
without it.

Starts, all on 127.0.0.1: a SignalR-JSON ChatHub-like WebSocket server (``websockets``; the
Sydney shape of the shared reference binary-formats §3.1: each ``chat`` invocation answered by
``--messages`` ``update`` invocations carrying the bot's cumulative text, ~40 characters more
each, ``--gap-ms`` apart, then the final ``type:2`` item and the ``type:3`` completion); and
two ``mitmdump -q`` proxies (``bench/_procs.py``): the baseline ``bench/passthrough_addon.py``
and the product ``addons/llm_audit.py`` with 127.0.0.1 on its LLM host list, which observes the
socket (``signalr.copilot``: every message framed, parsed, turned into canonical events; one
record per turn). Every update carries ``"sent": time.time()`` taken just before the server
writes it; the client (``websockets``, through the proxy with HTTP CONNECT) takes its receive
time: latency = receive - sent, p50 / p99 over all messages of all turns. Configurations
alternate turn by turn (direct, baseline, observer; the order rotates), each turn on a fresh
socket, after one warm-up turn each (not measured: as in the other benches, the first use's
one-off costs, measured here at ~100-230 ms of delay spread over the first socket's messages).

Targets (observer - baseline): p50 <= +0.3 ms, p99 <= +1 ms (the issue's, as for SSE).

    .venv/bin/python bench/sockets.py [--smoke] [--turns 30] [--messages 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report  # noqa: E402
from bench._procs import pct, start_proxies, stop_all  # noqa: E402

P50_MAX_MS = 0.3
P99_MAX_MS = 1.0
RS = b"\x1e"
WORDS = "The weather in Vienna is sunny today, with light wind. "


async def _hub(ws, messages: int, gap_s: float) -> None:
    """One hub connection: the handshake, then every chat invocation answered as Sydney does."""
    async for raw in ws:
        data = raw if isinstance(raw, bytes) else raw.encode()
        for record in filter(None, data.split(RS)):
            msg = json.loads(record)
            if "protocol" in msg:
                await ws.send("{}\x1e")
                continue
            if msg.get("type") != 4 or msg.get("target") != "chat":
                continue
            inv, text = msg["invocationId"], ""
            for i in range(messages):
                if i:
                    await asyncio.sleep(gap_s)
                text += WORDS[(i * 7) % 20 :][:40]
                update = {
                    "type": 1,
                    "target": "update",
                    "arguments": [{"messages": [{"author": "bot", "text": text}], "sent": time.time()}],
                }
                await ws.send(json.dumps(update) + "\x1e")
            final = {"type": 2, "invocationId": inv, "item": {"messages": [{"author": "bot", "text": text}]}}
            await ws.send(json.dumps(final) + "\x1e" + json.dumps({"type": 3, "invocationId": inv}) + "\x1e")


async def _turn(url: str, proxy: str | None) -> list[float]:
    """One socket, one turn; the latencies (ms) of its updates."""
    from websockets.asyncio.client import connect

    out: list[float] = []
    async with connect(url, proxy=proxy, max_size=None, compression=None, open_timeout=10) as ws:
        await ws.send('{"protocol":"json","version":1}\x1e')
        await asyncio.wait_for(ws.recv(), 10)
        chat = {
            "type": 4,
            "target": "chat",
            "invocationId": "0",
            "arguments": [{"message": {"author": "user", "text": "Weather?"}}],
        }
        await ws.send(json.dumps(chat) + "\x1e")
        done = False
        while not done:
            raw = await asyncio.wait_for(ws.recv(), 30)
            now = time.time()
            for record in filter(None, (raw if isinstance(raw, bytes) else raw.encode()).split(RS)):
                msg = json.loads(record)
                if msg.get("target") == "update":
                    out.append((now - msg["arguments"][0]["sent"]) * 1000.0)
                done |= msg.get("type") == 3
    return out


async def _run(args: argparse.Namespace, proxies: dict[str, str | None], port: int) -> dict[str, list[float]]:
    url = f"ws://127.0.0.1:{port}/sydney/ChatHub"
    results: dict[str, list[float]] = {name: [] for name in proxies}
    names = list(proxies)
    for name in names:  # warm-up (not measured): imports, the socket dialect's first use, the DB's first write
        await _turn(url, proxies[name])
    for turn in range(args.turns):
        order = names[turn % len(names) :] + names[: turn % len(names)]
        for name in order:
            results[name] += await _turn(url, proxies[name])
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--gap-ms", type=float, default=5.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.turns, args.messages = 3, 20
    started = time.monotonic()
    report = Report("sockets", smoke=args.smoke)
    from websockets.asyncio.server import serve

    with tempfile.TemporaryDirectory(prefix="bench-ws-") as tmp:
        procs = start_proxies(
            ("baseline", "addon"),
            Path(tmp),
            addon_sets={"observer_llm_hosts_extra": "127.0.0.1", "observer_proxy_allow_loopback": "true"},
        )
        try:

            async def go() -> dict[str, list[float]]:
                async with serve(
                    lambda ws: _hub(ws, args.messages, args.gap_ms / 1000.0), "127.0.0.1", 0, compression=None
                ) as server:
                    port = server.sockets[0].getsockname()[1]
                    proxies = {
                        "direct": None,
                        "baseline": procs["baseline"].proxy_url,
                        "observer": procs["addon"].proxy_url,
                    }
                    return await _run(args, proxies, port)

            results = asyncio.run(go())
        finally:
            stop_all(procs)
        records = _records(Path(tmp) / "bench.db")
    base, obs = results["baseline"], results["observer"]
    for name, q, target in (("p50", 0.5, P50_MAX_MS), ("p99", 0.99, P99_MAX_MS)):
        value, baseline = pct(obs, q), pct(base, q)
        report.add(
            f"per-message latency {name}",
            value,
            "ms",
            baseline=baseline,
            target=f"<= +{target} ms",
            met=value - baseline <= target,
            note=f"direct {pct(results['direct'], q):.3f} ms",
        )
    report.details = {"messages_per_config": {k: len(v) for k, v in results.items()}, "records": records}
    ok = records == args.turns + 1 and len(obs) == args.turns * args.messages  # (+ the warm-up turn)
    if not ok:
        print(f"observer recorded {records} turns of {args.turns}, {len(obs)} messages measured", file=sys.stderr)
    return report.finish(started, args.json, ok)


def _records(db: Path) -> int:
    import sqlite3

    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM exchanges WHERE dialect = 'signalr.copilot'").fetchone()[0]


if __name__ == "__main__":
    sys.exit(main())
