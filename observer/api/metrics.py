"""``GET /metrics``: the proxies' metrics (``observer.metrics`` snapshots) in the Prometheus text
format, each series with a ``proxy`` label naming the process it came from, plus
``observer_proxy_snapshot_age_seconds{proxy}`` for every snapshot of the last day (a proxy that
stopped writing shows as a growing age and, after ``STALE_S``, as missing series).

Also what ``/readyz`` asks of the proxies: is every fresh proxy's writer and worker alive and
its journal below its bound (``proxy_health``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("observer.api")

STALE_S = 30.0  # a snapshot older than this (six missed writes) is a proxy that stopped
FORGET_S = 86400.0  # older snapshots are not reported at all
MAX_SNAPSHOT_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class Snapshot:
    proxy: str
    age_s: float
    families: list[Metric]


def read_snapshots(directory: Path | None, now: float | None = None) -> list[Snapshot]:
    """Every ``*.prom`` snapshot in ``directory`` written in the last ``FORGET_S`` seconds, parsed
    (a fresh one only: its families; an older one: no families, only its age). A file that cannot
    be read or parsed is logged and skipped."""
    if directory is None or not directory.is_dir():
        return []
    now = time.time() if now is None else now
    out = []
    for path in sorted(directory.glob("*.prom")):
        try:
            age = max(0.0, now - path.stat().st_mtime)
            if age > FORGET_S:
                continue
            families: list[Metric] = []
            if age <= STALE_S:
                with path.open("rb") as f:
                    text = f.read(MAX_SNAPSHOT_BYTES + 1)
                if len(text) > MAX_SNAPSHOT_BYTES:
                    raise ValueError(f"over {MAX_SNAPSHOT_BYTES} bytes")
                families = list(text_string_to_metric_families(text.decode("utf-8")))
            out.append(Snapshot(path.stem, age, families))
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            log.warning("audit API: metrics snapshot %s skipped: %s", path.name, exc)
    return out


class ProxySnapshots:
    """A prometheus-client collector of the proxies' snapshots in ``directory``."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory

    def collect(self) -> Iterable[Metric]:
        snapshots = read_snapshots(self.directory)
        age = GaugeMetricFamily(
            "observer_proxy_snapshot_age_seconds",
            "Seconds since each proxy last wrote its metrics (every 5 s while it runs).",
            labels=["proxy"],
        )
        merged: dict[str, Metric] = {}
        for snap in snapshots:
            age.add_metric([snap.proxy], snap.age_s)
            for family in snap.families:
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for s in family.samples:
                    if s.name.endswith("_created"):
                        continue  # (prometheus-client's creation timestamps: not worth a series each)
                    out.add_sample(s.name, {**s.labels, "proxy": snap.proxy}, s.value)
        return [age, *merged.values()]

    def describe(self) -> Iterable[Metric]:
        return []


def exposition(directory: Path | None) -> bytes:
    """The ``/metrics`` body (text format 0.0.4)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProxySnapshots(directory))
    return generate_latest(registry)


def proxy_health(directory: Path | None) -> dict[str, str]:
    """What ``/readyz`` says of the proxies: ``{}`` when no proxy writes here (an API alone), else
    per fresh proxy ``"ok"`` or what is wrong (writer down, worker down, journal full), and
    ``"stale"`` for one that stopped writing in the last day."""
    out: dict[str, str] = {}
    for snap in read_snapshots(directory):
        if not snap.families:
            out[snap.proxy] = f"stale: no metrics for {snap.age_s:.0f} s"
            continue
        values = {f.name: f.samples[0].value for f in snap.families if f.samples and f.type in ("gauge", "unknown")}
        problems = []
        if values.get("observer_writer_alive", 1.0) < 1.0:
            problems.append("the database writer is not running")
        if values.get("observer_worker_alive", 1.0) < 1.0:
            problems.append("the parser worker is down (parsing in-process)")
        spool, bound = values.get("observer_spool_bytes", 0.0), values.get("observer_spool_max_bytes", 0.0)
        if bound and spool >= 0.9 * bound:
            problems.append(f"the journal holds {spool:.0f} of its {bound:.0f} bytes")
        out[snap.proxy] = "; ".join(problems) or "ok"
    return out


__all__ = ["ProxySnapshots", "exposition", "proxy_health", "read_snapshots"]
