"""Old commit against new commit: one benchmark suite run in two source trees, interleaved in
one session, with the noise measured the same way (old against old).

    python bench/ab.py --old ../old-worktree --suite core --rounds 3 [-- SUITE ARGS...]

Each round runs the suite in the old tree twice and in the new tree once, in a rotating order
(``A A' B``, ``B A A'``, ``A' B A``, ...), each as ``python bench/<suite>.py --json F`` with the
tree as working directory and ``PYTHONPATH``. Per figure it prints the median over the rounds of
the figure's comparable value in each tree (``core``: the observer / baseline ratio, measured
within one run so machine drift cancels; other suites: the figure's value), then new / old and
old' / old (the noise: two runs of the same code), and the same as differences (for figures
that are themselves differences from a baseline, e.g. ``latency``'s ms over mitmdump alone). A
change is within noise when its new / old (or new - old) is inside the spread the old' / old
figures show. Exit 1 when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run_suite(tree: Path, suite: str, extra: list[str], out: Path) -> dict[str, float]:
    """One run of ``bench/<suite>.py`` in ``tree``: ``{figure name: comparable value}``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, f"bench/{suite}.py", "--json", str(out), *extra]
    proc = subprocess.run(
        cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{tree}: {' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    report = json.loads(out.read_text())
    values = {}
    for fig in report["figures"]:
        ratio = fig.get("ratio")
        values[fig["name"]] = ratio if suite == "core" and ratio is not None else fig["value"]
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, type=Path, help="source tree of the old commit (a git worktree)")
    ap.add_argument("--new", default=Path(__file__).resolve().parent.parent, type=Path, help="the new tree")
    ap.add_argument("--suite", default="core", help="bench/<suite>.py (core, latency, ...)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of A A' B (1-20)")
    ap.add_argument("--json", dest="json_out", help="write the medians and ratios here")
    ap.add_argument("extra", nargs="*", help="arguments for the suite (after --)")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 20:
        ap.error("--rounds must be 1-20")
    runs: dict[str, list[dict[str, float]]] = {"old": [], "old2": [], "new": []}
    order = ["old", "old2", "new"]
    trees = {"old": args.old.resolve(), "old2": args.old.resolve(), "new": args.new.resolve()}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in order[r % 3 :] + order[: r % 3]:
                print(f"round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
                runs[name].append(run_suite(trees[name], args.suite, args.extra, Path(tmp) / f"{name}-{r}.json"))
    names = [n for n in runs["old"][0] if all(n in run for runs_ in runs.values() for run in runs_)]
    rows = []
    for n in names:
        med = {k: statistics.median(run[n] for run in v) for k, v in runs.items()}
        rows.append(
            {
                "figure": n,
                **med,
                "new/old": _ratio(med["new"], med["old"]),
                "old2/old": _ratio(med["old2"], med["old"]),
                "new-old": med["new"] - med["old"],
                "old2-old": med["old2"] - med["old"],
            }
        )
    width = max(len(r["figure"]) for r in rows)
    print(
        f"{'figure':<{width}}  {'old':>10} {'old2':>10} {'new':>10}  {'new/old':>8} {'old2/old':>8}"
        f"  {'new-old':>9} {'old2-old':>9}"
    )
    for r in rows:
        print(
            f"{r['figure']:<{width}}  {r['old']:>10.3f} {r['old2']:>10.3f} {r['new']:>10.3f}  "
            f"{_fmt(r['new/old']):>8} {_fmt(r['old2/old']):>8}  {r['new-old']:>+9.3f} {r['old2-old']:>+9.3f}"
        )
    spread = [r["new/old"] for r in rows if r["new/old"] is not None]
    noise = [r["old2/old"] for r in rows if r["old2/old"] is not None]
    if spread and noise:
        print(
            f"new/old: median {statistics.median(spread):.3f}, range {min(spread):.3f}-{max(spread):.3f}; "
            f"old2/old (noise): median {statistics.median(noise):.3f}, range {min(noise):.3f}-{max(noise):.3f}"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"suite": args.suite, "rounds": args.rounds, "rows": rows}, indent=1))
    return 0


def _ratio(a: float, b: float) -> float | None:
    return None if b == 0 else a / b


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    sys.exit(main())
