"""Peak memory of the observer proxy while it holds request bodies (``observer.capture.held``):
parallel large JSON uploads to an LLM host that no dialect claims by their headers, each body
copied on the side until its response headers decide.

Starts, all on 127.0.0.1 (free ports, a temporary directory; every process stopped at the end):

- an upstream (a thread here) that reads each upload whole, hashing it, waits until all
  ``--uploads`` bodies are in (so every copy is held at the same time: the worst case), then
  answers plain JSON ``{"got": n, "sha256": ...}`` (not an AI SDK stream: each copy is dropped
  at the response headers);
- per case, a fresh ``mitmdump -q -s addons/llm_audit.py`` (a fresh process each: freed memory
  is not always returned to the system, so cases must not share one):

  - ``not held``: the same uploads as ``multipart/form-data`` (a dialect may not claim them by
    their response: streamed on, no copy): the proxy's own cost of the transfers, the baseline;
  - ``held``: ``application/json`` with the proxy's default settings;
  - ``held, budget B``: the same with ``--set observer_max_held_request_bytes=B`` (``--budget``,
    repeatable).

Figures: the growth of the mitmdump process's RSS (``/proc/<pid>/statm``, sampled every 5 ms;
its worker process is not counted: the copies live in the proxy's own process) from idle (after
a warm-up upload of each kind) to the peak during the uploads, in MB (10^6 bytes); the held
cases against the not-held baseline. Target: the baseline's growth plus what may be held (the
budget, or all the uploads when less) and 15 % (a ``bytearray`` grown by appends has up to
~1/8 more capacity than bytes). Every upload must reach the upstream whole (size and SHA-256),
else the suite fails.

    .venv/bin/python bench/held.py                              # 6 uploads of 15 MB: ~20 s
    .venv/bin/python bench/held.py --budget 16777216 --budget 67108864
    .venv/bin/python bench/held.py --smoke                      # seconds
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import Report, rss_bytes  # noqa: E402
from bench._procs import start_proxy  # noqa: E402
from observer.limits import Limits  # noqa: E402

MB = 1e6
SAMPLE_S = 0.005


class _Upstream(http.server.ThreadingHTTPServer):
    """Reads each POST whole and answers once ``parties`` bodies are in (or ``wait_s`` passed)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.barrier = threading.Barrier(1)
        self.wait_s = 30.0

    def expect(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        n = int(self.headers.get("content-length", "0"))
        digest, got = hashlib.sha256(), 0
        while got < n:
            part = self.rfile.read(min(1 << 20, n - got))
            if not part:
                break
            digest.update(part)
            got += len(part)
        try:
            self.server.barrier.wait(timeout=self.server.wait_s)  # type: ignore[attr-defined]
        except threading.BrokenBarrierError:
            pass
        body = json.dumps({"got": got, "sha256": digest.hexdigest()}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


class _Peak:
    """Samples the RSS of ``pid`` every ``SAMPLE_S`` while running; ``peak`` in bytes."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except OSError:
                return
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _payload(i: int, size: int) -> bytes:
    """A JSON body of ``size`` bytes (``{"i":i,"blob":"..."}``), different per upload."""
    head = b'{"i":%d,"blob":"' % i
    fill = size - len(head) - 2
    return head + (b"%x" % (i % 16)) * fill + b'"}'


def _uploads(proxy_url: str, url: str, content_type: str, n: int, size: int) -> list[bool]:
    """``n`` parallel POSTs of ``size`` bytes through ``proxy_url``; each True when the upstream
    got it whole (size and SHA-256)."""

    def one(i: int) -> bool:
        body = _payload(i, size)
        with httpx.Client(proxy=proxy_url, trust_env=False, timeout=120.0) as client:
            r = client.post(url, content=body, headers={"content-type": content_type})
        return r.status_code == 200 and r.json() == {"got": size, "sha256": hashlib.sha256(body).hexdigest()}

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def measure(case: str, content_type: str, sets: dict[str, str], args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One case in a fresh proxy: idle RSS after warm-up, peak RSS during the uploads (bytes)."""
    up = _Upstream()
    threading.Thread(target=up.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    proxy = start_proxy("addon", work / case.replace(" ", "_").replace(",", ""), addon_sets=sets)
    try:
        url = f"http://127.0.0.1:{up.server_address[1]}/api/upload"
        up.expect(1)
        warm = _uploads(proxy.proxy_url, url, content_type, 1, 1 << 16)
        time.sleep(1.0)
        idle = rss_bytes(proxy.proc.pid)
        up.expect(args.uploads)
        with _Peak(proxy.proc.pid) as peak:
            ok = _uploads(proxy.proxy_url, url, content_type, args.uploads, int(args.mb * MB))
        return {"idle": idle, "peak": peak.peak, "ok": all(warm) and all(ok), "intact": sum(ok)}
    finally:
        proxy.stop()
        up.shutdown()
        up.server_close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Peak proxy RSS with parallel held uploads.")
    ap.add_argument("--uploads", type=int, default=6, help="parallel uploads")
    ap.add_argument("--mb", type=float, default=15.0, help="size of each upload in MB (10^6 bytes)")
    ap.add_argument("--budget", action="append", default=[], help="observer_max_held_request_bytes to try")
    ap.add_argument("--smoke", action="store_true", help="seconds: 2 uploads of 1 MB")
    ap.add_argument("--json", dest="json_out", help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    if args.smoke:
        args.uploads, args.mb = 2, 1.0
    started = time.monotonic()
    report = Report("held", smoke=args.smoke)
    cases = [("not held", "multipart/form-data; boundary=b", {}), ("held", "application/json", {})]
    cases += [(f"held, budget {b}", "application/json", {"observer_max_held_request_bytes": b}) for b in args.budget]
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-held-") as tmp:
        results = {}
        for case, content_type, sets in cases:
            res = measure(case, content_type, sets, args, Path(tmp))
            results[case] = res
            ok = ok and res["ok"]
            print(
                f"{case}: idle {res['idle'] / MB:.1f} MB, peak {res['peak'] / MB:.1f} MB,"
                f" +{(res['peak'] - res['idle']) / MB:.1f} MB; {res['intact']}/{args.uploads} uploads intact"
            )
    base = results["not held"]
    base_growth = (base["peak"] - base["idle"]) / MB
    budgets = {"held": Limits().max_held_request_bytes} | {f"held, budget {b}": int(b) for b in args.budget}
    for case, res in results.items():
        growth = (res["peak"] - res["idle"]) / MB
        name = f"RSS growth, {args.uploads} x {args.mb:g} MB, {case}"
        if case not in budgets:
            report.add(name, growth, "MB", baseline=base_growth)
            continue
        bound = base_growth + 1.15 * min(args.uploads * args.mb, budgets[case] / MB)
        report.add(name, growth, "MB", baseline=base_growth, target=f"<= {bound:.1f} MB", met=growth <= bound)
    report.details = {"uploads": args.uploads, "mb": args.mb, "cases": results}
    return report.finish(started, args.json_out, ok)


if __name__ == "__main__":
    sys.exit(main())
