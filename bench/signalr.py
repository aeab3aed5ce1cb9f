"""Per-message decode cost of the WebSocket framings (``observer/wire/signalr.py``,
``observer/wire/jsonseq.py``) against parsing the same record with ``orjson.loads``.

What is measured, per WebSocket message (µs per message, best of N rounds, observer and baseline
alternating, ``time.perf_counter``):

- ``json``: one Sydney ``update`` record per message (``{"type":1,"target":"update",...}`` + 0x1E,
  ~1.3 KB: the cumulative answer twice, as ``text`` and in ``adaptiveCards``, plus the message's
  metadata, modelled on ``../shared/reference/binary-formats.md`` §3.1), a turn of ``--messages``
  updates whose text grows token by token. Observer: ``JsonRecordDecoder.feed(message)`` (split on
  0x1E, orjson parse, the checks, one ``HubMessage``). Baseline: ``orjson.loads`` of the same
  record (without its 0x1E): the floor of any decoder that parses each record once.
- ``messagepack``: the same updates as MessagePack frames (``[1, {}, nil, "update", [...]]`` with a
  VarInt prefix). Observer: ``MessagePackDecoder.feed(message)``. Baselines: ``orjson.loads`` of
  the same record's JSON form, and ``msgpack.unpackb`` of the body (the floor of this path).
- ``jsonseq``: consumer Copilot ``appendText`` events, one per message. Observer:
  ``JsonSequenceDecoder.feed(message)`` plus ``orjson.loads`` of the framed value (what the
  consumer then does). Baseline: ``orjson.loads`` of the message.

Every observer run's output is checked (a decoder that returned the wrong thing fails the
suite: exit 1). No target is judged here: the issue's targets are end to end (per-message added
latency through the proxy, <= +0.3 ms p50); these figures are the decode's share of that.

    .venv/bin/python bench/signalr.py [--smoke] [--messages 2000] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import msgpack  # noqa: E402
import orjson  # noqa: E402

from bench._common import Report  # noqa: E402
from observer.wire.jsonseq import JsonSequenceDecoder  # noqa: E402
from observer.wire.signalr import HubMessage, JsonRecordDecoder, MessagePackDecoder  # noqa: E402

_WORDS = (" the", " weather", " in", " Vienna", " is", " sunny", ",", " 24", " °C", " and", " dry", ".")


def sydney_updates(n: int) -> list[dict]:
    """``n`` Sydney ``update`` invocations of one turn, the answer growing by one token each,
    capped at ~400 characters (later snapshots of a long answer are longer still)."""
    out = []
    text = "Hello, this is Bing."
    for i in range(n):
        text = (text + _WORDS[i % len(_WORDS)])[-400:]
        message = {
            "text": text,
            "author": "bot",
            "createdAt": "2023-05-01T10:00:00.1234567+00:00",
            "timestamp": "2023-05-01T10:00:00.1234567+00:00",
            "messageId": "5b0d6e2a-4f7b-4b8c-9a3e-1c2d3e4f5a6b",
            "requestId": "9f8e7d6c-5b4a-3c2d-1e0f-a1b2c3d4e5f6",
            "offense": "Unknown",
            "adaptiveCards": [
                {"type": "AdaptiveCard", "version": "1.0", "body": [{"type": "TextBlock", "text": text, "wrap": True}]}
            ],
            "sourceAttributions": [],
            "feedback": {"tag": None, "updatedOn": None, "type": "None"},
            "contentOrigin": "DeepLeo",
            "privacy": None,
        }
        out.append({"type": 1, "target": "update", "arguments": [{"messages": [message], "requestId": "req-1"}]})
    return out


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def best_per_message(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Best (least) µs per message over ``rounds`` runs of ``fn`` (which handles ``n`` messages)."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    n = 100 if args.smoke else args.messages
    rounds = 2 if args.smoke else args.rounds
    started = time.monotonic()
    report = Report("signalr", smoke=args.smoke)

    updates = sydney_updates(n)
    records = [orjson.dumps(u) for u in updates]
    json_messages = [r + b"\x1e" for r in records]
    bodies = [msgpack.packb([1, {}, None, "update", u["arguments"]]) for u in updates]
    mp_messages = [varint(len(b)) + b for b in bodies]
    events = [
        orjson.dumps({"event": "appendText", "messageId": "m-1", "partId": "0", "text": w, "id": str(i)})
        for i, w in enumerate(_WORDS[i % len(_WORDS)] for i in range(n))
    ]
    loads, unpackb = orjson.loads, msgpack.unpackb

    def run_json() -> list:
        dec = JsonRecordDecoder()
        return [dec.feed(m) for m in json_messages]

    def run_mp() -> list:
        dec = MessagePackDecoder()
        return [dec.feed(m) for m in mp_messages]

    def run_seq() -> list:
        dec = JsonSequenceDecoder()
        return [[loads(f[1]) for f in dec.feed(m)] for m in events]

    def base_json() -> list:
        return [loads(r) for r in records]

    def base_unpack() -> list:
        return [unpackb(b) for b in bodies]

    def base_seq() -> list:
        return [loads(m) for m in events]

    # Check the observer's output once (a fast but wrong decoder fails the suite).
    ok = True
    for name, got in (("json", run_json()), ("messagepack", run_mp())):
        want = [u["arguments"] for u in updates]
        if [[m.arguments for m in out if isinstance(m, HubMessage)] for out in got] != [[w] for w in want]:
            print(f"{name}: decoded messages differ from the generated updates")
            ok = False
    if [out[0]["text"] for out in run_seq()] != [orjson.loads(e)["text"] for e in events]:
        print("jsonseq: framed events differ from the generated ones")
        ok = False

    figures: dict[str, list[float]] = {k: [] for k in ("json", "base_json", "mp", "base_unpack", "seq", "base_seq")}
    for _ in range(3):  # alternate observer and baseline; keep each side's best
        figures["json"].append(best_per_message(run_json, n, rounds))
        figures["base_json"].append(best_per_message(base_json, n, rounds))
        figures["mp"].append(best_per_message(run_mp, n, rounds))
        figures["base_unpack"].append(best_per_message(base_unpack, n, rounds))
        figures["seq"].append(best_per_message(run_seq, n, rounds))
        figures["base_seq"].append(best_per_message(base_seq, n, rounds))
    f = {k: min(v) for k, v in figures.items()}
    json_bytes = sum(map(len, json_messages)) / n
    mp_bytes = sum(map(len, mp_messages)) / n
    report.add(
        "SignalR JSON: Sydney update message",
        f["json"],
        "µs/msg",
        baseline=f["base_json"],
        note=f"baseline orjson.loads of the record; {json_bytes:.0f} B/msg",
    )
    report.add(
        "SignalR MessagePack: the same update",
        f["mp"],
        "µs/msg",
        baseline=f["base_json"],
        note=f"baseline orjson.loads of its JSON form; {mp_bytes:.0f} B/msg",
    )
    report.add(
        "SignalR MessagePack vs msgpack.unpackb",
        f["mp"],
        "µs/msg",
        baseline=f["base_unpack"],
        note="baseline msgpack.unpackb of the body alone",
    )
    report.add(
        "concatenated JSON: appendText message (+ parse)",
        f["seq"],
        "µs/msg",
        baseline=f["base_seq"],
        note=f"baseline orjson.loads of the message; {sum(map(len, events)) / n:.0f} B/msg",
    )
    report.details = {
        "messages": n,
        "rounds": rounds,
        "json_bytes_per_msg": round(json_bytes, 1),
        "msgpack_bytes_per_msg": round(mp_bytes, 1),
        "us_per_msg": {k: round(v, 3) for k, v in f.items()},
    }
    return report.finish(started, args.json, ok)


if __name__ == "__main__":
    raise SystemExit(main())
