"""Memory of the observer proxy with ~1,000 concurrent open LLM streams, and over a soak.

Starts, all on 127.0.0.1 (free ports, temporary directory, every process in its own session and
its group killed at the end):

- the streaming upstream ``tests/e2e/upstream.py`` (subprocess);
- **baseline**: ``mitmdump -q -s bench/passthrough_addon.py`` (streams, records nothing);
- **observer**: ``mitmdump -q -s addons/llm_audit.py --set observer_db=sqlite:///<tmp>/soak.db``.

A raw-asyncio client keeps ``--streams`` (1,000) "slots" per proxy: each slot opens a plain
HTTP/1.1 connection to the proxy, sends ``POST http://127.0.0.1:<up>/v1/stream?script=long&n=N&gap_ms=G``
(absolute form, ``Content-Type: application/llm-request+json`` so the addon records it), reads the
chunked SSE body to its end (``N + 4`` events), and starts the next stream at once. N is drawn in
``--events-min..--events-max`` (30..60) at ``--gap-ms`` (1,000) apart, so a stream lasts 30-60 s at
1 event/s and about 1,000 are always open. Slots start spread over ``--ramp-seconds``.

Figures (RSS from ``/proc/<pid>/statm`` of the proxy plus its worker process, sampled every
``--sample-seconds``):

- idle RSS of each proxy (after a few warm-up streams), RSS with all streams open (ramp end +
  a few seconds) and the growth; the observer's growth with the baseline's as the baseline
  (target: observer growth <= 200 MB);
- then the baseline's streams stop and the observer soaks for ``--soak-seconds`` (600): RSS at
  soak start / end, max, end - start and the least-squares slope over the second half in MB/min
  (target: flat, < 1 MB/min);
- at the end the client closes its open streams, the observer is stopped with SIGTERM (the
  writer flushes), and the SQLite row count is checked: rows with ``outcome = completed`` must
  equal the streams the client completed.

    .venv/bin/python bench/memory.py                   # ~11 min (600 s soak)
    .venv/bin/python bench/memory.py --smoke           # ~15 s: 50 streams, 5 s soak
    .venv/bin/python bench/memory.py --soak-seconds 120 --json mem.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report, tree_cpu_seconds, tree_rss_bytes  # noqa: E402
from bench._procs import Upstream as UpstreamProc  # noqa: E402
from tests.e2e.harness import MitmdumpProcess  # noqa: E402

MB = 1024 * 1024
TARGET_GROWTH_MB = 200.0
TARGET_SLOPE_MB_MIN = 1.0
LLM_CONTENT_TYPE = "application/llm-request+json"


def raise_nofile(want: int = 20000) -> int:
    """Raises the soft open-files limit towards ``want`` (at most the hard limit); returns it.
    Child processes started afterwards inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def llm_request_body(i: int) -> bytes:
    """A draft-format LLM request (~1 KB) with a per-stream session id."""
    return json.dumps(
        {
            "version": "1.0",
            "model": "example-model",
            "stream": True,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant. " * 10},
                {"role": "user", "content": f"Stream {i}: tell me a long story about the weather. " * 8},
            ],
            "metadata": {"request_id": "550e8400-e29b-41d4-a716-446655440000", "session_id": f"bench-{i}"},
        }
    ).encode()


# --------------------------------------------------------------------------------------------
# raw asyncio streaming client


@dataclass
class ClientStats:
    """Counters of one proxy's streams: ``started`` (request sent), ``headers`` (200 + headers
    read), ``completed`` (whole body, right event count), ``failed`` (error or wrong count),
    ``aborted`` (closed by the client at the end), ``open`` (in flight now), ``events``."""

    started: int = 0
    headers: int = 0
    completed: int = 0
    failed: int = 0
    aborted: int = 0
    open: int = 0
    events: int = 0
    errors: list[str] = field(default_factory=list)

    def error(self, msg: str) -> None:
        self.failed += 1
        if len(self.errors) < 10:
            self.errors.append(msg)


async def stream_once(
    proxy_port: int,
    upstream_port: int,
    n: int,
    gap_ms: float,
    body: bytes,
    stats: ClientStats,
    timeout_s: float,
    count_events: bool = True,
) -> None:
    """One SSE stream through the proxy (absolute-form HTTP/1.1, ``Connection: close``); counts
    events (``\\n\\n``) in the de-chunked body; ``completed`` when there are ``n + 4``."""
    target = f"http://127.0.0.1:{upstream_port}/v1/stream?script=long&n={n}&gap_ms={gap_ms:g}"
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{upstream_port}\r\nContent-Type: {LLM_CONTENT_TYPE}\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    writer = None
    stats.started += 1
    stats.open += 1
    events = 0
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
            writer.write(head + body)
            status = await reader.readline()
            chunked = False
            while True:
                line = await reader.readline()
                if not line:
                    raise ConnectionError("closed in headers")
                if line in (b"\r\n", b"\n"):
                    break
                if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
                    chunked = True
            if b" 200 " not in status:
                stats.error(f"status {status[:40]!r}")
                return
            stats.headers += 1
            last = b""
            if chunked:
                while True:
                    size_line = await reader.readline()
                    if not size_line:
                        raise ConnectionError("closed mid-body")
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        await reader.readline()
                        break
                    data = (await reader.readexactly(size + 2))[:-2]
                    if count_events:
                        events += (last + data).count(b"\n\n") - last.count(b"\n\n")
                        last = data[-1:]
            else:
                while data := await reader.read(65536):
                    events += (last + data).count(b"\n\n") - last.count(b"\n\n")
                    last = data[-1:]
        stats.events += events
        if events == n + 4 or not count_events:
            stats.completed += 1
        else:
            stats.error(f"{events} events, expected {n + 4}")
    except asyncio.CancelledError:
        stats.aborted += 1
        stats.events += events
        raise
    except (OSError, ConnectionError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
        stats.events += events
        stats.error(repr(exc)[:200])
    finally:
        stats.open -= 1
        if writer is not None:
            writer.transport.abort()


async def slot(
    i: int,
    proxy_port: int,
    upstream_port: int,
    args: argparse.Namespace,
    stats: ClientStats,
    start_delay_s: float,
    rng: random.Random,
) -> None:
    """Keeps one stream open through ``proxy_port``: the next starts when the previous ends."""
    await asyncio.sleep(start_delay_s)
    body = llm_request_body(i)
    while True:
        n = rng.randint(args.events_min, args.events_max)
        await stream_once(
            proxy_port, upstream_port, n, args.gap_ms, body, stats, timeout_s=30 + n * args.gap_ms / 1000 * 3
        )
        if stats.failed > args.streams:  # something is broken: stop hammering
            return
        await asyncio.sleep(0.05 * rng.random())


def lsq_slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (x, y) points (y units per x unit); 0 for fewer than 2 points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    return 0.0 if sxx == 0 else sum((p[0] - mx) * (p[1] - my) for p in points) / sxx


def db_outcome_times(path: Path) -> dict[str, Any]:
    """Per outcome: first and last ``started_at`` and ended_at - started_at range (seconds), to
    tell when streams recorded as ``interrupted`` (open at shutdown) started."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            return {
                o: {"first_started": a, "last_started": b, "n": n}
                for o, a, b, n in con.execute(
                    "SELECT outcome, min(started_at), max(started_at), count(*) FROM exchanges GROUP BY outcome"
                )
            }
        finally:
            con.close()
    except sqlite3.Error:
        return {}


def db_counts(path: Path) -> dict[str, int]:
    """Rows of ``exchanges`` per outcome in the SQLite file (empty dict if unreadable)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            return {o: c for o, c in con.execute("SELECT outcome, count(*) FROM exchanges GROUP BY outcome")}
        finally:
            con.close()
    except sqlite3.Error:
        return {}


# --------------------------------------------------------------------------------------------


async def run(
    args: argparse.Namespace, up: UpstreamProc, base: MitmdumpProcess, obs: MitmdumpProcess, report: Report
) -> bool:
    rng = random.Random(7)
    pids = {"baseline": base.proc.pid, "observer": obs.proc.pid}  # type: ignore[union-attr]
    stats = {"baseline": ClientStats(), "observer": ClientStats()}
    ports = {"baseline": base.port, "observer": obs.port}
    details: dict[str, Any] = report.details
    ok = True

    # Warm-up: imports, the writer's first connection, code paths (not measured).
    warm = ClientStats()
    await asyncio.gather(
        *(stream_once(ports[k], up.http_port, 3, 5, llm_request_body(0), warm, 20) for k in ports for _ in range(5))
    )
    if warm.completed != 10:
        print(f"ERROR: warm-up streams failed: {warm.errors}")
        return False
    await asyncio.sleep(1.0 if args.smoke else 2.0)
    idle = {k: tree_rss_bytes(pid) / MB for k, pid in pids.items()}
    print(f"# idle RSS: baseline {idle['baseline']:.1f} MB, observer {idle['observer']:.1f} MB", flush=True)

    t0 = time.monotonic()
    tasks: dict[str, list[asyncio.Task[None]]] = {}
    for k in ports:
        tasks[k] = [
            asyncio.create_task(
                slot(
                    i,
                    ports[k],
                    up.http_port,
                    args,
                    stats[k],
                    args.ramp_seconds * i / args.streams,
                    random.Random(rng.random()),
                )
            )
            for i in range(args.streams)
        ]
    samples: list[dict[str, float]] = []

    def sample(phase: str) -> dict[str, float]:
        s: dict[str, float] = {"t": time.monotonic() - t0, "phase": phase}  # type: ignore[dict-item]
        for k, pid in pids.items():
            with contextlib.suppress(OSError):
                s[f"{k}_rss_mb"] = tree_rss_bytes(pid) / MB
                s[f"{k}_cpu_s"] = tree_cpu_seconds(pid)
            s[f"{k}_open"] = stats[k].open
        samples.append(s)
        return s

    # Ramp: every slot started, then a few seconds for the last connections to settle.
    while time.monotonic() - t0 < args.ramp_seconds + args.settle_seconds:
        await asyncio.sleep(min(args.sample_seconds, 1.0))
        sample("ramp")
    full = sample("full")
    # The RSS "with all streams open" is the max over a few samples (allocations come and go).
    for _ in range(3):
        await asyncio.sleep(min(1.0, args.sample_seconds))
        s = sample("full")
        for k in pids:
            full[f"{k}_rss_mb"] = max(full[f"{k}_rss_mb"], s[f"{k}_rss_mb"])
        full["baseline_open"] = min(full["baseline_open"], s["baseline_open"])
        full["observer_open"] = min(full["observer_open"], s["observer_open"])
    growth = {k: full[f"{k}_rss_mb"] - idle[k] for k in pids}
    print(
        f"# {full['observer_open']:.0f}/{args.streams} open: baseline {full['baseline_rss_mb']:.1f} MB "
        f"(+{growth['baseline']:.1f}), observer {full['observer_rss_mb']:.1f} MB (+{growth['observer']:.1f})",
        flush=True,
    )
    details["idle_rss_mb"] = idle
    details["full_rss_mb"] = {k: full[f"{k}_rss_mb"] for k in pids}
    details["open_at_measure"] = {k: full[f"{k}_open"] for k in pids}
    report.add("idle RSS", idle["observer"], "MB", baseline=idle["baseline"])
    report.add(f"RSS with {args.streams} open streams", full["observer_rss_mb"], "MB", baseline=full["baseline_rss_mb"])
    report.add(
        f"RSS growth for {args.streams} streams",
        growth["observer"],
        "MB",
        baseline=growth["baseline"],
        target=f"<= {TARGET_GROWTH_MB:.0f} MB",
        met=growth["observer"] <= TARGET_GROWTH_MB,
        note="RSS with the streams open - idle RSS; baseline: the proxy without the addon",
    )
    if min(full["observer_open"], full["baseline_open"]) < 0.95 * args.streams:
        print(
            f"WARNING: only {full['observer_open']:.0f} (observer) / {full['baseline_open']:.0f} (baseline) "
            f"of {args.streams} streams open at the measurement"
        )

    # Soak: the baseline's slots stop; the observer keeps ~streams open, cycling.
    for t in tasks["baseline"]:
        t.cancel()
    await asyncio.gather(*tasks["baseline"], return_exceptions=True)
    pids.pop("baseline")
    soak_t0 = time.monotonic()
    soak: list[tuple[float, float]] = []
    s = sample("soak")
    soak.append((0.0, s["observer_rss_mb"]))
    cpu_start = s["observer_cpu_s"]
    ev_start = stats["observer"].events
    min_open = args.streams
    while time.monotonic() - soak_t0 < args.soak_seconds:
        await asyncio.sleep(min(args.sample_seconds, max(0.05, args.soak_seconds - (time.monotonic() - soak_t0))))
        s = sample("soak")
        soak.append((time.monotonic() - soak_t0, s["observer_rss_mb"]))
        min_open = min(min_open, int(s["observer_open"]))
        if not obs.alive():
            print("ERROR: the observer proxy died during the soak")
            ok = False
            break
        if stats["observer"].failed > args.streams:
            print(f"ERROR: too many failed streams: {stats['observer'].errors}")
            ok = False
            break
    soak_s = time.monotonic() - soak_t0
    cpu_soak = s.get("observer_cpu_s", cpu_start) - cpu_start
    events_soak = stats["observer"].events - ev_start

    # End: close every open stream, stop the observer (SIGTERM: the writer flushes), count rows.
    for t in tasks["observer"]:
        t.cancel()
    await asyncio.gather(*tasks["observer"], return_exceptions=True)

    rss = [p[1] for p in soak]
    half = [p for p in soak if p[0] >= soak_s / 2]
    slope = lsq_slope([(t / 60.0, r) for t, r in half])
    drift = rss[-1] - rss[0]
    mid = half[0][1] if half else rss[0]  # RSS at half time: the first stream cycles are warm-up
    details["soak"] = {
        "seconds": soak_s,
        "samples": len(soak),
        "rss_start_mb": rss[0],
        "rss_end_mb": rss[-1],
        "rss_max_mb": max(rss),
        "rss_min_mb": min(rss),
        "rss_mid_mb": mid,
        "slope_mb_per_min_second_half": slope,
        "min_open_streams": min_open,
        "observer_cpu_s": cpu_soak,
        "events": events_soak,
        "events_per_s": events_soak / soak_s if soak_s else 0.0,
        "cpu_us_per_event": cpu_soak / events_soak * 1e6 if events_soak else None,
    }
    print(
        f"# soak {soak_s:.0f} s: RSS {rss[0]:.1f} -> {rss[-1]:.1f} MB (max {max(rss):.1f}), slope "
        f"{slope:+.2f} MB/min over the second half; >= {min_open} open; {events_soak / max(soak_s, 1e-9):.0f} ev/s; "
        f"observer CPU {cpu_soak / max(soak_s, 1e-9) * 100:.0f} %",
        flush=True,
    )
    report.add("soak RSS start", rss[0], "MB")
    report.add("soak RSS end", rss[-1], "MB")
    report.add("soak RSS max", max(rss), "MB")
    # No verdict on end - start: it includes the first generation of streams ending (RSS rises
    # ~18 MB over the first 60-90 s while the allocator's pools warm up, then stays flat);
    # flatness is judged on the second half of the soak.
    report.add("soak RSS end - start", drift, "MB", note="includes the warm-up of the first 60-90 s")
    report.add(
        "soak RSS end - half time",
        rss[-1] - mid,
        "MB",
        target="<= 5 MB",
        met=rss[-1] - mid <= 5.0,
        note="growth over the second half (the first stream cycles fill allocator pools)",
    )
    report.add(
        "soak RSS slope (2nd half)",
        slope,
        "MB/min",
        target=f"< {TARGET_SLOPE_MB_MIN:g} MB/min",
        met=abs(slope) < TARGET_SLOPE_MB_MIN,
        note="least squares over the samples of the second half",
    )
    report.add(
        "soak min open streams",
        min_open,
        "streams",
        target=f">= {int(0.9 * args.streams)}",
        met=min_open >= 0.9 * args.streams,
    )
    details["samples"] = samples
    details["client"] = {k: vars(v) for k, v in stats.items()}
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Observer proxy RSS with ~1000 open streams and over a soak.")
    ap.add_argument("--streams", type=int, default=1000, help="concurrent streams per proxy")
    ap.add_argument("--events-min", type=int, default=30, help="fewest content deltas of a stream")
    ap.add_argument("--events-max", type=int, default=60, help="most content deltas of a stream")
    ap.add_argument("--gap-ms", type=float, default=1000.0, help="upstream gap between events, ms")
    ap.add_argument("--ramp-seconds", type=float, default=20.0, help="slot starts spread over this")
    ap.add_argument("--settle-seconds", type=float, default=4.0, help="wait after the ramp before measuring")
    ap.add_argument("--soak-seconds", type=float, default=600.0, help="observer soak length after the ramp")
    ap.add_argument("--sample-seconds", type=float, default=5.0, help="RSS sampling period")
    ap.add_argument("--smoke", action="store_true", help="~15 s: 50 streams of 4-8 events 500 ms apart, 5 s soak")
    ap.add_argument("--json", dest="json_out", help="write the report here")
    args = ap.parse_args(argv)
    if args.smoke:
        args.streams, args.events_min, args.events_max, args.gap_ms = 50, 4, 8, 500.0
        args.ramp_seconds, args.settle_seconds, args.soak_seconds, args.sample_seconds = 2.0, 1.0, 5.0, 0.5

    t_start = time.monotonic()
    report = Report("memory", smoke=args.smoke)
    report.details["params"] = {k: v for k, v in vars(args).items() if k != "json_out"}
    report.details["nofile"] = raise_nofile(max(20000, 4 * args.streams + 1000))
    tmp = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    db = tmp / "soak.db"
    ok = False
    up = base = obs = None
    try:
        up = UpstreamProc(tmp).start()
        base = MitmdumpProcess(REPO / "bench" / "passthrough_addon.py", workdir=str(tmp / "baseline"))
        obs = MitmdumpProcess(
            REPO / "addons" / "llm_audit.py", sets={"observer_db": f"sqlite:///{db}"}, workdir=str(tmp / "observer")
        )
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:  # both start-ups at once (each waits for its port)
            for fut in [pool.submit(proc.start, timeout=30) for proc in (base, obs)]:
                fut.result()
        ok = asyncio.run(run(args, up, base, obs, report))
        client = report.details.get("client", {}).get("observer", {})
        time.sleep(1.0 if args.smoke else 2.0)  # let the addon see the closed connections
        code = obs.stop(timeout=20)
        counts = db_counts(db)
        report.details["db_rows"] = counts
        report.details["db_outcome_times"] = db_outcome_times(db)
        report.details["observer_exit_code"] = code
        completed_rows = counts.get("completed", 0)
        total_rows = sum(counts.values())
        done, closed, started = client.get("completed", 0), client.get("aborted", 0), client.get("started", 0)
        print(
            f"# stored: {total_rows} rows {counts}; client: {started} started, {done} completed, "
            f"{closed} closed by the client at the end, {client.get('failed', 0)} failed (+5 warm-up streams)"
        )
        # Every stream is one record (the 5 warm-up streams through the observer included). A
        # stream cut at the end may already have passed stream.end through the proxy, so the
        # completed rows lie between the client's completed count and that plus the cut streams.
        report.add(
            "streams stored (all outcomes)",
            total_rows,
            "rows",
            baseline=started + 5,
            target="= streams started",
            met=total_rows == started + 5,
        )
        report.add(
            "completed streams stored",
            completed_rows,
            "rows",
            baseline=done + 5,
            target=f"= completed (+ <= {closed} cut at the end)",
            met=done + 5 <= completed_rows <= done + 5 + closed,
        )
        # The streams cut at the end closed their connections before the observer stopped:
        # the addon must have finished them as client_aborted, not at shutdown as interrupted.
        report.add(
            "streams still open at shutdown",
            counts.get("interrupted", 0),
            "rows",
            target="= 0",
            met=counts.get("interrupted", 0) == 0,
            note="recorded as interrupted",
        )
        if total_rows != started + 5 or not done + 5 <= completed_rows <= done + 5 + closed or client.get("failed", 0):
            ok = False
            print(f"ERROR: stored rows do not match the client's streams, or streams failed: {client.get('errors')}")
    except Exception as exc:  # noqa: BLE001 - could not measure: exit 1 with the reason
        import traceback

        traceback.print_exc()
        print(f"ERROR: could not measure: {exc!r}")
        for p in (base, obs):
            if p is not None:
                print(p.describe(20))
        ok = False
    finally:
        for p in (base, obs):
            if p is not None:
                p.stop()
        if up is not None:
            up.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish(t_start, args.json_out, ok)


if __name__ == "__main__":
    sys.exit(main())
