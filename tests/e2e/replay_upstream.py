"""A local upstream that REPLAYS the wire fixtures (``tests/fixtures/wire/<dialect>/<case>.<ext>``)
to real clients (the official SDKs, curl) through the proxy under test.

It is ``tests/e2e/upstream.py``'s ``UpstreamServer`` (plain HTTP/1.1 and TLS with ALPN h2 /
http/1.1 on 127.0.0.1, one exchange log per request with monotonic send times, so a test can
check that every event reached the client before the next one was sent) with another
``_respond``: any ``POST`` path answers with the body of the chosen fixture case.

Choosing the case, per request (the SDKs call their own fixed paths, so the case cannot be
in the path):

- header ``x-upstream-case: <dialect>/<case>`` (e.g. ``openai.chat/text_basic``), or query
  ``case=<dialect>/<case>``;
- header ``x-upstream-gap-ms`` / query ``gap_ms``: pause between two pieces (default 100 ms);
- header ``x-test-id`` / query ``tid``: key of the exchange log (``wait_exchange(tid)``).

What is sent (``fixture_response``): the status, ``Content-Type`` (the case's ``meta.json``
``content_type``, else by extension, ``tests/wirefeed.py``'s ``BODY_TYPES``: ``.sse`` text/event-stream,
``.ndjson`` application/x-ndjson, ``.json`` application/json, ``.txt`` text/plain),
``Content-Encoding`` and extra ``response_headers`` of the case's meta, then the body bytes
exactly as stored, cut into pieces (``split_pieces``), one piece per HTTP/1.1 chunk / HTTP/2 DATA
frame, ``gap_ms`` apart:

- SSE: one event per piece (cut after each blank line: the line end that ends the last field
  line plus the empty line, any of CRLF / LF / CR, kept in the piece);
- NDJSON: one line per piece;
- JSON: a top-level array one element per piece (``[`` with the first element, then
  ``,<element>``..., then the closing ``]``); any other JSON body as one piece;
- a content-encoded body (meta ``content_encoding``): one piece (it is stored encoded).

The pieces joined are the stored body byte for byte. A case whose meta ``end`` is
``upstream_failed`` ends by aborting the connection (HTTP/1.1: no chunked terminator; HTTP/2:
RST_STREAM) instead of finishing the body.

Script mode (for trying it by hand)::

    python tests/e2e/replay_upstream.py --port 0 --tls-port 0
    -> {"http_port": ..., "https_port": ..., "ca_cert": "..."}
    curl -N -H 'x-upstream-case: openai.chat/text_basic' -d '{}' http://127.0.0.1:<http_port>/v1/chat/completions
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # script mode: make ``tests.e2e.upstream`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e.upstream import UpstreamExchange, UpstreamServer, send_event
from tests.wirefeed import BODY_TYPES  # the fixtures' extensions and their media types: one table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "wire"
DEFAULT_GAP_MS = 100.0
_SIDE_FILES = (".request.json", ".expected.json", ".meta.json")
_EVENT_END = re.compile(rb"(?:\r\n|\r|\n)(?:\r\n|\r|\n)")


# --------------------------------------------------------------------------------------------
# fixtures


@dataclass
class FixtureResponse:
    """One stored case as the replay upstream answers it."""

    dialect: str
    case: str
    body: bytes
    pieces: list[bytes]
    status: int = 200
    content_type: str = "text/event-stream"
    content_encoding: str | None = None
    response_headers: dict[str, str] = field(default_factory=dict)
    path: str = "/v1/stream"  # the path the fixture was captured on (meta ``path``, with query)
    end: str = "eof"
    request: bytes = b""
    expected: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.dialect}/{self.case}"

    @property
    def request_json(self) -> Any:
        return json.loads(self.request) if self.request else None


def case_names(dialect: str, root: Path = FIXTURES) -> list[str]:
    """The cases of one dialect folder (those with an ``expected.json``), sorted."""
    d = root / dialect
    return sorted(p.name.removesuffix(".expected.json") for p in d.glob("*.expected.json")) if d.is_dir() else []


def fixture_response(dialect: str, case: str, root: Path = FIXTURES) -> FixtureResponse:
    """Loads ``tests/fixtures/wire/<dialect>/<case>.*`` (same layout and defaults as
    ``tests/wirefeed.py``; ``root`` another fixture tree). ``FileNotFoundError`` when the case
    has no single body file."""
    d = root / dialect
    if not d.is_dir() or "/" in case or case.startswith("."):
        raise FileNotFoundError(f"{dialect}/{case}")
    bodies = [
        p
        for p in d.glob(f"{case}.*")
        if p.suffix in BODY_TYPES and not p.name.endswith(_SIDE_FILES) and p.name[: -len(p.suffix)] == case
    ]
    if len(bodies) != 1:
        raise FileNotFoundError(f"{dialect}/{case}: expected one body file, found {[p.name for p in bodies]}")
    meta: dict[str, Any] = {}
    for name in ("_defaults.meta.json", f"{case}.meta.json"):
        p = d / name
        if p.exists():
            meta.update(json.loads(p.read_text(encoding="utf-8")))
    body = bodies[0].read_bytes()
    content_type = meta.get("content_type", BODY_TYPES[bodies[0].suffix])
    encoding = meta.get("content_encoding")
    req = d / f"{case}.request.json"
    exp = d / f"{case}.expected.json"
    return FixtureResponse(
        dialect=dialect,
        case=case,
        body=body,
        pieces=split_pieces(body, content_type, encoding),
        status=int(meta.get("status", 200)),
        content_type=content_type,
        content_encoding=encoding,
        response_headers=dict(meta.get("response_headers", {})),
        path=meta.get("path", "/v1/stream"),
        end=meta.get("end", "eof"),
        request=req.read_bytes() if req.exists() else b"",
        expected=json.loads(exp.read_text(encoding="utf-8")) if exp.exists() else {},
        meta=meta,
    )


def split_pieces(body: bytes, content_type: str, content_encoding: str | None = None) -> list[bytes]:
    """The body cut into the pieces the upstream sends one at a time (see the module doc);
    ``b"".join(pieces) == body`` always."""
    if not body:
        return []
    if content_encoding:
        return [body]
    mt = content_type.split(";", 1)[0].strip().lower()
    if mt == "text/event-stream":
        return split_sse(body)
    if mt in ("application/x-ndjson", "application/jsonl", "application/ndjson"):
        return [line for line in body.splitlines(keepends=True)]
    if mt == "application/json" or mt.endswith("+json"):
        return split_json_array(body)
    if mt == "application/vnd.amazon.eventstream":
        return split_event_stream(body)
    if mt.startswith(("application/connect+", "application/grpc")):
        return split_envelopes(body)
    return [body]


def split_envelopes(body: bytes) -> list[bytes]:
    """One Connect / gRPC envelope per piece (a flag byte, a u32 big-endian length, the
    message); an envelope cut short is the last piece."""
    pieces: list[bytes] = []
    start = 0
    while start + 5 <= len(body):
        end = start + 5 + int.from_bytes(body[start + 1 : start + 5], "big")
        if end > len(body):
            break
        pieces.append(body[start:end])
        start = end
    if start < len(body):
        pieces.append(body[start:])
    return pieces


def split_event_stream(body: bytes) -> list[bytes]:
    """One AWS event-stream frame per piece (each frame begins with its ``total_length``, u32
    big-endian); a frame cut short, or a length that cannot be one, is the last piece."""
    pieces: list[bytes] = []
    start = 0
    while start + 4 <= len(body):
        total = int.from_bytes(body[start : start + 4], "big")
        if total < 16 or start + total > len(body):
            break
        pieces.append(body[start : start + total])
        start += total
    if start < len(body):
        pieces.append(body[start:])
    return pieces


def split_sse(body: bytes) -> list[bytes]:
    """One SSE event per piece: cut after every blank line (its line ends kept)."""
    pieces: list[bytes] = []
    start = 0
    for m in _EVENT_END.finditer(body):
        pieces.append(body[start : m.end()])
        start = m.end()
    if start < len(body):
        pieces.append(body[start:])
    return pieces


def split_json_array(body: bytes) -> list[bytes]:
    """A top-level JSON array cut after each element (strings and escapes respected); any
    other body (an object, invalid JSON) as one piece."""
    i = 0
    n = len(body)
    while i < n and body[i] in b" \t\r\n\xef\xbb\xbf":
        i += 1
    if i >= n or body[i : i + 1] != b"[":
        return [body]
    pieces: list[bytes] = []
    start = 0
    depth = 0
    in_str = False
    esc = False
    for j in range(i, n):
        c = body[j]
        if in_str:
            if esc:
                esc = False
            elif c == 0x5C:  # backslash
                esc = True
            elif c == 0x22:
                in_str = False
            continue
        if c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):  # [ {
            depth += 1
        elif c in (0x5D, 0x7D):  # ] }
            depth -= 1
            if depth == 1 or depth == 0:  # an element (or the array) just closed
                pieces.append(body[start : j + 1])
                start = j + 1
    if start < n:
        if pieces:
            pieces[-1] += body[start:]
        else:
            pieces.append(body[start:])
    return pieces


# --------------------------------------------------------------------------------------------
# server


class ReplayUpstream(UpstreamServer):
    """``UpstreamServer`` that answers every ``POST`` with the fixture case the request names.

    ``ex.events`` / ``ex.send_times`` / ``ex.event_end_offsets`` of the exchange log hold, per
    piece, its bytes, the monotonic time just before it was written and the body length after
    it (the pieces are sent unencoded as stored, so these are raw-body offsets too).
    """

    def __init__(self, *args: Any, default_gap_ms: float = DEFAULT_GAP_MS, fixtures: Path = FIXTURES, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.default_gap_ms = default_gap_ms
        self.fixtures = fixtures

    async def _respond(self, ex: UpstreamExchange, w: Any) -> None:
        name = ex.query.get("case", "")
        dialect, _, case = name.partition("/")
        try:
            fx = fixture_response(dialect, case, self.fixtures)
        except (FileNotFoundError, ValueError) as e:
            await self._send_simple(ex, w, 404, {"error": {"type": "unknown_fixture", "message": str(e)[:200]}})
            return
        gap = float(ex.query.get("gap_ms", self.default_gap_ms)) / 1000.0
        headers = [("content-type", fx.content_type), ("cache-control", "no-cache")]
        if fx.content_encoding:
            headers.append(("content-encoding", fx.content_encoding))
        headers += [
            (k.lower(), str(v))
            for k, v in fx.response_headers.items()
            if k.lower() not in ("content-type", "content-encoding", "content-length", "transfer-encoding")
        ]
        if ex.http_version == "HTTP/1.1":
            headers.append(("transfer-encoding", "chunked"))
        ex.status, ex.response_headers = fx.status, headers
        await w.send_headers(fx.status, headers)
        for i, piece in enumerate(fx.pieces):
            if i > 0 and gap > 0:
                await asyncio.sleep(gap)
            await send_event(w, ex, piece, piece)
        if fx.end == "upstream_failed":
            await asyncio.sleep(gap)
            ex.aborted = True
            await w.abort("rst" if ex.http_version == "HTTP/2" else "close")
            return
        await w.end()
        ex.completed = True


# --------------------------------------------------------------------------------------------
# script mode


async def _main_async(args: argparse.Namespace) -> None:
    server = ReplayUpstream(args.host, args.port, args.tls_port, keep=200, default_gap_ms=args.gap_ms)
    await server.start_async()
    print(
        json.dumps({"http_port": server.http_port, "https_port": server.https_port, "ca_cert": server.ca_cert_path}),
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), args.max_s) if args.max_s > 0 else await stop.wait()
    except TimeoutError:
        pass
    finally:
        await server.stop_async()
        if server._tmp is not None:
            server._tmp.cleanup()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Replays the wire fixtures (see the module docstring).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="plain HTTP/1.1 port (0 = any free)")
    ap.add_argument("--tls-port", type=int, default=0, help="TLS port, ALPN h2/http1.1 (0 = any free)")
    ap.add_argument("--gap-ms", type=float, default=DEFAULT_GAP_MS, help="default pause between pieces")
    ap.add_argument("--max-s", type=float, default=3600.0, help="stop by itself after this many seconds (0 = never)")
    asyncio.run(_main_async(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
