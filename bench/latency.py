"""Per-event latency added by the audit addon, against the same proxy without it.

Starts, all on 127.0.0.1:

- the local streaming upstream (``tests/e2e/upstream.py`` as a subprocess);
- ``mitmdump -q -s bench/passthrough_addon.py`` (baseline: the proxy streaming, recording nothing);
- ``mitmdump -q -s addons/llm_audit.py --set observer_db=sqlite:///<tmp>/bench.db`` (the product).

Then, one stream at a time and alternating between configurations (direct, baseline, addon; the
order rotates every round), it requests ``/v1/stream?script=long`` (``--events`` deltas of ~300
bytes, ``--gap-ms`` apart, each carrying ``"x-bench:sent": time.time()`` taken just before the
upstream writes it) with ``Content-Type: application/llm-request+json``, so the addon does its full
work (SSE framing, JSON, reassembly, DB write). Latency of an event = client arrival time
(``time.time()`` when the chunk completing it was read) - ``x-bench:sent``.

Prints p50/p90/p99/max per transport and configuration, the differences and ratios against the
baseline, the proxies' CPU time per event, and what the addon stored. Ends by itself (bounded by
``--max-seconds``). ``--smoke`` runs a few seconds' worth.

    .venv/bin/python bench/latency.py            # make bench
    .venv/bin/python bench/latency.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from tests.e2e.harness import MitmdumpProcess  # noqa: E402

REQUEST_ID = "550e8400-e29b-41d4-a716-446655440000"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def llm_request(n: int) -> bytes:
    return json.dumps({
        "version": "1.0",
        "model": "example-model",
        "stream": True,
        "messages": [{"role": "user", "content": f"Write {n} tokens."}],
        "metadata": {"request_id": REQUEST_ID, "session_id": "bench"},
    }).encode()


# --------------------------------------------------------------------------------------------
# processes


class Upstream:
    """``tests/e2e/upstream.py`` in its own process (so it does not share the client's GIL)."""

    def __init__(self, workdir: Path):
        self.log_path = workdir / "upstream.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.http_port = self.https_port = 0
        self.ca_cert = ""

    def start(self, timeout: float = 20.0) -> Upstream:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "e2e" / "upstream.py"), "--port", "0", "--tls-port", "0", "--exit-on-stdin-eof"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO), start_new_session=True,
        )
        log.close()
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            raise RuntimeError(f"upstream did not start; log:\n{self.log_path.read_text(errors='replace')}")
        info = json.loads(line)
        self.http_port, self.https_port, self.ca_cert = info["http_port"], info["https_port"], info["ca_cert"]
        return self

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(Exception):
            assert p.stdin is not None
            p.stdin.close()  # --exit-on-stdin-eof
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# one stream


@dataclass
class StreamStats:
    latencies_ms: list[float] = field(default_factory=list)
    events: int = 0
    error: str | None = None


def run_stream(url: str, proxy: str | None, verify: Any, n: int, timeout: float) -> StreamStats:
    st = StreamStats()
    buf = b""
    with httpx.Client(proxy=proxy, verify=verify, trust_env=False, timeout=httpx.Timeout(timeout)) as client:
        try:
            with client.stream("POST", url, content=llm_request(n),
                               headers={"Content-Type": "application/llm-request+json", "Accept": "text/event-stream"}) as r:
                if r.status_code != 200:
                    st.error = f"HTTP {r.status_code}"
                    return st
                for chunk in r.iter_raw():
                    now = time.time()
                    buf += chunk
                    while True:
                        i = buf.find(b"\n\n")
                        if i < 0:
                            break
                        event, buf = buf[:i], buf[i + 2:]
                        st.events += 1
                        for line in event.split(b"\n"):
                            if line.startswith(b"data:"):
                                obj = json.loads(line[5:])
                                sent = obj.get("x-bench:sent")
                                if sent is not None:
                                    st.latencies_ms.append((now - sent) * 1000.0)
        except httpx.HTTPError as e:
            st.error = repr(e)
    return st


# --------------------------------------------------------------------------------------------
# statistics / report


def pct(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


@dataclass
class ConfigResult:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    streams: int = 0
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    cpu_known: bool = False

    def summary(self) -> dict[str, float]:
        s = sorted(self.latencies_ms)
        return {"n": len(s), "p50": pct(s, 0.50), "p90": pct(s, 0.90), "p99": pct(s, 0.99), "max": s[-1] if s else float("nan"),
                "mean": sum(s) / len(s) if s else float("nan")}


def describe_db(path: Path) -> str:
    if not path.exists():
        return "no DB file was created"
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            names = [r[0] for r in con.execute("select name from sqlite_master where type='table' order by name")]
            parts = []
            for n in names:
                (c,) = con.execute(f'select count(*) from "{n}"').fetchone()
                parts.append(f"{n}={c}")
            return f"{path.stat().st_size} bytes; rows per table: " + (", ".join(parts) or "(no tables)")
        finally:
            con.close()
    except sqlite3.Error as e:
        return f"unreadable: {e}"


# --------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Per-event latency added by the audit addon vs the same proxy without it.")
    ap.add_argument("--streams", type=int, default=5, help="measured streams per configuration and transport")
    ap.add_argument("--events", type=int, default=200, help="content deltas per stream")
    ap.add_argument("--gap-ms", type=float, default=20.0, help="upstream gap between events")
    ap.add_argument("--transports", default="h1,h1-tls", help="comma list of h1, h1-tls")
    ap.add_argument("--addon", default="addons/llm_audit.py", help="the addon under test (relative to the repo)")
    ap.add_argument("--max-seconds", type=float, default=170.0, help="stop starting new streams after this")
    ap.add_argument("--smoke", action="store_true", help="a few seconds: 1 stream x 30 events x 10 ms, h1 only")
    ap.add_argument("--json", dest="json_out", help="also write the results to this JSON file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.streams, args.events, args.gap_ms, args.transports = 1, 30, 10.0, "h1"
        args.max_seconds = min(args.max_seconds, 60.0)
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    for t in transports:
        if t not in ("h1", "h1-tls"):
            ap.error(f"unknown transport {t!r}")

    t_start = time.monotonic()
    deadline = t_start + args.max_seconds
    stream_timeout = 10.0 + args.events * args.gap_ms / 1000.0 * 2

    with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
        work = Path(tmp)
        up = Upstream(work).start()
        procs: dict[str, MitmdumpProcess] = {}
        notes: list[str] = []
        db_path = work / "bench.db"
        try:
            procs["baseline"] = MitmdumpProcess(REPO / "bench" / "passthrough_addon.py", workdir=str(work / "baseline"))
            procs["baseline"].start(timeout=30)
            addon_path = REPO / args.addon
            if addon_path.exists():
                p = MitmdumpProcess(addon_path, sets={"observer_db": f"sqlite:///{db_path}"}, workdir=str(work / "addon"))
                try:
                    p.start(timeout=30)
                    procs["addon"] = p
                except RuntimeError as e:
                    notes.append(f"addon mitmdump failed to start, left out:\n{e}")
            else:
                notes.append(f"{args.addon} does not exist yet: the addon row is left out")

            configs = ["direct"] + [c for c in ("baseline", "addon") if c in procs]
            results = {(t, c): ConfigResult(c) for t in transports for c in configs}

            def target(t: str, c: str) -> tuple[str, str | None, Any]:
                tls = t == "h1-tls"
                url = (f"https://127.0.0.1:{up.https_port}" if tls else f"http://127.0.0.1:{up.http_port}") + \
                      f"/v1/stream?script=long&n={args.events}&gap_ms={args.gap_ms:g}"
                if c == "direct":
                    return url, None, ssl.create_default_context(cafile=up.ca_cert) if tls else True
                p = procs[c]
                return url, p.proxy_url, ssl.create_default_context(cafile=p.ca_path) if tls else True

            # Warm-up: connections, TLS leaf minting, imports (not measured).
            for t in transports:
                for c in configs:
                    url, proxy, verify = target(t, c)
                    run_stream(url.replace(f"n={args.events}", "n=5").replace(f"gap_ms={args.gap_ms:g}", "gap_ms=2"), proxy, verify, 5, 10)

            print(f"# {len(transports)} transport(s) x {len(configs)} configs x {args.streams} streams x {args.events} events, "
                  f"{args.gap_ms:g} ms apart; one stream at a time", flush=True)
            stopped_early = False
            for rnd in range(args.streams):
                order = configs[rnd % len(configs):] + configs[: rnd % len(configs)]
                for t in transports:
                    for c in order:
                        if time.monotonic() + args.events * args.gap_ms / 1000.0 > deadline:
                            stopped_early = True
                            break
                        url, proxy, verify = target(t, c)
                        pid = procs[c].proc.pid if c in procs and procs[c].proc else None
                        cpu0 = cpu_seconds(pid) if pid else None
                        st = run_stream(url, proxy, verify, args.events, stream_timeout)
                        cpu1 = cpu_seconds(pid) if pid else None
                        res = results[(t, c)]
                        res.streams += 1
                        res.latencies_ms.extend(st.latencies_ms)
                        if cpu0 is not None and cpu1 is not None:
                            res.cpu_s += cpu1 - cpu0
                            res.cpu_known = True
                        if st.error or st.events != args.events + 4:
                            res.errors.append(f"round {rnd}: {st.error or ''} events={st.events}/{args.events + 4}")
                    if stopped_early:
                        break
                print(f"  round {rnd + 1}/{args.streams} done ({time.monotonic() - t_start:.0f} s)", flush=True)
                if stopped_early:
                    notes.append(f"stopped early at --max-seconds={args.max_seconds:g}")
                    break
        finally:
            for p in procs.values():
                p.stop()
            up.stop()

        # ---- report
        out: dict[str, Any] = {"params": vars(args), "results": {}, "notes": notes}
        print()
        print(f"{'transport':9} {'config':8} {'events':>6} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} {'mean ms':>8} {'CPU µs/ev':>10}")
        for t in transports:
            for c in configs:
                r = results[(t, c)]
                s = r.summary()
                cpu = f"{r.cpu_s / s['n'] * 1e6:10.0f}" if r.cpu_known and s["n"] else f"{'-':>10}"
                print(f"{t:9} {c:8} {s['n']:6d} {s['p50']:8.2f} {s['p90']:8.2f} {s['p99']:8.2f} {s['max']:8.2f} {s['mean']:8.2f} {cpu}")
                out["results"][f"{t}/{c}"] = {**s, "streams": r.streams, "errors": r.errors,
                                              "cpu_us_per_event": (r.cpu_s / s["n"] * 1e6) if r.cpu_known and s["n"] else None}
        print()
        if "addon" in configs:
            print("addon vs baseline (same proxy without the addon):")
            for t in transports:
                a, b = results[(t, "addon")].summary(), results[(t, "baseline")].summary()
                parts = []
                for q in ("p50", "p90", "p99"):
                    ratio = a[q] / b[q] if b[q] else float("nan")
                    parts.append(f"{q} {a[q] - b[q]:+.2f} ms (x{ratio:.2f})")
                print(f"  {t:9} " + ", ".join(parts))
                out["results"][f"{t}/addon-minus-baseline"] = {q: a[q] - b[q] for q in ("p50", "p90", "p99", "max", "mean")}
        print("proxy vs direct:")
        for t in transports:
            d = results[(t, "direct")].summary()
            for c in configs[1:]:
                s = results[(t, c)].summary()
                print(f"  {t:9} {c:8} p50 {s['p50'] - d['p50']:+.2f} ms, p99 {s['p99'] - d['p99']:+.2f} ms")
        if "addon" in configs:
            info = describe_db(db_path)
            print(f"addon DB: {info}")
            out["addon_db"] = info
        for t in transports:
            for c in configs:
                if results[(t, c)].errors:
                    print(f"WARNING {t}/{c}: {results[(t, c)].errors}")
        for n in notes:
            print(f"NOTE: {n}")
        print(f"total {time.monotonic() - t_start:.0f} s")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(out, indent=2, default=str))
    bad = any(r.errors for r in results.values()) or "addon" not in configs
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
