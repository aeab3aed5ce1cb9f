"""The cost of the metrics (``observer.metrics``) against the capture path they ride on, in the
same run.

- **Per record**: ``ProxyMetrics.observe`` of the record that ``bench/core.py``'s
  ``ObserverSide`` assembles from a ``--events``-event token stream (openai.chat, usage, TTFT),
  with models spread over 50 label values; its µs per record ÷ the stream's events = µs per event.
- **Baseline**: the same stream's parse (``observer.tap.StreamObserver``: decoding, SSE,
  dialect, reassembly), one event per chunk, µs per event. This is only the observer's own share
  of the proxy's CPU (mitmproxy's forwarding costs several times more: docs/performance.md), so
  the ratio overstates the metrics' share of the proxy's CPU. Target: <= 2 %.
- **Snapshot**: one ``ProxyMetrics.snapshot()`` (the text the proxy writes every 5 s) with 200
  models x 7 dialects of series, as a share of one core at one snapshot per 5 s.

    .venv/bin/python bench/metrics.py [--smoke] [--events 300] [--json out.json]   # ~10 s
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report  # noqa: E402
from bench.core import ObserverSide, chunkings, make_stream  # noqa: E402
from observer.metrics import METRICS_INTERVAL_S, ProxyMetrics  # noqa: E402

TARGET_SHARE = 0.02


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--events", type=int, default=300, help="events per stream (a typical LLM answer)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    started = time.monotonic()
    report = Report("metrics", smoke=args.smoke)
    repeats, records = (2, 2000) if args.smoke else (7, 20000)

    stream = make_stream("openai.chat", "tokens", events=args.events, line_bytes=0, tool_bytes=0)
    assert stream is not None
    side = ObserverSide(stream)
    chunks = chunkings(stream)["event"]
    record = side.run(chunks)
    assert record.usage.reported and record.ttft_s is not None, "the bench record needs usage and TTFT"
    parse_s = best_of(lambda: side.run(chunks), repeats)
    parse_us_per_event = parse_s / len(chunks) * 1e6

    metrics = ProxyMetrics(pipeline=lambda: {})
    models = [f"model-{n}" for n in range(50)]

    def observe_all() -> None:
        for n in range(records):
            record.model = models[n % 50]
            metrics.observe(record)

    observe_s = best_of(observe_all, repeats)
    observe_us_per_record = observe_s / records * 1e6
    observe_us_per_event = observe_us_per_record / len(chunks)
    report.add(
        "observe per event (amortised over the stream)",
        observe_us_per_event,
        "µs",
        baseline=parse_us_per_event,
        target=f"<= {TARGET_SHARE:.0%} of the parse",
        met=observe_us_per_event <= TARGET_SHARE * parse_us_per_event,
        note=f"{observe_us_per_record:.1f} µs per record, {len(chunks)} events; parse {parse_us_per_event:.2f} µs/event",
    )

    for label, dialects, n_models, outcomes in (
        ("typical: 20 models x 3 dialects", 3, 20, 2),
        ("worst: every label at its cap", 7, 100, 7),
    ):
        full = ProxyMetrics(pipeline=lambda: {"records_journaled": 1, "spool_bytes": 1})
        for d in range(dialects):
            for m in range(n_models):
                for o in (
                    "completed",
                    "error",
                    "truncated",
                    "http_error",
                    "client_aborted",
                    "unreadable",
                    "interrupted",
                )[:outcomes]:
                    record.dialect, record.model, record.outcome = f"dialect-{d}", f"model-{m}", o
                    record.host = f"host-{m}.example"
                    full.observe(record)
        snapshot_s = best_of(full.snapshot, repeats)
        report.add(
            f"snapshot ({label}), share of one core",
            snapshot_s / METRICS_INTERVAL_S * 100,
            "%",
            target="reported",
            note=f"{snapshot_s * 1e3:.1f} ms per snapshot, {len(full.snapshot())} bytes, every {METRICS_INTERVAL_S:.0f} s",
        )
    return report.finish(started, args.json, ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
