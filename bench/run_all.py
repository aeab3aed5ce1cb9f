"""``make bench``: every benchmark suite in turn, then one summary table.

Each suite (``bench/<suite>.py``, contract in ``bench/_common.py``) runs as its own process with
``--json``; its own table is printed as it finishes, and the summary repeats every figure with its
baseline, ratio and target. Order: the in-process suites first (core, store), then the proxy
suites (latency, load, bulk, scale-out), and the memory soak last (it is most of the wall time:
``--soak-seconds``, default 600).

    .venv/bin/python bench/run_all.py                     # make bench, < 45 min on 2 cores (queries: ~25)
    .venv/bin/python bench/run_all.py --smoke             # make bench-smoke, each suite in seconds
    .venv/bin/python bench/run_all.py --only core,load    # a subset
    .venv/bin/python bench/run_all.py --json results.json # all reports in one file

Exit code 1 when a suite could not measure (its exit code was not 0) or ran past its time limit;
a missed target is printed as ``MISS`` and does not fail the run (benchmarks are not tests).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import Figure, format_figures, machine  # noqa: E402

#: Suites in running order, with the wall-time limit (seconds) of a full and of a smoke run.
SUITES: list[tuple[str, int, int]] = [
    ("core", 120, 60),
    ("store", 120, 60),
    ("verify", 300, 60),
    ("purge", 400, 60),
    ("export", 300, 60),
    ("queries", 3000, 120),
    ("latency", 240, 90),
    ("load", 300, 90),
    ("bulk", 180, 90),
    ("held", 120, 60),
    ("scaleout", 180, 90),
    ("memory", 900, 120),
    ("metrics", 120, 60),
    ("envelope", 120, 60),
    ("signalr", 120, 60),
    ("sockets", 240, 90),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="each suite at smoke size (seconds)")
    ap.add_argument("--only", default="", help="comma-separated suites to run (default: all)")
    ap.add_argument("--skip", default="", help="comma-separated suites to leave out")
    ap.add_argument(
        "--soak-seconds", type=float, default=None, help="memory soak duration (default: the suite's, 600 s)"
    )
    ap.add_argument("--json", default="", help="write every suite's report into this file")
    args = ap.parse_args(argv)

    names = [n for n, _, _ in SUITES]
    only = [s for s in args.only.split(",") if s]
    skip = {s for s in args.skip.split(",") if s}
    unknown = [s for s in [*only, *skip] if s not in names]
    if unknown:
        ap.error(f"unknown suite(s) {', '.join(unknown)}; known: {', '.join(names)}")

    started = time.monotonic()
    reports: list[dict] = []
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="observer-bench-") as tmp:
        for name, limit_full, limit_smoke in SUITES:
            if (only and name not in only) or name in skip:
                continue
            out = Path(tmp) / f"{name}.json"
            cmd = [sys.executable, str(HERE / f"{name}.py"), "--json", str(out)]
            if args.smoke:
                cmd.append("--smoke")
            if name == "memory" and args.soak_seconds is not None:
                cmd += ["--soak-seconds", str(args.soak_seconds)]
            limit = limit_smoke if args.smoke else limit_full
            print(f"\n##### {name} ({' '.join(cmd[1:])})", flush=True)
            t0 = time.monotonic()
            try:
                rc = subprocess.run(cmd, cwd=HERE.parent, timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = None
            took = time.monotonic() - t0
            if rc != 0 or not out.exists():
                why = f"ran past its {limit} s limit" if rc is None else f"exit code {rc}"
                print(f"##### {name}: FAILED ({why}) after {took:.0f} s", flush=True)
                failed.append(name)
                continue
            report = json.loads(out.read_text())
            report["wall_seconds"] = round(took, 1)
            reports.append(report)
            print(f"##### {name}: {took:.0f} s", flush=True)

    total = time.monotonic() - started
    print("\n" + "=" * 100)
    m = machine()
    print(
        f"machine: {m['cpu']} x{m['cpus']}, {m['mem_gib']} GiB, Python {m['python']}, Linux {m['kernel']}, {m['date']}"
    )
    for rep in reports:
        figs = [
            Figure(**{k: f[k] for k in ("name", "value", "unit", "baseline", "target", "met", "note")})
            for f in rep["figures"]
        ]
        print()
        print(format_figures(f"{rep['suite']} ({rep['wall_seconds']:.0f} s)", figs, smoke=rep["smoke"]))
    missed = [
        (r["suite"], f["name"]) for r in reports for f in r["figures"] if f.get("met") is False and not r["smoke"]
    ]
    print(
        f"\ntotal {total / 60:.1f} min; {len(reports)} suite(s) measured"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + (
            "; smoke size: figures are not measurements, targets not judged"
            if args.smoke
            else f"; targets missed: {len(missed)}"
            if missed
            else "; every target with a verdict met"
        )
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": m,
                    "total_seconds": round(total, 1),
                    "smoke": args.smoke,
                    "failed": failed,
                    "reports": reports,
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
