"""Bulk throughput: one large SSE stream without gaps through each proxy, the audit addon
against the same proxy without it.

The upstream's ``/v1/bulk`` sends ``--mb`` MB of a draft-standard stream (stream.start, content
deltas of ~300 bytes, content.stop, usage, stream.end) as fast as the connection takes it, one
event per HTTP/1.1 chunk / HTTP/2 DATA frame, many of them per socket write; the request is
``application/llm-request+json``, so the addon parses and records the whole stream. Both
proxies (``bench/_procs.py``: baseline = ``mitmdump`` with ``bench/passthrough_addon.py``,
``stream = True`` only; addon = ``addons/llm_audit.py`` with a SQLite store) are started once
and measured one at a time, alternating, after a short warm-up stream each.

Figures per transport: client MB/s (body bytes / (end of body - start of the request); MB =
10^6 bytes) with target observer >= 0.9x baseline, and the proxy's CPU per event (µs; CPU seconds from
``/proc`` over the stream, 0.3 s settle included, ÷ events): of the proxy's process tree (with
the audit worker, ``observer.worker``) and of the mitmdump process alone (its event loop, which
forwards every byte, and the store's writer thread). Client, upstream and proxy share the
machine's cores, so MB/s is a system figure; CPU/event is the proxy's.

    .venv/bin/python bench/bulk.py            # full size (< 30 s)
    .venv/bin/python bench/bulk.py --tunnelled --transports h1-tls,h2-tls   # TLS to a non-LLM host
    .venv/bin/python bench/bulk.py --smoke    # seconds
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report, cpu_seconds, tree_cpu_seconds  # noqa: E402
from bench._procs import (  # noqa: E402
    TRANSPORTS,
    Upstream,
    fetch_sse,
    llm_request,
    start_proxies,
    stop_all,
    upstream_target,
)

MBPS_MIN_RATIO = 0.9
SETTLE_S = 0.3


async def measure(args: argparse.Namespace, transports: list[str], work: Path, t_start: float) -> dict:
    out: dict[tuple[str, str], list[dict[str, float]]] = {}
    nbytes = int(args.mb * 1e6)
    body = llm_request(1)
    with Upstream(work) as up:
        procs = start_proxies(
            ("baseline", "addon"),
            work,
            db_path=work / "bench.db",
            addon=args.addon,
            addon_sets=dict(kv.split("=", 1) for kv in args.set)
            | ({"observer_llm_hosts_extra": ""} if args.tunnelled else {}),
        )
        try:
            targets = {k: upstream_target(up, p) for k, p in procs.items()}
            if args.tunnelled:  # the addon's proxy does not intercept: the client checks the upstream's own certificate
                targets["addon"] = dataclasses.replace(targets["addon"], proxy_ca=up.ca_cert)
            for t in transports:
                for k in procs:  # warm-up: connection, certificates, the DB file
                    await fetch_sse(targets[k], t, "/v1/bulk?bytes=200000", body, timeout=30, keep_events=False)
            for rnd in range(args.rounds):
                for ti, t in enumerate(transports):
                    order = ["baseline", "addon"] if (rnd + ti) % 2 == 0 else ["addon", "baseline"]
                    for k in order:
                        pid = procs[k].proc.pid  # type: ignore[union-attr]
                        cpu0, own0 = tree_cpu_seconds(pid), cpu_seconds(pid)
                        r = await fetch_sse(
                            targets[k], t, f"/v1/bulk?bytes={nbytes}", body, timeout=args.timeout, keep_events=False
                        )
                        await asyncio.sleep(SETTLE_S)
                        cpu1, own1 = tree_cpu_seconds(pid), cpu_seconds(pid)
                        if r.error or r.t_end is None:
                            raise RuntimeError(f"{t}/{k}: bulk stream failed: {r.error}")
                        secs = r.t_end - r.t_start
                        row = {
                            "mb_s": r.body_bytes / secs / 1e6,
                            "seconds": secs,
                            "events": r.events,
                            "cpu_us_per_event": (cpu1 - cpu0) / r.events * 1e6,
                            "bytes": r.body_bytes,
                            "own_cpu_us_per_event": (own1 - own0) / r.events * 1e6,
                        }
                        out.setdefault((t, k), []).append(row)
                        print(
                            f"  round {rnd + 1} {t:6} {k:8} {row['mb_s']:6.2f} MB/s  {row['cpu_us_per_event']:5.1f} µs/ev "
                            f"(mitmdump alone {row['own_cpu_us_per_event']:4.1f}; {r.events} events, {secs:.1f} s; "
                            f"{time.monotonic() - t_start:.0f} s)",
                            flush=True,
                        )
        finally:
            stop_all(procs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Bulk SSE throughput through the proxy, addon vs baseline.")
    ap.add_argument("--mb", type=float, default=20.0, help="stream size in MB (10^6 bytes)")
    ap.add_argument("--rounds", type=int, default=3, help="streams per proxy and transport (alternating order)")
    ap.add_argument("--transports", default="h1,h2-tls", help="comma list of " + ", ".join(TRANSPORTS))
    ap.add_argument("--addon", default="addons/llm_audit.py", help="the addon under test (relative to the repo)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="an option of the addon under test, e.g. observer_tap_batch_ms=0 (repeatable)",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="bound of one stream (s)")
    ap.add_argument("--smoke", action="store_true", help="seconds: 1 MB, h1")
    ap.add_argument(
        "--tunnelled",
        action="store_true",
        help="the upstream is not an LLM host for the addon: its TLS is tunnelled, not intercepted (the baseline"
        " mitmdump still intercepts); use with TLS transports",
    )
    ap.add_argument("--json", dest="json_out", help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.mb, args.rounds, args.transports = 1.0, 1, "h1"
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    for t in transports:
        if t not in TRANSPORTS:
            ap.error(f"unknown transport {t!r}")
    t_start = time.monotonic()
    report = Report("bulk", smoke=args.smoke)
    report.details["title"] = f"one {args.mb:g} MB SSE stream, ~300 B events, no gaps; mean of {args.rounds} round(s)"
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp:
        try:
            res = asyncio.run(measure(args, transports, Path(tmp), t_start))
        except RuntimeError as e:
            print(f"could not measure: {e}", file=sys.stderr)
            return 1
    print()
    for t in transports:
        a, b = res[(t, "addon")], res[(t, "baseline")]
        am, bm = statistics.mean(r["mb_s"] for r in a), statistics.mean(r["mb_s"] for r in b)
        ac, bc = statistics.mean(r["cpu_us_per_event"] for r in a), statistics.mean(r["cpu_us_per_event"] for r in b)
        report.add(f"{t} client throughput", am, "MB/s", bm, f">= {MBPS_MIN_RATIO:g}x", am >= MBPS_MIN_RATIO * bm)
        ao, bo = (statistics.mean(r["own_cpu_us_per_event"] for r in rows) for rows in (a, b))
        report.add(f"{t} proxy CPU per event", ac, "µs", bc, "", None)
        report.add(f"{t} mitmdump alone, per event", ao, "µs", bo, "", None)
        report.details[f"{t}/addon"], report.details[f"{t}/baseline"] = a, b
    report.print_table()
    report.details["params"] = vars(args)
    return report.finish(t_start, args.json_out, True, table=False)


if __name__ == "__main__":
    sys.exit(main())
