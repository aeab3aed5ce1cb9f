"""Many concurrent token streams through the proxy: latency and proxy CPU per event, the audit
addon against the same proxy without it.

Starts the upstream and the two proxies of ``bench/_procs.py`` (baseline = ``mitmdump`` with
``bench/passthrough_addon.py``, streaming on and nothing else; addon = ``mitmdump -s
addons/llm_audit.py`` with a SQLite store). Per transport (``h1``, ``h1-tls``, ``h2-tls``) and
round it runs the load once through each proxy, **one proxy at a time**, the order alternating
between rounds and transports: ``--streams`` (100) concurrent streams of ``--events`` (300)
~300-byte events ``--gap-ms`` (20 ms = 50 events/s) apart, the starts spread evenly over
``--spread-s`` (1 s), each on its own connection, from one raw-asyncio client
(``bench/_procs.fetch_sse``: httpx would cost the shared 2 cores several times more).

Figures per transport (addon vs baseline):

- event latency p50 / p99 over all events of all streams (ms; client read time -
  ``x-bench:sent``, the upstream's ``time.time()`` just before the write);
- the same p99 for the steady state only (events sent more than 1 s after the last stream
  started): the p99 over all events is dominated by the ramp-up, when 100 connections (TLS:
  2 x 100 handshakes on the proxy) are set up within a second;
- proxy CPU per event: the proxy process's CPU seconds (user+system, all threads, from
  ``/proc/<pid>/stat``) from just before the first stream starts until 0.3 s after the last one
  ended (so the addon's DB writer thread is counted), divided by the events delivered (µs).

Two rounds by default: with one, each transport's order is fixed (which proxy runs first) and
the p99 of a proxy is one run's, which varied from 4 to 108 ms between runs of the same proxy on
the 2-core reference machine (a ~100 ms garbage-collection pass or a slow ramp-up in one run sets
it). Two rounds put each proxy first once per transport and pool two runs, for ~50 s more; the
p99 of each run is kept in the report (``run_p99_ms``, and the p99 figure's note).

Both proxies are warmed the same way (a few short streams per transport: leaf certificates,
imports, the DB file) before anything is measured.

``--variant LABEL[@ADDON][:OPTION=VALUE,...]`` (repeatable) adds another addon proxy (``ADDON``,
default ``--addon``, with ``--set`` and these options on top) measured in the same rounds, one
at a time with the others, the order rotating: A/B comparisons of addon versions or options
against the same baseline runs. Its figures carry no target.

    .venv/bin/python bench/load.py            # full size, 2 rounds (< 2 min)
    .venv/bin/python bench/load.py --smoke    # seconds
    .venv/bin/python bench/load.py --transports h1-tls,h2-tls --variant unsliced:observer_tap_slice_us=0
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report, cpu_seconds, tree_cpu_seconds  # noqa: E402
from bench._procs import (  # noqa: E402
    TRANSPORTS,
    Upstream,
    fetch_sse,
    llm_request,
    pct,
    run_concurrent,
    start_proxies,
    start_proxy,
    stop_all,
    upstream_target,
)

P50_MAX_MS = 1.0
P99_MAX_MS = 5.0
CPU_MAX_RATIO = 1.15
SETTLE_S = 0.3
RAMP_EXTRA_S = 1.0  # "steady state" = events sent this long after the last stream started


@dataclass
class LoadResult:
    """Accumulated runs of one (transport, proxy): event latencies (ms), events delivered,
    proxy CPU seconds over the measured windows, wall seconds of the windows, failures."""

    latencies_ms: list[float] = field(default_factory=list)
    steady_ms: list[float] = field(default_factory=list)  # events sent after the ramp-up (all streams started + 1 s)
    events: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    runs: int = 0
    errors: list[str] = field(default_factory=list)
    others_cpu_s: float = 0.0  # upstream + this client over the same windows
    loadavg: list[float] = field(default_factory=list)  # 1-min load average at each run's start
    run_p99_ms: list[float] = field(default_factory=list)  # each run's own p99 (ms): the spread behind the pooled one

    def merge(self, other: LoadResult) -> None:
        """Adds the runs of ``other`` to this one."""
        self.latencies_ms += other.latencies_ms
        self.steady_ms += other.steady_ms
        self.events += other.events
        self.cpu_s += other.cpu_s
        self.wall_s += other.wall_s
        self.runs += other.runs
        self.errors += other.errors
        self.others_cpu_s += other.others_cpu_s
        self.loadavg += other.loadavg
        self.run_p99_ms += other.run_p99_ms

    def summary(self) -> dict[str, float]:
        """p50/p99/max latency (ms), CPU µs per event, mean proxy CPU share (1.0 = one core)."""
        s = self.latencies_ms
        return {
            "events": self.events,
            "p50": pct(s, 0.5),
            "p99": pct(s, 0.99),
            "max": max(s) if s else float("nan"),
            "steady_p50": pct(self.steady_ms, 0.5),
            "steady_p99": pct(self.steady_ms, 0.99),
            "cpu_us_per_event": self.cpu_s / self.events * 1e6 if self.events else float("nan"),
            "cpu_share": self.cpu_s / self.wall_s if self.wall_s else float("nan"),
            "upstream_client_cpu_share": self.others_cpu_s / self.wall_s if self.wall_s else float("nan"),
            "loadavg_1m": max(self.loadavg) if self.loadavg else float("nan"),
        }


def _spread(r: LoadResult) -> str:
    """The per-run p99s of ``r`` as ``min-max ms``."""
    v = [x for x in r.run_p99_ms if math.isfinite(x)]
    return f"{min(v):.1f}-{max(v):.1f} ms" if v else "-"


def _loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


async def one_run(
    target: Any,
    pid: int | None,
    transport: str,
    args: argparse.Namespace,
    res: LoadResult,
    others: tuple[int, ...] = (),
) -> None:
    """One load run through one proxy (``pid``; ``None`` = direct), folded into ``res``; ``others``
    are the pids whose CPU is summed into ``others_cpu_s`` (upstream, this client)."""
    path = f"/v1/stream?script=long&n={args.events}&gap_ms={args.gap_ms:g}"
    timeout = 30.0 + args.spread_s + args.events * args.gap_ms / 1000.0 * 3
    body = llm_request(args.events)
    res.loadavg.append(_loadavg())
    o0 = sum(cpu_seconds(p) for p in others)
    cpu0, t0 = (tree_cpu_seconds(pid) if pid else 0.0), time.monotonic()
    steady_from = time.time() + args.spread_s + RAMP_EXTRA_S
    results = await run_concurrent(
        target, transport, [path] * args.streams, body, spread_s=args.spread_s, timeout=timeout
    )
    await asyncio.sleep(SETTLE_S)
    cpu1, t1 = (tree_cpu_seconds(pid) if pid else 0.0), time.monotonic()
    res.others_cpu_s += sum(cpu_seconds(p) for p in others) - o0
    res.runs += 1
    res.cpu_s += cpu1 - cpu0
    res.wall_s += t1 - t0
    for i, r in enumerate(results):
        res.events += r.events
        res.latencies_ms.extend(r.latencies_ms())
        res.steady_ms.extend(
            (a - s) * 1000.0 for s, a in zip(r.sent, r.arrived, strict=True) if s is not None and s >= steady_from
        )
        if r.error or r.events != args.events + 4:
            res.errors.append(f"stream {i}: {r.error or ''} events={r.events}/{args.events + 4}")
    res.run_p99_ms.append(pct(res.latencies_ms, 0.99))


def parse_variant(spec: str, addon: str, sets: dict[str, str]) -> tuple[str, str, dict[str, str]]:
    """``LABEL[@ADDON][:OPTION=VALUE,...]`` -> (label, addon, options over ``sets``)."""
    head, _, opts = spec.partition(":")
    label, _, path = head.partition("@")
    label = label.strip()
    if not label or label in ("baseline", "addon", "direct"):
        raise ValueError(f"variant {spec!r}: a label other than baseline/addon/direct is needed")
    extra = {}
    for kv in filter(None, (o.strip() for o in opts.split(","))):
        k, eq, v = kv.partition("=")
        if not eq:
            raise ValueError(f"variant {spec!r}: {kv!r} is not OPTION=VALUE")
        extra[k.strip()] = v.strip()
    return label, path.strip() or addon, {**sets, **extra}


async def measure(
    args: argparse.Namespace, transports: list[str], work: Path, t_start: float
) -> dict[tuple[str, str], LoadResult]:
    with Upstream(work) as up:
        sets = dict(kv.split("=", 1) for kv in args.set)
        procs = start_proxies(("baseline", "addon"), work, db_path=work / "bench.db", addon=args.addon, addon_sets=sets)
        try:
            for i, (label, addon, vsets) in enumerate(parse_variant(v, args.addon, sets) for v in args.variant):
                procs[label] = start_proxy(
                    "addon",
                    work / f"variant-{i}",
                    db_path=work / f"bench-variant-{i}.db",
                    addon=addon,
                    addon_sets=vsets,
                )
            targets = {k: upstream_target(up, p) for k, p in procs.items()}
            pids: dict[str, int | None] = {k: p.proc.pid for k, p in procs.items() if p.proc is not None}
            kinds = list(procs)
            if args.direct:  # the same load without a proxy: what the machine itself adds
                targets["direct"], pids["direct"] = upstream_target(up), None
                kinds.append("direct")
            others = (up.pid, os.getpid()) if up.pid else (os.getpid(),)
            body = llm_request(5)
            for t in transports:  # warm-up, the same for both proxies
                for k in procs:
                    await asyncio.gather(
                        *(
                            fetch_sse(targets[k], t, "/v1/stream?script=long&n=5&gap_ms=5", body, timeout=20)
                            for _ in range(4)
                        )
                    )
            results = {(t, k): LoadResult() for t in transports for k in kinds}
            print(
                f"# {len(transports)} transport(s) x {args.rounds} round(s) x {len(procs)} proxies, one at a time: "
                f"{args.streams} streams x {args.events} events, {args.gap_ms:g} ms apart, "
                f"starts over {args.spread_s:g} s",
                flush=True,
            )
            for rnd in range(args.rounds):
                for ti, t in enumerate(transports):
                    k0 = (rnd + ti) % len(procs)  # rotating (two proxies: alternating)
                    order = list(procs)[k0:] + list(procs)[:k0]
                    if args.direct:
                        order.append("direct")
                    for k in order:
                        run = LoadResult()
                        await one_run(targets[k], pids[k], t, args, run, others)
                        results[(t, k)].merge(run)
                        s = run.summary()  # this run alone
                        print(
                            f"  round {rnd + 1} {t:6} {k:8} p50 {s['p50']:.2f} ms p99 {s['p99']:.2f} ms "
                            f"CPU {s['cpu_us_per_event']:.0f} µs/ev; proxy {s['cpu_share']:.0%}, upstream+client "
                            f"{s['upstream_client_cpu_share']:.0%} of a core; load avg {s['loadavg_1m']:.1f} "
                            f"({time.monotonic() - t_start:.0f} s)",
                            flush=True,
                        )
            return results
        finally:
            stop_all(procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Concurrent token streams: latency and proxy CPU/event, addon vs baseline."
    )
    ap.add_argument("--streams", type=int, default=100, help="concurrent streams per run")
    ap.add_argument("--events", type=int, default=300, help="content deltas per stream")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="upstream gap between events (ms)")
    ap.add_argument("--spread-s", type=float, default=1.0, help="stream starts spread over this many seconds")
    ap.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs per proxy and transport (order alternating; default 2: see the module docstring)",
    )
    ap.add_argument("--transports", default=",".join(TRANSPORTS), help="comma list of " + ", ".join(TRANSPORTS))
    ap.add_argument("--addon", default="addons/llm_audit.py", help="the addon under test (relative to the repo)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="OPTION=VALUE",
        help="an option of the addon under test, e.g. observer_tap_batch_ms=0 (repeatable)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL[@ADDON][:OPTION=VALUE,...]",
        help="another addon proxy measured in the same rounds, e.g. unsliced:observer_tap_slice_us=0 "
        "or old@bench/old_addon.py, a path relative to the repo (repeatable; figures without target)",
    )
    ap.add_argument(
        "--direct", action="store_true", help="also run the load without a proxy (context; +1 run per transport)"
    )
    ap.add_argument("--smoke", action="store_true", help="seconds: 10 streams x 20 events x 10 ms")
    ap.add_argument("--json", dest="json_out", help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.streams, args.events, args.gap_ms, args.spread_s, args.rounds = 10, 20, 10.0, 0.1, 1
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    for t in transports:
        if t not in TRANSPORTS:
            ap.error(f"unknown transport {t!r}")
    try:
        labels = [parse_variant(v, args.addon, {})[0] for v in args.variant]
    except ValueError as e:
        ap.error(str(e))
    if len(set(labels)) != len(labels):
        ap.error("variant labels must differ")

    t_start = time.monotonic()
    report = Report("load", smoke=args.smoke)
    report.details["title"] = (
        f"{args.streams} concurrent streams x {args.events} events at {1000 / args.gap_ms:g}/s each"
    )
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        try:
            results = asyncio.run(measure(args, transports, Path(tmp), t_start))
        except RuntimeError as e:
            print(f"could not measure: {e}", file=sys.stderr)
            return 1
    print()
    for t in transports:
        a, b = results[(t, "addon")].summary(), results[(t, "baseline")].summary()
        report.add(
            f"{t} event latency p50",
            a["p50"],
            "ms",
            b["p50"],
            f"<= +{P50_MAX_MS:g} ms",
            a["p50"] - b["p50"] <= P50_MAX_MS,
        )
        spread = (
            f"p99 of each run: addon {_spread(results[(t, 'addon')])}, baseline {_spread(results[(t, 'baseline')])}"
        )
        report.add(
            f"{t} event latency p99",
            a["p99"],
            "ms",
            b["p99"],
            f"<= +{P99_MAX_MS:g} ms",
            a["p99"] - b["p99"] <= P99_MAX_MS,
            spread,
        )
        if math.isfinite(a["steady_p99"]) and math.isfinite(b["steady_p99"]):  # (none at smoke size)
            report.add(
                f"{t} p99 steady state",
                a["steady_p99"],
                "ms",
                b["steady_p99"],
                "",
                None,
                f"events sent > {RAMP_EXTRA_S:g} s after the last stream started (no connection set-up)",
            )
        report.add(
            f"{t} proxy CPU per event",
            a["cpu_us_per_event"],
            "µs",
            b["cpu_us_per_event"],
            f"<= {CPU_MAX_RATIO:g}x",
            a["cpu_us_per_event"] <= CPU_MAX_RATIO * b["cpu_us_per_event"],
            f"proxy CPU {a['cpu_share']:.0%} vs {b['cpu_share']:.0%} of a core",
        )
        for label in labels:
            v = results[(t, label)].summary()
            report.add(f"{t} [{label}] event latency p50", v["p50"], "ms", b["p50"], "", None, "variant")
            report.add(f"{t} [{label}] event latency p99", v["p99"], "ms", b["p99"], "", None, "variant")
            if math.isfinite(v["steady_p99"]) and math.isfinite(b["steady_p99"]):
                report.add(
                    f"{t} [{label}] p99 steady state", v["steady_p99"], "ms", b["steady_p99"], "", None, "variant"
                )
            report.add(
                f"{t} [{label}] proxy CPU per event",
                v["cpu_us_per_event"],
                "µs",
                b["cpu_us_per_event"],
                "",
                None,
                f"variant; proxy CPU {v['cpu_share']:.0%} of a core",
            )
        if (t, "direct") in results:
            d = results[(t, "direct")].summary()
            report.details[f"{t}/baseline-minus-direct"] = {"p50": b["p50"] - d["p50"], "p99": b["p99"] - d["p99"]}
        for k in ("baseline", "addon", *labels, "direct"):
            r = results.get((t, k))
            if r is None:
                continue
            report.details[f"{t}/{k}"] = {
                **r.summary(),
                "runs": r.runs,
                "run_p99_ms": r.run_p99_ms,
                "errors": r.errors[:20],
            }
    report.print_table()
    errors = [(k, r.errors) for k, r in results.items() if r.errors]
    for k, e in errors:
        print(f"WARNING {k[0]}/{k[1]}: {len(e)} failed stream(s), e.g. {e[:3]}")
    report.details["params"] = vars(args)
    return report.finish(t_start, args.json_out, not errors, table=False)


if __name__ == "__main__":
    sys.exit(main())
