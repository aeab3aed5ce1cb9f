"""Connect / gRPC envelope throughput of the core: ``observer.wire.envelope.EnvelopeDecoder``
against the least work an envelope splitter can do, in the same process and run.

Streams (built here with the stdlib, deterministic):

- ``cursor``: 20,000 uncompressed envelopes of Cursor-like ``AgentServerMessage`` text deltas
  (``1.1.1``, 1-12 characters; 14-25-byte payloads), as ``agent.v1.AgentService/Run`` streams them;
- ``windsurf-gzip``: 5,000 envelopes, each its own gzip member (``connect-content-encoding:
  gzip``), of Windsurf-like ``GetChatMessageResponse`` deltas (``3``), then an END_STREAM;
- ``large``: 64 uncompressed envelopes of 64 KiB each (a big tool result / checkpoint).

Chunkings: ``envelope`` (one envelope per chunk, as a server flushes them), ``16k`` (HTTP/2's
default DATA frame size), ``64k``; also ``1k`` for ``large`` (an envelope arriving in pieces must
not be rescanned).

Observer: a fresh ``EnvelopeDecoder`` fed every chunk, then ``close``; each run's output is
checked (envelope count, payload bytes). Baseline, on the same chunks: ``b"".join`` of the chunks
and a loop that slices the joined body by the 5-byte prefixes (``data[pos]``, ``int.from_bytes``,
one slice per envelope; plus ``zlib.decompress(payload, 31)`` per gzip envelope): no
incremental buffering, no flag checks, no bounds, no output objects. A second table shows the
plain ``b"".join`` loop alone (the cost of touching the bytes once), and the Cursor stream through
the decoder *and* a ``FieldMap`` (``observer.wire.protobuf``) against the decoder alone.

Figures: MB/s of wire bytes (the observer's, the baseline's, their ratio) and envelopes/s. Issue
15 names no target for this figure, so none is printed (no verdict): the ratio says what the
incremental, bounded decoder costs over slicing alone, and the envelopes/s what it can carry.
Timing: ``time.perf_counter``, observer and baseline alternated, best of N (5; smoke 1).

    .venv/bin/python bench/envelope.py [--smoke] [--repeats N] [--json out.json]   # ~2 s
"""

from __future__ import annotations

import argparse
import gzip
import struct
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import Figure, Report, format_figures  # noqa: E402
from observer.wire.envelope import CONNECT, Envelope, EnvelopeDecoder  # noqa: E402
from observer.wire.protobuf import FieldMap  # noqa: E402

WORDS = ["The", " sky", " is", " blue", ",", " and", " the", " sea", " reflects", " it", ".", "\n", " Tokens"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if not n:
            out.append(b)
            return bytes(out)
        out.append(b | 0x80)


def _len(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _envelope(flags: int, payload: bytes) -> bytes:
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload


class Stream:
    """One body: its envelopes on the wire, the encoding, the decoded payload bytes expected."""

    def __init__(self, name: str, envelopes: list[bytes], encoding: str | None, payload_bytes: int) -> None:
        self.name = name
        self.envelopes = envelopes
        self.body = b"".join(envelopes)
        self.encoding = encoding
        self.payload_bytes = payload_bytes


def cursor_stream(n: int) -> Stream:
    payloads = [_len(1, _len(1, _len(1, WORDS[i % len(WORDS)].encode() * (1 + i % 3)))) for i in range(n)]
    return Stream("cursor", [_envelope(0, p) for p in payloads], None, sum(map(len, payloads)))


def windsurf_stream(n: int) -> Stream:
    payloads = [_len(3, WORDS[i % len(WORDS)].encode()) for i in range(n)]
    envs = [_envelope(1, gzip.compress(p, compresslevel=6, mtime=0)) for p in payloads]
    envs.append(_envelope(3, gzip.compress(b"{}", mtime=0)))
    return Stream("windsurf-gzip", envs, "gzip", sum(map(len, payloads)) + 2)


def large_stream(n: int) -> Stream:
    block = bytes(range(256)) * 256  # 64 KiB
    payloads = [_len(1, block[: 65536 - 4]) for _ in range(n)]
    return Stream("large", [_envelope(0, p) for p in payloads], None, sum(map(len, payloads)))


def chunkings(s: Stream) -> dict[str, list[bytes]]:
    def fixed(size: int) -> list[bytes]:
        return [s.body[i : i + size] for i in range(0, len(s.body), size)]

    out = {"envelope": list(s.envelopes), "16k": fixed(16 * 1024), "64k": fixed(64 * 1024)}
    if s.name == "large":
        out["1k"] = fixed(1024)
    return out


def observer_run(s: Stream, chunks: list[bytes], fieldmap: FieldMap | None = None) -> tuple[int, int]:
    """(envelopes, payload bytes) the decoder returned; with ``fieldmap``, each payload also goes
    through ``FieldMap.extract``."""
    d = EnvelopeDecoder(CONNECT, s.encoding)
    n = size = 0
    extract = fieldmap.extract if fieldmap is not None else None
    for chunk in chunks:
        for item in d.feed(chunk):
            if item.__class__ is Envelope:
                n += 1
                size += len(item.payload)
                if extract is not None:
                    extract(item.payload)
    for item in d.close():
        if item.__class__ is Envelope:
            n += 1
            size += len(item.payload)
    return n, size


def baseline_split(s: Stream, chunks: list[bytes]) -> tuple[int, int]:
    """The least an envelope splitter does: join, then slice by the prefixes (gunzip if flagged)."""
    data = b"".join(chunks)
    pos = 0
    end = len(data)
    n = size = 0
    frombytes = int.from_bytes
    decompress = zlib.decompress
    while pos < end:
        flags = data[pos]
        length = frombytes(data[pos + 1 : pos + 5], "big")
        payload = data[pos + 5 : pos + 5 + length]
        if flags & 1:
            payload = decompress(payload, 31)
        pos += 5 + length
        n += 1
        size += len(payload)
    return n, size


def baseline_join(chunks: list[bytes]) -> int:
    """The plain bytes-join loop: every chunk appended once, the body joined."""
    parts = []
    append = parts.append
    for chunk in chunks:
        append(chunk)
    return len(b"".join(parts))


def best(fn: Callable[[], object], repeats: int) -> float:
    pc = time.perf_counter
    t_best = float("inf")
    for _ in range(repeats):
        t = pc()
        fn()
        t_best = min(t_best, pc() - t)
    return t_best


def alternate(a: Callable[[], object], b: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Best seconds of ``a`` and ``b``, run alternately ``repeats`` times each."""
    ta = tb = float("inf")
    pc = time.perf_counter
    for _ in range(repeats):
        t = pc()
        a()
        ta = min(ta, pc() - t)
        t = pc()
        b()
        tb = min(tb, pc() - t)
    return ta, tb


CURSOR_MAP = FieldMap({"1.1.1": ("text", "string"), "1.14.1": ("input_tokens", "uint64")})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="seconds-long run that only shows it works")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per figure (best is kept)")
    ap.add_argument("--json", metavar="PATH", help="write the report as JSON")
    args = ap.parse_args(argv)
    started = time.monotonic()
    report = Report("envelope", smoke=args.smoke)
    repeats = args.repeats or (1 if args.smoke else 5)
    scale = 10 if args.smoke else 1
    streams = [cursor_stream(20_000 // scale), windsurf_stream(5_000 // scale), large_stream(64 // scale)]
    failures: list[str] = []
    extra = []
    details: dict[str, list] = {"cases": []}
    for s in streams:
        want = (len(s.envelopes), s.payload_bytes)
        for cname, chunks in chunkings(s).items():
            name = f"{s.name}/{cname}"
            got = observer_run(s, chunks)
            if got != want or baseline_split(s, chunks) != want:
                failures.append(f"{name}: observer {got}, baseline {baseline_split(s, chunks)}, expected {want}")
                continue
            t_obs, t_base = alternate(
                lambda s=s, c=chunks: observer_run(s, c), lambda s=s, c=chunks: baseline_split(s, c), repeats
            )
            mb = len(s.body) / 1e6
            n = len(s.envelopes)
            fig = report.add(name, mb / t_obs, "MB/s", baseline=mb / t_base)
            fig.note = f"{n / t_obs:,.0f} vs {n / t_base:,.0f} envelopes/s"
            t_join = best(lambda c=chunks: baseline_join(c), repeats)
            extra.append((f"{name}: envelopes/s", n / t_obs, n / t_base, "env/s"))
            extra.append((f"{name}: join loop alone", mb / t_join, None, "MB/s"))
            details["cases"].append(
                {
                    "name": name,
                    "bytes": len(s.body),
                    "envelopes": n,
                    "chunks": len(chunks),
                    "observer_s": t_obs,
                    "split_baseline_s": t_base,
                    "join_baseline_s": t_join,
                }
            )
    s = streams[0]
    chunks = list(s.envelopes)
    t_map, t_dec = alternate(lambda: observer_run(s, chunks, CURSOR_MAP), lambda: observer_run(s, chunks), repeats)
    extra.append(
        ("cursor/envelope + FieldMap vs decoder alone", len(s.envelopes) / t_map, len(s.envelopes) / t_dec, "env/s")
    )
    report.details = details
    report.print_table()
    print()
    print(
        format_figures(
            "envelope: envelopes/s (baseline: the splitter), the join loop alone, the field map's cost",
            [Figure(n, v, u, baseline=b) for n, v, b, u in extra],
            smoke=args.smoke,
        )
    )
    for f in failures:
        print(f"FAILED: {f}")
    report.details["failures"] = failures
    report.details["extra"] = [{"name": n, "value": v, "baseline": b, "unit": u} for n, v, b, u in extra]
    return report.finish(started, args.json, not failures and bool(report.figures), table=False)


if __name__ == "__main__":
    sys.exit(main())
