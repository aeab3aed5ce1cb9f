"""Single-stream latency added by the audit addon, against the same proxy without it.

Starts, all on 127.0.0.1 (``bench/_procs.py``):

- the local streaming upstream (``tests/e2e/upstream.py`` as a subprocess);
- ``mitmdump -q -s bench/passthrough_addon.py`` (baseline: the proxy streaming, recording nothing);
- ``mitmdump -q -s addons/llm_audit.py --set observer_db=sqlite:///<tmp>/bench.db`` (the product).

Then, one stream at a time, alternating between configurations (direct, baseline, addon; the
order rotates every round), over HTTP/1.1, HTTP/1.1 in CONNECT+TLS and HTTP/2 in CONNECT+TLS,
it requests ``/v1/stream?script=long&stamp=all`` (``--events`` deltas of ~300 bytes,
``--gap-ms`` apart; every event carries ``"x-bench:sent": time.time()`` taken just before the
upstream writes it) with ``Content-Type: application/llm-request+json``, so the addon does its
full work (SSE framing, JSON, reassembly, DB write). Each stream uses a fresh connection.

Figures (ms; all from ``time.time()`` on the same host):

- per-event latency = client read time of the event - ``x-bench:sent``: p50 / p99 over all
  events of all streams;
- TTFB = first body byte - start of the connection (CONNECT and TLS included), median of streams;
- end of stream = the client's end-of-body time (HTTP/1.1 last chunk, HTTP/2 END_STREAM) -
  the upstream's ``time.time()`` just before it wrote that end (``/v1/bench/exchange``),
  median of streams;
- promptness of the last content delta, the ``usage`` event and ``stream.end`` (median of
  streams): nothing may be held back at the end.

Each figure is printed with the baseline's and the target (addon - baseline). ``--smoke`` runs
a few seconds' worth.

    .venv/bin/python bench/latency.py            # full size (< 60 s)
    .venv/bin/python bench/latency.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report, tree_cpu_seconds  # noqa: E402
from bench._procs import (  # noqa: E402
    TRANSPORTS,
    SSEResult,
    Upstream,
    fetch_sse,
    llm_request,
    pct,
    start_proxies,
    stop_all,
    upstream_target,
    upstream_times,
)

# Targets (addon - baseline), ms.
P50_MAX_MS = 0.3
P99_MAX_MS = 1.0
END_MAX_MS = 1.0
PROMPT_MAX_MS = 1.0


@dataclass
class ConfigResult:
    """All measured streams of one (transport, configuration)."""

    name: str
    latencies_ms: list[float] = field(default_factory=list)
    ttfb_ms: list[float] = field(default_factory=list)
    end_ms: list[float] = field(default_factory=list)
    last_delta_ms: list[float] = field(default_factory=list)
    usage_ms: list[float] = field(default_factory=list)
    stream_end_ms: list[float] = field(default_factory=list)
    events: int = 0
    streams: int = 0
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    cpu_known: bool = False

    def add(self, r: SSEResult, times: dict[str, Any]) -> None:
        """Folds one stream in (``times``: the upstream's send log of it)."""
        self.streams += 1
        self.events += r.events
        self.latencies_ms.extend(r.latencies_ms())
        if r.t_first_byte is not None:
            self.ttfb_ms.append((r.t_first_byte - r.t_start) * 1000.0)
        end_wall = times.get("end_wall")
        if r.t_end is not None and end_wall:
            self.end_ms.append((r.t_end - end_wall) * 1000.0)
        for lst, etype in (
            (self.last_delta_ms, b"content.delta"),
            (self.usage_ms, b"usage"),
            (self.stream_end_ms, b"stream.end"),
        ):
            v = r.latency_of(etype)
            if v is not None:
                lst.append(v)

    def summary(self) -> dict[str, float]:
        """p50/p90/p99/max/mean of event latency and medians of the per-stream figures (ms)."""
        s = self.latencies_ms
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        return {
            "n": len(s),
            "p50": pct(s, 0.50),
            "p90": pct(s, 0.90),
            "p99": pct(s, 0.99),
            "max": max(s) if s else float("nan"),
            "mean": statistics.fmean(s) if s else float("nan"),
            "ttfb": med(self.ttfb_ms),
            "end": med(self.end_ms),
            "last_delta": med(self.last_delta_ms),
            "usage": med(self.usage_ms),
            "stream_end": med(self.stream_end_ms),
            "cpu_us_per_event": (self.cpu_s / self.events * 1e6) if self.cpu_known and self.events else float("nan"),
        }


def describe_db(path: Path) -> str:
    """Size and row counts of the addon's SQLite file (a sanity check that it recorded)."""
    if not path.exists():
        return "no DB file was created"
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = [r[0] for r in con.execute("select name from sqlite_master where type='table' order by name")]
            parts = [f"{n}={con.execute(f'select count(*) from "{n}"').fetchone()[0]}" for n in names]
            return f"{path.stat().st_size} bytes; rows per table: " + (", ".join(parts) or "(no tables)")
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"unreadable: {e}"


async def measure(
    args: argparse.Namespace, transports: list[str], work: Path, notes: list[str], t_start: float
) -> tuple[dict[tuple[str, str], ConfigResult], list[str], Path]:
    deadline = t_start + args.max_seconds
    stream_timeout = 10.0 + args.events * args.gap_ms / 1000.0 * 2
    db_path = work / "bench.db"
    with Upstream(work) as up:
        procs = start_proxies(
            ("baseline", "addon"),
            work,
            db_path=db_path,
            addon=args.addon,
            addon_sets=dict(kv.split("=", 1) for kv in args.set),
        )
        try:
            configs = ["direct", "baseline", "addon"]
            results = {(t, c): ConfigResult(c) for t in transports for c in configs}
            targets = {c: upstream_target(up, procs.get(c)) for c in configs}
            body = llm_request(args.events)
            # Warm-up (not measured): imports, leaf-certificate minting, the DB file.
            for t in transports:
                for c in configs:
                    await fetch_sse(targets[c], t, "/v1/stream?script=long&n=5&gap_ms=2", body, timeout=20)
            print(
                f"# {len(transports)} transport(s) x {len(configs)} configs x {args.streams} streams x "
                f"{args.events} events, {args.gap_ms:g} ms apart; one stream at a time",
                flush=True,
            )
            seq = 0
            for rnd in range(args.streams):
                order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
                for t in transports:
                    for c in order:
                        if time.monotonic() + args.events * args.gap_ms / 1000.0 > deadline:
                            notes.append(f"stopped early at --max-seconds={args.max_seconds:g}")
                            return results, configs, db_path
                        seq += 1
                        tid = f"lat-{seq}"
                        path = f"/v1/stream?script=long&stamp=all&n={args.events}&gap_ms={args.gap_ms:g}&tid={tid}"
                        pid = procs[c].proc.pid if c in procs and procs[c].proc else None
                        cpu0 = tree_cpu_seconds(pid) if pid else None
                        r = await fetch_sse(targets[c], t, path, body, timeout=stream_timeout)
                        cpu1 = tree_cpu_seconds(pid) if pid else None
                        res = results[(t, c)]
                        res.add(r, upstream_times(up, tid))
                        if cpu0 is not None and cpu1 is not None:
                            res.cpu_s += cpu1 - cpu0
                            res.cpu_known = True
                        if r.error or r.events != args.events + 4:
                            res.errors.append(f"round {rnd}: {r.error or ''} events={r.events}/{args.events + 4}")
                print(f"  round {rnd + 1}/{args.streams} done ({time.monotonic() - t_start:.0f} s)", flush=True)
            return results, configs, db_path
        finally:
            stop_all(procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Single-stream latency added by the audit addon vs the same proxy without it."
    )
    ap.add_argument("--streams", type=int, default=3, help="measured streams per configuration and transport")
    ap.add_argument("--events", type=int, default=120, help="content deltas per stream")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="upstream gap between events (ms)")
    ap.add_argument("--transports", default=",".join(TRANSPORTS), help="comma list of " + ", ".join(TRANSPORTS))
    ap.add_argument("--addon", default="addons/llm_audit.py", help="the addon under test (relative to the repo)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="an option of the addon under test, e.g. observer_worker=false (repeatable)",
    )
    ap.add_argument("--max-seconds", type=float, default=90.0, help="stop starting new streams after this")
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 1 stream x 30 events x 5 ms per config")
    ap.add_argument("--json", dest="json_out", help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.streams, args.events, args.gap_ms = 1, 30, 5.0
        args.max_seconds = min(args.max_seconds, 60.0)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    for t in transports:
        if t not in TRANSPORTS:
            ap.error(f"unknown transport {t!r}")
    if not (REPO / args.addon).exists():
        print(f"{args.addon} does not exist", file=sys.stderr)
        return 1

    t_start = time.monotonic()
    report = Report("latency", smoke=args.smoke)
    report.details["title"] = "single stream at a time, addon vs baseline"
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        try:
            results, configs, db_path = asyncio.run(measure(args, transports, Path(tmp), notes, t_start))
        except RuntimeError as e:
            print(f"could not measure: {e}", file=sys.stderr)
            return 1
        db_info = describe_db(db_path)

    # ---- raw table
    print()
    hdr = (
        f"{'transport':9} {'config':8} {'events':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'max':>7} {'TTFB':>7} "
        f"{'EoS':>6} {'lastΔ':>6} {'usage':>6} {'s.end':>6} {'CPU µs/ev':>9}   (ms)"
    )
    print(hdr)
    for t in transports:
        for c in configs:
            s = results[(t, c)].summary()
            print(
                f"{t:9} {c:8} {s['n']:6d} {s['p50']:7.2f} {s['p90']:7.2f} {s['p99']:7.2f} {s['max']:7.2f} "
                f"{s['ttfb']:7.1f} {s['end']:6.2f} {s['last_delta']:6.2f} {s['usage']:6.2f} {s['stream_end']:6.2f} "
                f"{s['cpu_us_per_event']:9.0f}"
            )
            report.details[f"{t}/{c}"] = {**s, "streams": results[(t, c)].streams, "errors": results[(t, c)].errors}
    print()
    # ---- figures: addon vs baseline
    for t in transports:
        a, b = results[(t, "addon")].summary(), results[(t, "baseline")].summary()
        for key, label, bound in (
            ("p50", "event latency p50", P50_MAX_MS),
            ("p99", "event latency p99", P99_MAX_MS),
            ("end", "end of stream (median)", END_MAX_MS),
            ("last_delta", "last delta latency (median)", PROMPT_MAX_MS),
            ("usage", "usage event latency (median)", PROMPT_MAX_MS),
            ("stream_end", "stream.end latency (median)", PROMPT_MAX_MS),
        ):
            report.add(f"{t} {label}", a[key], "ms", b[key], f"<= +{bound:g} ms", a[key] - b[key] <= bound)
        report.add(f"{t} TTFB (median)", a["ttfb"], "ms", b["ttfb"], "", None, "fresh connection (CONNECT+TLS incl.)")
        report.add(
            f"{t} proxy CPU per event",
            a["cpu_us_per_event"],
            "µs",
            b["cpu_us_per_event"],
            "",
            None,
            "single stream, coarse (10 ms ticks)",
        )
    report.print_table()
    print("baseline vs direct (the proxy's own cost):")
    for t in transports:
        d, b = results[(t, "direct")].summary(), results[(t, "baseline")].summary()
        print(
            f"  {t:9} p50 {b['p50'] - d['p50']:+.2f} ms, p99 {b['p99'] - d['p99']:+.2f} ms, "
            f"end of stream {b['end'] - d['end']:+.2f} ms"
        )
    print(f"addon DB: {db_info}")
    report.details["addon_db"] = db_info
    report.details["params"] = vars(args)
    errors = [(k, r.errors) for k, r in results.items() if r.errors]
    for k, e in errors:
        print(f"WARNING {k[0]}/{k[1]}: {e}")
    for n in notes:
        print(f"NOTE: {n}")
    report.details["notes"] = notes
    return report.finish(t_start, args.json_out, not errors, table=False)


if __name__ == "__main__":
    sys.exit(main())
