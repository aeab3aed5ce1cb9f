"""Scale-out: aggregate events/s of N observer processes (one per core) vs one, all writing one
PostgreSQL database.

mitmproxy 12.3.1 binds its listener with ``asyncio.start_server(handler, host, port)``
(``mitmproxy/proxy/mode_servers.py``), without ``reuse_port``: a second process cannot share the
port through ``SO_REUSEPORT``. So the deployment is one process per core, each on its own port,
behind an L4 (TCP) balancer (``deploy/haproxy.cfg``, ``deploy/observer@.service``). Here the
client plays the ideal balancer: it spreads its connections evenly over the N proxy ports.

Starts on 127.0.0.1: a light streaming upstream (this script with ``--serve-upstream``: the
``long`` script of ``tests/e2e/upstream.py``, pre-rendered, all streams served from 10 timers, so it
costs ~10 µs per event instead of ~140: the e2e upstream, ``--e2e-upstream``, capped the load on
2 cores before the proxies did), a throw-away database
``bench_<random>`` on the PostgreSQL server (migrated once, dropped at the end), and
``os.cpu_count()`` (``--procs``) mitmdump processes ``-s addons/llm_audit.py`` with
``observer_db`` = that database and ``observer_migrate=false``.

For each configuration (1 process, then N processes, same offered load): ``--streams`` (300)
concurrent slots, each repeatedly streaming ``script=long&n=<--events>&gap_ms=<--gap-ms>``
(300 deltas of ~300 bytes, 20 ms apart: 6 s, 50 events/s per stream, 15,000 events/s offered), plain
HTTP/1.1 absolute-form through the proxy, ``Content-Type: application/llm-request+json`` so the
addon records every stream. After ``--warm-seconds`` (3) it counts the events the client receives
during ``--window-seconds`` (12): delivered events/s. The figure is N processes' events/s with
1 process's as the baseline (ratio), plus the proxies' CPU over the window.

Honest caveat: on this 2-core machine the client and the upstream (both Python) share the cores
with the proxies, so N processes cannot get N cores; the ratio is a lower bound of what one core
per process gives.

    .venv/bin/python bench/scaleout.py           # ~45 s
    .venv/bin/python bench/scaleout.py --smoke   # a few seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402

from bench._common import Report, cpu_seconds, tree_cpu_seconds  # noqa: E402
from bench._pg import PgDatabase  # noqa: E402
from bench.memory import LLM_CONTENT_TYPE, ClientStats, UpstreamProc, llm_request_body, raise_nofile  # noqa: E402
from bench.store import DEFAULT_PG_URL  # noqa: E402
from observer.store.migrate import upgrade  # noqa: E402
from tests.e2e.harness import MitmdumpProcess  # noqa: E402

TICK_GROUPS = 10  # the light upstream's timers: stream k is served by timer k % 10, phases spread


# --------------------------------------------------------------------------------------------
# light upstream: tests/e2e/upstream.py costs ~140 µs of CPU per event (h11, one timer per stream),
# so on 2 cores it, not the proxy, capped the first measurements at ~6,800 events/s. This one
# pre-renders each stream's chunks and serves all streams from 10 timers (one write per event).


def _rendered_chunks(n: int) -> list[bytes]:
    from tests.e2e.upstream import render_event, script_long

    chunks = []
    for ev in script_long(n):
        if "x-bench:sent" in ev:
            ev["x-bench:sent"] = 0.0
        data = render_event(ev)
        chunks.append(b"%x\r\n%s\r\n" % (len(data), data))
    return chunks


async def _serve_light_upstream() -> None:
    """Plain HTTP/1.1 ``POST /v1/stream?n=N&gap_ms=G`` (the ``long`` script of
    tests/e2e/upstream.py, same events), chunked, ``Connection: close``; prints
    ``{"http_port": P}`` and serves until stdin closes."""
    import json
    from urllib.parse import parse_qsl, urlsplit

    cache: dict[int, list[bytes]] = {}
    groups: list[dict[int, list[Any]]] = [{} for _ in range(TICK_GROUPS)]
    gaps: list[float] = [0.02] * TICK_GROUPS
    counter = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal counter
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            target = lines[0].split(" ")[1]
            length = next((int(h.split(":", 1)[1]) for h in lines[1:] if h.lower().startswith("content-length:")), 0)
            await reader.readexactly(length)
            q = dict(parse_qsl(urlsplit(target).query))
            n = int(q.get("n", "200"))
            if n not in cache:
                cache[n] = _rendered_chunks(n)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            )
            done = asyncio.get_running_loop().create_future()
            counter += 1
            k = counter % TICK_GROUPS
            gaps[k] = float(q.get("gap_ms", "20")) / 1000.0
            groups[k][counter] = [cache[n], 0, writer, done]
            await done
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            pass
        finally:
            writer.transport.abort() if writer.transport.is_closing() else writer.close()

    async def ticker(k: int) -> None:
        await asyncio.sleep(0.02 * k / TICK_GROUPS)
        loop = asyncio.get_running_loop()
        nxt = loop.time()
        while True:
            nxt += gaps[k]
            await asyncio.sleep(max(0.0, nxt - loop.time()))
            for key, st in list(groups[k].items()):
                chunks, i, w, done = st
                if w.transport.is_closing():
                    del groups[k][key]
                    done.done() or done.set_result(None)
                    continue
                w.write(chunks[i])
                st[1] = i + 1
                if i + 1 == len(chunks):
                    w.write(b"0\r\n\r\n")
                    del groups[k][key]
                    done.done() or done.set_result(None)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=4096)
    tickers = [asyncio.create_task(ticker(k)) for k in range(TICK_GROUPS)]
    print(json.dumps({"http_port": server.sockets[0].getsockname()[1]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until stdin EOF
    for t in tickers:
        t.cancel()
    server.close()


class LightUpstream(UpstreamProc):
    """``bench/scaleout.py --serve-upstream`` in its own session (``http_port`` once started)."""

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--serve-upstream"]


class Haproxy:
    """``haproxy`` running ``deploy/haproxy.cfg`` with its bind and server lines rewritten to a
    free 127.0.0.1 port and the given observer ports (``--via-haproxy``)."""

    def __init__(self, workdir: Path, backend_ports: list[int]) -> None:
        from tests.e2e.harness import free_port

        self.port = free_port()
        lines = []
        for line in (REPO / "deploy" / "haproxy.cfg").read_text().splitlines():
            st = line.strip()
            if st.startswith("maxconn "):  # haproxy wants ~2 x maxconn files; this box allows 20,000
                line = "    maxconn 8000"
            elif st.startswith("bind "):
                line = f"    bind 127.0.0.1:{self.port}"
            elif st.startswith("server ") or st.startswith("# server "):
                continue
            elif st.startswith("log ") or st.startswith("option tcplog"):
                continue
            lines.append(line)
            if st.startswith("default-server"):
                lines += [f"    server observer{i + 1} 127.0.0.1:{p}" for i, p in enumerate(backend_ports)]
        self.cfg = workdir / "haproxy.cfg"
        self.cfg.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Haproxy:
        from tests.e2e.harness import port_open, wait_until

        exe = shutil.which("haproxy")
        if exe is None:
            raise RuntimeError("haproxy is not installed (apt-get install haproxy)")
        with open(self.cfg.with_suffix(".log"), "wb") as log:
            self.proc = subprocess.Popen(
                [exe, "-db", "-f", str(self.cfg)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(
                lambda: port_open(self.port),
                10,
                what="haproxy",
                abort=lambda: None if self.proc.poll() is None else "haproxy exited",
            )  # type: ignore[union-attr]
        except (TimeoutError, RuntimeError) as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {self.cfg.with_suffix('.log').read_text(errors='replace')[-500:]}") from exc
        return self

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


async def stream_count(
    proxy_port: int, upstream_port: int, n: int, gap_ms: float, body: bytes, live: ClientStats, timeout_s: float
) -> None:
    """One stream through the proxy with ``Connection: close``; reads raw until EOF and counts
    SSE event ends (``\\n\\n``: HTTP/1.1 chunk framing uses ``\\r\\n``, so it never forms one)."""
    target = f"http://127.0.0.1:{upstream_port}/v1/stream?script=long&n={n}&gap_ms={gap_ms:g}"
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{upstream_port}\r\nContent-Type: {LLM_CONTENT_TYPE}\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    live.started += 1
    writer = None
    events = 0
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
            writer.write(head + body)
            buf = b""
            while b"\r\n\r\n" not in buf:
                more = await reader.read(65536)
                if not more:
                    raise ConnectionError("closed in the response head")
                buf += more
            if not buf.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(f"status {buf[:30]!r}")
            live.headers += 1
            data = buf[buf.find(b"\r\n\r\n") + 4 :]
            last = b""
            while True:
                k = (last + data).count(b"\n\n") - last.count(b"\n\n")
                events += k
                live.events += k
                if data:
                    last = data[-1:]
                if events >= n + 4 and (last + data).endswith(b"0\r\n\r\n"):
                    break
                data = await reader.read(65536)
                if not data:
                    break
        if events == n + 4:
            live.completed += 1
        else:
            raise ConnectionError(f"{events} events, expected {n + 4}")
    except asyncio.CancelledError:
        live.aborted += 1
        raise
    except (OSError, ConnectionError, TimeoutError) as exc:
        live.error(repr(exc)[:200])
    finally:
        if writer is not None:
            writer.transport.abort()


async def slot(
    i: int, port: int, upstream_port: int, args: argparse.Namespace, live: ClientStats, delay_s: float
) -> None:
    """Streams back to back through ``port``."""
    await asyncio.sleep(delay_s)
    body = llm_request_body(i)
    while live.failed <= args.streams:
        await stream_count(
            port,
            upstream_port,
            args.events,
            args.gap_ms,
            body,
            live,
            timeout_s=30 + args.events * args.gap_ms / 1000 * 4,
        )


async def measure(
    ports: list[int], pids: list[int], upstream_port: int, args: argparse.Namespace, upstream_pid: int
) -> dict[str, Any]:
    """Runs the slots spread over ``ports`` (slot i -> ports[i % len]); events/s and CPU over the
    window after the warm-up; then cuts the streams."""
    live = ClientStats()
    tasks = [
        asyncio.create_task(
            slot(i, ports[i % len(ports)], upstream_port, args, live, args.warm_seconds * 0.5 * i / args.streams)
        )
        for i in range(args.streams)
    ]
    try:
        await asyncio.sleep(args.warm_seconds)
        ev0, t0 = live.events, time.monotonic()
        cpu0 = [tree_cpu_seconds(p) for p in pids]
        me0 = cpu_seconds(os.getpid())
        up0 = cpu_seconds(upstream_pid)
        await asyncio.sleep(args.window_seconds)
        ev1, t1 = live.events, time.monotonic()
        cpu1 = [tree_cpu_seconds(p) for p in pids]
        me1 = cpu_seconds(os.getpid())
        up1 = cpu_seconds(upstream_pid)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    dt = t1 - t0
    return {
        "events_per_s": (ev1 - ev0) / dt,
        "window_s": dt,
        "events": ev1 - ev0,
        "proxy_cpu_pct": [round((b - a) / dt * 100, 1) for a, b in zip(cpu0, cpu1, strict=True)],
        "client_cpu_pct": round((me1 - me0) / dt * 100, 1),
        "upstream_cpu_pct": round((up1 - up0) / dt * 100, 1),
        "started": live.started,
        "headers": live.headers,
        "completed": live.completed,
        "failed": live.failed,
        "aborted": live.aborted,
        "errors": live.errors,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Aggregate events/s of N observer processes vs one (one PostgreSQL).")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 2, help="processes of the scaled configuration")
    ap.add_argument("--streams", type=int, default=300, help="concurrent streams (same in every configuration)")
    ap.add_argument("--events", type=int, default=300, help="content deltas per stream (300 x 20 ms = 6 s)")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="upstream gap between events, ms")
    ap.add_argument("--warm-seconds", type=float, default=3.0, help="ramp before the window")
    ap.add_argument("--window-seconds", type=float, default=12.0, help="measured window per configuration")
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("OBSERVER_TEST_PG_URL", DEFAULT_PG_URL),
        help="PostgreSQL server (a bench_<random> database is created there and dropped)",
    )
    ap.add_argument(
        "--via-haproxy",
        action="store_true",
        help="also measure N processes behind haproxy running deploy/haproxy.cfg (needs haproxy)",
    )
    ap.add_argument(
        "--e2e-upstream",
        action="store_true",
        help="use tests/e2e/upstream.py (CPU-heavy: it caps the load on 2 cores) instead of the light one",
    )
    ap.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="seconds: 20 streams, 1 s warm-up, 2 s windows")
    ap.add_argument("--json", dest="json_out", help="write the report here")
    args = ap.parse_args(argv)
    if args.serve_upstream:
        asyncio.run(_serve_light_upstream())
        return 0
    if args.smoke:
        args.streams, args.events, args.warm_seconds, args.window_seconds = 20, 40, 1.0, 2.0
    args.procs = max(2, args.procs)

    t_start = time.monotonic()
    report = Report("scaleout", smoke=args.smoke)
    report.details["params"] = {k: v for k, v in vars(args).items() if k not in ("json_out", "pg_url")}
    report.details["so_reuseport"] = (
        "not available: mitmproxy 12.3.1 listens with asyncio.start_server(handler, "
        "host, port) without reuse_port (mitmproxy/proxy/mode_servers.py)"
    )
    raise_nofile(20000)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scaleout-"))
    procs: list[MitmdumpProcess] = []
    up: UpstreamProc | None = None
    hap: Haproxy | None = None
    pg: PgDatabase | None = None
    ok = False
    try:
        pg = PgDatabase(args.pg_url)
        upgrade(pg.url)
        up = (UpstreamProc(tmp) if args.e2e_upstream else LightUpstream(tmp)).start()
        for i in range(args.procs):
            p = MitmdumpProcess(
                REPO / "addons" / "llm_audit.py",
                workdir=str(tmp / f"observer{i}"),
                sets={"observer_db": pg.url, "observer_migrate": "false"},
            )
            procs.append(p)
            p.start(timeout=30)
        results: dict[Any, dict[str, Any]] = {}
        configs: list[tuple[Any, list[int]]] = [(1, [procs[0].port]), (args.procs, [p.port for p in procs])]
        if args.via_haproxy:
            hap = Haproxy(tmp, [p.port for p in procs]).start()
            configs.append(("haproxy", [hap.port]))
        for key, ports in configs:
            n = args.procs if key == "haproxy" else key
            pids = [p.proc.pid for p in procs[:n]]  # type: ignore[union-attr]
            res = asyncio.run(measure(ports, pids, up.http_port, args, up.proc.pid))  # type: ignore[union-attr]
            results[key] = res
            label = f"{args.procs} processes via haproxy" if key == "haproxy" else f"{n} process(es)"
            print(
                f"  {label}: {res['events_per_s']:,.0f} events/s, proxy CPU {res['proxy_cpu_pct']} %, "
                f"client CPU {res['client_cpu_pct']} %, upstream CPU {res['upstream_cpu_pct']} %, streams completed {res['completed']}, failed {res['failed']}",
                flush=True,
            )
        if hap is not None:
            hap.stop()
        time.sleep(1.0)
        for p in procs:
            p.stop(timeout=20)  # SIGTERM: each writer flushes
        eng = sa.create_engine(pg.url, poolclass=sa.NullPool)
        with eng.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT outcome, count(*) FROM exchanges GROUP BY outcome")).all())
        eng.dispose()
        started = sum(r["started"] for r in results.values())
        headers = sum(r["headers"] for r in results.values())
        completed = sum(r["completed"] for r in results.values())
        failed = sum(r["failed"] for r in results.values())
        report.details["results"] = results
        report.details["db_rows"] = rows
        one, many = results[1]["events_per_s"], results[args.procs]["events_per_s"]
        report.add(
            f"events/s, {args.procs} processes",
            many,
            "ev/s",
            baseline=one,
            note="baseline: 1 process; no verdict: client and upstream share the same cores, so N "
            "processes cannot get N cores here (the issue sets no ratio)",
        )
        report.add(
            f"proxy CPU, {args.procs} processes",
            sum(results[args.procs]["proxy_cpu_pct"]),
            "% of a core",
            baseline=sum(results[1]["proxy_cpu_pct"]),
        )
        if "haproxy" in results:
            report.add(
                f"events/s, {args.procs} processes via haproxy",
                results["haproxy"]["events_per_s"],
                "ev/s",
                baseline=one,
                note="deploy/haproxy.cfg (leastconn); haproxy shares the cores too",
            )
        report.add(
            "proxy CPU per event",
            sum(results[args.procs]["proxy_cpu_pct"]) * 1e4 / max(many, 1),
            "µs/ev",
            baseline=sum(results[1]["proxy_cpu_pct"]) * 1e4 / max(one, 1),
        )
        total_rows = sum(rows.values())
        # A stream cut while its request was in flight may never reach the addon: between the
        # streams that got their response head and those started.
        report.add(
            "streams stored in PostgreSQL",
            total_rows,
            "rows",
            baseline=started,
            target=f"{headers}..{started} (answered..started)",
            met=headers <= total_rows <= started,
        )
        print(
            f"# stored {total_rows} rows {rows}; client started {started}, answered {headers}, "
            f"completed {completed}, failed {failed}"
        )
        ok = failed == 0 and headers <= total_rows <= started and rows.get("completed", 0) >= completed
        if not ok:
            print(f"ERROR: failed streams or stored rows do not match: {[r['errors'] for r in results.values()]}")
    except Exception as exc:  # noqa: BLE001 - could not measure: exit 1 with the reason
        import traceback

        traceback.print_exc()
        print(f"ERROR: could not measure: {exc!r}")
        for p in procs:
            print(p.describe(20))
        ok = False
    finally:
        if hap is not None:
            hap.stop()
        for p in procs:
            p.stop()
        if up is not None:
            up.stop()
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.drop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report.finish(t_start, args.json_out, ok)


if __name__ == "__main__":
    sys.exit(main())
