"""The proxy process's Prometheus metrics, and how they reach the API's ``GET /metrics``.

The proxy keeps its metrics in a registry of its own (prometheus-client), and a thread writes
them every ``METRICS_INTERVAL_S`` in the text exposition format to ``metrics_dir/<proxy>.prom``
(written aside, then renamed: a reader never sees half a file). The API reads every proxy's
file and serves them with a ``proxy`` label beside its own (``observer.api.metrics``). This is
prometheus-client's multiprocess mode's job done without its per-process mmap files and its
import-time environment variable, which a stock ``mitmdump -s`` loading the addon cannot set
early enough.

Cost on the proxy's loop: one ``observe`` per finished record (a handful of counter and
histogram updates), never per chunk; gauges and the pipeline's counters are read by the
snapshot thread.

Label values are bounded: dialects, outcomes and violation kinds are the code's own names; a
model or host is kept as sent (up to ``LABEL_MAX_CHARS``, characters outside
``[A-Za-z0-9._:/@+-]`` as ``_``) for the first ``LABEL_MAX_VALUES`` distinct values of each, and
``other`` after them: no user ids, no free text, no unbounded series.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from observer.records import Exchange, Outcome, ViolationKind

log = logging.getLogger("observer.metrics")

METRICS_INTERVAL_S = 5.0
LABEL_MAX_VALUES = 100
LABEL_MAX_CHARS = 80
OTHER = "other"
UNKNOWN = "unknown"
TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
DB_WRITE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_UNSAFE = re.compile(r"[^A-Za-z0-9._:/@+\-]")
_OUTCOMES = frozenset(o.value for o in Outcome)
_KINDS = frozenset(k.value for k in ViolationKind)


class BoundedLabel:
    """The label value of a free-form string: the first ``max_values`` distinct values as sent
    (cleaned, cut), ``other`` after them; ``None`` or empty is ``unknown``. Thread-safe."""

    def __init__(self, max_values: int = LABEL_MAX_VALUES, max_chars: int = LABEL_MAX_CHARS) -> None:
        self._seen: set[str] = set()
        self._max_values = max_values
        self._max_chars = max_chars
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        if not value:
            return UNKNOWN
        clean = _UNSAFE.sub("_", value[: self._max_chars])
        if clean in self._seen:
            return clean
        with self._lock:
            if len(self._seen) >= self._max_values:
                return OTHER
            self._seen.add(clean)
        return clean


class ProxyMetrics:
    """The proxy process's metrics. ``observe(record)`` is called once per finished record (on
    the proxy's loop); ``pipeline`` returns the pipeline's counters and gauges when the snapshot
    is taken (``pipeline_stats``' keys)."""

    def __init__(self, pipeline: Callable[[], Mapping[str, float]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = BoundedLabel()
        self._host = BoundedLabel()
        r = self.registry
        self.exchanges = Counter(
            "observer_exchanges",
            "Exchanges recorded, by dialect, model (the response's, else the request's) and outcome.",
            ("dialect", "model", "outcome"),
            registry=r,
        )
        self.host_exchanges = Counter(
            "observer_host_exchanges",
            "Exchanges recorded, by LLM host and outcome (apart from the model: the product of both labels"
            " would multiply the series).",
            ("host", "outcome"),
            registry=r,
        )
        self.tokens = Counter(
            "observer_tokens",
            "Tokens the vendor reported, by dialect, model and type (input, output).",
            ("dialect", "model", "type"),
            registry=r,
        )
        self.usage_not_reported = Counter(
            "observer_usage_not_reported",
            "Exchanges whose stream reported no token usage, by dialect and model.",
            ("dialect", "model"),
            registry=r,
        )
        self.ttft = Histogram(
            "observer_time_to_first_token_seconds",
            "Seconds from the request to the first generated token, by dialect.",
            ("dialect",),
            buckets=TTFT_BUCKETS_S,
            registry=r,
        )
        self.duration = Histogram(
            "observer_exchange_duration_seconds",
            "Seconds from the request to the end of the response, by dialect and outcome.",
            ("dialect", "outcome"),
            buckets=DURATION_BUCKETS_S,
            registry=r,
        )
        self.violations = Counter(
            "observer_violations", "Protocol and lifecycle violations recorded, by kind.", ("kind",), registry=r
        )
        self.db_write = Histogram(
            "observer_db_write_seconds",
            "Seconds one batch of records took to be stored in the database.",
            buckets=DB_WRITE_BUCKETS_S,
            registry=r,
        )
        if pipeline is not None:
            r.register(_PipelineCollector(pipeline))

    def observe(self, record: Exchange) -> None:
        """Counts one finished record. Never raises (a metric must not cost a record)."""
        try:
            dialect = record.dialect
            model = self._model(record.model or record.request.model)
            outcome = record.outcome if record.outcome in _OUTCOMES else OTHER
            self.exchanges.labels(dialect, model, outcome).inc()
            self.host_exchanges.labels(self._host(record.host), outcome).inc()
            usage = record.usage
            if usage.reported:
                if usage.input_tokens:
                    self.tokens.labels(dialect, model, "input").inc(usage.input_tokens)
                if usage.output_tokens:
                    self.tokens.labels(dialect, model, "output").inc(usage.output_tokens)
            else:
                self.usage_not_reported.labels(dialect, model).inc()
            if record.ttft_s is not None:
                self.ttft.labels(dialect).observe(record.ttft_s)
            if record.ended_at is not None:
                self.duration.labels(dialect, outcome).observe(
                    max(0.0, (record.ended_at - record.started_at).total_seconds())
                )
            for v in record.violations:
                self.violations.labels(v.kind if v.kind in _KINDS else OTHER).inc()
        except Exception:  # noqa: BLE001
            log.warning("observer: a record could not be counted in the metrics", exc_info=True)

    def snapshot(self) -> bytes:
        """The metrics in the Prometheus text format (0.0.4)."""
        return generate_latest(self.registry)


#: The pipeline's values (``ProxyMetrics(pipeline=...)`` returns a mapping with these keys):
#: name -> (kind, help). Counters are totals since the process started.
PIPELINE: dict[str, tuple[str, str]] = {
    "records_journaled": ("counter", "Records written to the journal (fsynced before the database sees them)."),
    "records_stored": ("counter", "Records stored in the database."),
    "records_dropped": ("counter", "Records lost (the journal full or failing), each counted in a gap record."),
    "records_duplicate": ("counter", "Records the database already held (skipped)."),
    "gaps_stored": ("counter", "Gap records stored (records lost, counted)."),
    "journal_disk_errors": ("counter", "Journal writes that failed."),
    "worker_restarts": ("counter", "Parser worker processes that died and were replaced."),
    "errors": ("counter", "Failures inside the observer's own code (the flow passed through unobserved)."),
    "refused_connections": ("counter", "Client connections refused by the upstream guard."),
    "refused_requests": ("counter", "LLM requests refused with 503 because recording failed (fail_closed)."),
    "writer_queue_depth": ("gauge", "Finished records waiting in memory for the journal's writer thread."),
    "spool_bytes": ("gauge", "Journal bytes not yet stored in the database."),
    "spool_max_bytes": ("gauge", "The journal's bound (spool_max_bytes); beyond it records are dropped."),
    "spool_oldest_age_seconds": ("gauge", "Seconds since the journal last had nothing waiting for the database."),
    "open_exchanges": ("gauge", "Exchanges streaming now."),
    "database_up": ("gauge", "1 while the database takes records, 0 while they wait in the journal."),
    "writer_alive": ("gauge", "1 while the database writer thread runs."),
    "worker_alive": ("gauge", "1 while the parser worker runs (or parsing is in-process), 0 if it is down."),
}


class _PipelineCollector:
    """Yields the pipeline's values as ``observer_<name>`` families at collect time."""

    def __init__(self, pipeline: Callable[[], Mapping[str, float]]) -> None:
        self._pipeline = pipeline

    def collect(self) -> Iterable[Metric]:
        try:
            values = self._pipeline()
        except Exception:  # noqa: BLE001
            log.warning("observer: the pipeline's metrics could not be read", exc_info=True)
            return []
        out: list[Metric] = []
        for name, (kind, help_text) in PIPELINE.items():
            if name not in values:
                continue
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            out.append(family(f"observer_{name}", help_text, value=float(values[name])))
        return out

    def describe(self) -> Iterable[Metric]:
        return []


def proxy_name(listen_ports: Iterable[int]) -> str:
    """The ``proxy`` label of this process: ``<host name>-<first listen port>``, file-name safe."""
    ports = sorted(listen_ports)
    name = f"{socket.gethostname()}-{ports[0] if ports else os.getpid()}"
    return _UNSAFE.sub("_", name)


class SnapshotWriter:
    """A daemon thread writing ``metrics.snapshot()`` to ``directory/<name>.prom`` every
    ``interval_s`` seconds and once at ``close``. An unwritable folder is logged once per
    hour, never raised."""

    def __init__(self, metrics: ProxyMetrics, directory: Path, name: str, interval_s: float = METRICS_INTERVAL_S):
        self._metrics = metrics
        self.path = directory / f"{name}.prom"
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error = -3600.0

    def start(self) -> None:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.write()
        self._thread = threading.Thread(target=self._run, name="observer-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.write()

    def write(self) -> None:
        try:
            data = self._metrics.snapshot()
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=self.path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except OSError as exc:
            now = time.monotonic()
            if now - self._last_error >= 3600.0:
                self._last_error = now
                log.error("observer: cannot write the metrics to %s: %s", self.path, exc)

    def stop(self) -> None:
        """Stops the thread (the caller writes the final snapshot with ``write``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def retire(self) -> None:
        """After a clean stop's final ``write``: renames the snapshot to ``<name>.prom.stopped``,
        so the API no longer serves it nor counts this proxy in ``/readyz`` (a proxy stopped on
        purpose is not a proxy that stopped reporting; trial finding: a container replaced on the
        same volume left the API not ready for a day). The file stays for whoever looks. A proxy
        that crashes leaves its ``.prom``: "stale" in ``/readyz``. Errors are logged, never raised."""
        try:
            os.replace(self.path, self.path.with_name(self.path.name + ".stopped"))
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("observer: cannot retire the metrics snapshot %s: %s", self.path, exc)


def pipeline_stats(journal: Any, drainer: Any, addon: Any, spool_max_bytes: int) -> dict[str, float]:
    """The ``PIPELINE`` values of a running proxy from its journal, drainer and addon stats
    (either may be ``None``: not recording)."""
    out: dict[str, float] = {
        "worker_restarts": addon.worker_deaths,
        "errors": addon.observer_errors,
        "refused_connections": addon.refused_connections,
        "refused_requests": addon.refused_requests,
        "open_exchanges": addon.open_exchanges,
        "worker_alive": 1.0 if addon.worker_alive else 0.0,
        "spool_max_bytes": spool_max_bytes,
    }
    if journal is not None:
        js = journal.stats()
        out |= {
            "records_journaled": js["journaled"],
            "records_dropped": js["dropped"],
            "journal_disk_errors": js["disk_errors"],
            "writer_queue_depth": js["queued"],
            "spool_bytes": js["spool_bytes"],
        }
    if drainer is not None:
        ds = drainer.stats()
        out |= {
            "records_stored": ds["written"],
            "records_duplicate": ds.get("duplicates", 0),
            "gaps_stored": ds["gaps"],
            "spool_oldest_age_seconds": ds.get("behind_s", 0.0),
            "database_up": 0.0 if ds["database_down"] else 1.0,
            "writer_alive": 1.0 if ds["alive"] else 0.0,
        }
    return out


__all__ = [
    "PIPELINE",
    "BoundedLabel",
    "ProxyMetrics",
    "SnapshotWriter",
    "pipeline_stats",
    "proxy_name",
]
