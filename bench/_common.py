"""What every benchmark suite in ``bench/`` shares: the figure record, the printed table, the JSON
report, the machine description and ``/proc`` readings (CPU seconds, RSS) of a process.

Contract of a suite (``bench/<suite>.py``), relied on by ``bench/run_all.py``:

- runnable as a script; ``--smoke`` runs a seconds-long version that only shows it works;
  ``--json PATH`` writes ``Report.to_dict()`` there;
- prints each figure with its baseline, the ratio (or difference) and the target;
- exit code 0 when it could measure (a missed target is a printed ``MISS``, not a failure),
  1 when it could not (a process failed to start, a stream failed, wrong event count).

Ratios are always *observer / baseline* measured in the same run: absolute times on a shared
2-core machine drift between runs, ratios much less.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Figure:
    """One measured figure.

    ``value`` is the observer's figure in ``unit``; ``baseline`` the same figure for the baseline
    (``None`` when the target is absolute, e.g. records/s); ``target`` a human-readable bound such
    as ``">= 2x"`` or ``"<= +0.3 ms"``; ``met`` whether it held (``None``: no target)."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline in (None, 0):
            return None
        return self.value / self.baseline

    @property
    def delta(self) -> float | None:
        return None if self.baseline is None else self.value - self.baseline


@dataclass
class Report:
    """A suite's result: its figures, its wall time (seconds) and free-form details."""

    suite: str
    figures: list[Figure] = field(default_factory=list)
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    smoke: bool = False

    def add(self, *args: Any, **kwargs: Any) -> Figure:
        fig = Figure(*args, **kwargs)
        self.figures.append(fig)
        return fig

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "smoke": self.smoke,
            "seconds": round(self.seconds, 2),
            "machine": machine(),
            "figures": [dict(asdict(f), ratio=f.ratio) for f in self.figures],
            "details": self.details,
        }

    def write_json(self, path: str | Path | None) -> None:
        if path:
            Path(path).write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n")

    def print_table(self) -> None:
        print(format_figures(self.suite, self.figures, smoke=self.smoke))

    def finish(self, started_s: float, json_path: str | Path | None, ok: bool, *, table: bool = True) -> int:
        """Ends a suite: wall time since ``started_s`` (``time.monotonic()``), the table (unless
        already printed), the JSON report; returns the exit code (0 measured, 1 could not)."""
        self.seconds = time.monotonic() - started_s
        if table:
            print()
            self.print_table()
        print(f"total {self.seconds:.1f} s")
        self.write_json(json_path)
        return 0 if ok else 1


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def format_figures(title: str, figures: list[Figure], *, smoke: bool = False) -> str:
    """A fixed-width table: figure, observer value, baseline, ratio, difference, target, verdict.
    A smoke run's figures are too small to mean anything: no verdicts, and the title says so."""
    rows = [("figure", "observer", "baseline", "ratio", "diff", "unit", "target", "")]
    if smoke:
        title += " (smoke size: shows the suite runs; not a measurement, no verdicts)"
    for f in figures:
        verdict = "" if f.met is None or smoke else ("ok" if f.met else "MISS")
        ratio = "-" if f.ratio is None else f"{f.ratio:.2f}x"
        rows.append((f.name, _num(f.value), _num(f.baseline), ratio, _num(f.delta), f.unit, f.target, verdict))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"== {title} =="]
    for i, r in enumerate(rows):
        lines.append(
            "  ".join(c.ljust(widths[j]) if j in (0, 5, 6, 7) else c.rjust(widths[j]) for j, c in enumerate(r))
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    """CPU model, logical CPUs, memory (GiB), Python and kernel of this machine."""
    model = ""
    with _suppress():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = 0.0
    with _suppress():
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
                break
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "mem_gib": round(mem_gib, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "date": time.strftime("%Y-%m-%d"),
    }


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` and all its threads, in seconds (clock ticks of
    ``1/SC_CLK_TCK``, usually 10 ms: coarse for short intervals). Raises OSError if gone."""
    parts = _stat_fields(pid)
    return (int(parts[11]) + int(parts[12])) / CLK_TCK


def _stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first). Raises OSError if gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def descendants(pid: int) -> list[int]:
    """The pids of the live processes started by ``pid`` and by them, recursively (Linux
    ``/proc/<pid>/task/<tid>/children``); empty when there are none or ``pid`` is gone."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid``, its live descendants (the observer's worker process) and its
    reaped children (``cutime``/``cstime``): what the proxy costs, wherever it parses. Raises
    OSError if ``pid`` is gone; a descendant that exits meanwhile is skipped."""
    parts = _stat_fields(pid)  # utime, stime, then cutime, cstime of reaped children
    total = sum(int(parts[i]) for i in (11, 12, 13, 14)) / CLK_TCK
    for kid in descendants(pid):
        with _suppress():
            total += cpu_seconds(kid)
    return total


def tree_rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` plus its live descendants (the observer's worker process),
    in bytes. Raises OSError if ``pid`` is gone."""
    total = rss_bytes(pid)
    for kid in descendants(pid):
        with _suppress():
            total += rss_bytes(kid)
    return total


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes (``/proc/<pid>/statm``). Raises OSError if gone."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values`` by nearest rank; NaN for an empty list."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]
