"""Metrics (issue 14 item 2): the proxy's counters for hand-made records, bounded labels, the
snapshot file, and the API's ``GET /metrics`` and ``/readyz`` over snapshots. Expected values are
counted by hand from the records below."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from observer.api import create_app
from observer.api.app import ApiOptions
from observer.api.metrics import STALE_S
from observer.metrics import BoundedLabel, ProxyMetrics, SnapshotWriter
from observer.records import Exchange, Usage, Violation
from observer.store.store import AuditStore

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)
TOKEN = "metrics-test-token-0123"


def record(model, outcome, usage=None, ttft=None, seconds=2.0, violations=(), dialect="openai.chat") -> Exchange:
    return Exchange(
        id="x",
        dialect=dialect,
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/1.1",
        started_at=T0,
        ended_at=T0 + timedelta(seconds=seconds),
        ttft_s=ttft,
        model=model,
        usage=usage or Usage(),
        outcome=outcome,
        violations=[Violation(k, None, "") for k in violations],
    )


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, tuple(sorted(labels.items())))


def test_records_are_counted_by_dialect_model_host_and_outcome():
    m = ProxyMetrics()
    m.observe(record("gpt-4o", "completed", Usage(10, 5, True), ttft=0.3, seconds=1.5))
    m.observe(record("gpt-4o", "completed", Usage(20, 7, True), ttft=0.7, seconds=3.0, violations=["undeclared_tool"]))
    m.observe(record(None, "error", seconds=0.2, violations=["invalid_json", "invalid_json"]))
    got = samples(m.snapshot())
    common = {"dialect": "openai.chat"}
    assert got[key("observer_exchanges_total", **common, model="gpt-4o", outcome="completed")] == 2
    assert got[key("observer_exchanges_total", **common, model="unknown", outcome="error")] == 1
    assert got[key("observer_host_exchanges_total", host="api.openai.com", outcome="completed")] == 2
    assert got[key("observer_host_exchanges_total", host="api.openai.com", outcome="error")] == 1
    assert got[key("observer_tokens_total", dialect="openai.chat", model="gpt-4o", type="input")] == 30
    assert got[key("observer_tokens_total", dialect="openai.chat", model="gpt-4o", type="output")] == 12
    assert got[key("observer_usage_not_reported_total", dialect="openai.chat", model="unknown")] == 1
    assert got[key("observer_violations_total", kind="undeclared_tool")] == 1
    assert got[key("observer_violations_total", kind="invalid_json")] == 2
    ttft = {"dialect": "openai.chat"}
    assert got[key("observer_time_to_first_token_seconds_count", **ttft)] == 2
    assert got[key("observer_time_to_first_token_seconds_sum", **ttft)] == pytest.approx(1.0)
    assert got[key("observer_time_to_first_token_seconds_bucket", **ttft, le="0.5")] == 1
    assert got[key("observer_time_to_first_token_seconds_bucket", **ttft, le="1.0")] == 2
    done = {"dialect": "openai.chat", "outcome": "completed"}
    assert got[key("observer_exchange_duration_seconds_sum", **done)] == pytest.approx(4.5)
    assert got[key("observer_exchange_duration_seconds_bucket", **done, le="2.0")] == 1


def test_free_form_labels_are_bounded_and_cleaned():
    label = BoundedLabel(max_values=2, max_chars=10)
    assert label("gpt-4o") == "gpt-4o"
    assert label('a"b{c}\n') == "a_b_c__"
    assert label("third") == "other"
    assert label("gpt-4o") == "gpt-4o"  # (a value seen before the cap stays itself)
    assert label("x" * 50) == "other"
    assert label(None) == label("") == "unknown"
    m = ProxyMetrics()
    for n in range(300):
        m.observe(record(f"model-{n}", "completed"))
    models = {dict(k[1])["model"] for k in samples(m.snapshot()) if k[0] == "observer_exchanges_total"}
    assert len(models) == 101 and "other" in models  # 100 distinct values, then one bucket


def test_a_metric_never_costs_a_record():
    m = ProxyMetrics()
    broken = record("m", "completed")
    broken.violations = None  # type: ignore[assignment]
    m.observe(broken)  # logged, not raised


def test_the_pipeline_values_are_exported():
    m = ProxyMetrics(pipeline=lambda: {"records_journaled": 7, "spool_bytes": 1024, "database_up": 1})
    got = samples(m.snapshot())
    assert got[key("observer_records_journaled_total")] == 7
    assert got[key("observer_spool_bytes")] == 1024
    assert got[key("observer_database_up")] == 1


def write_snapshot(folder: Path, name: str, pipeline: dict, age_s: float = 0.0) -> Path:
    m = ProxyMetrics(pipeline=lambda: pipeline)
    m.observe(record("gpt-4o", "completed", Usage(3, 4, True)))
    writer = SnapshotWriter(m, folder, name, interval_s=3600)
    writer.start()
    writer.stop()
    if age_s:
        t = time.time() - age_s
        os.utime(writer.path, (t, t))
    return writer.path


HEALTHY = {"writer_alive": 1, "worker_alive": 1, "spool_bytes": 10, "spool_max_bytes": 1000, "records_stored": 1}


@pytest.fixture
def api(store: AuditStore, tmp_path: Path):
    folder = tmp_path / "metrics"
    with TestClient(create_app(store, TOKEN, options=ApiOptions(metrics_dir=folder))) as client:
        yield client, folder


def test_get_metrics_serves_every_proxy_with_its_label(api):
    client, folder = api
    write_snapshot(folder, "proxy-a-8080", HEALTHY)
    write_snapshot(folder, "proxy-b-8080", HEALTHY)
    write_snapshot(folder, "proxy-c-8080", HEALTHY, age_s=STALE_S + 60)
    assert client.get("/metrics").status_code == 401
    r = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    got = samples(r.content)
    series = {"dialect": "openai.chat", "model": "gpt-4o", "outcome": "completed"}
    assert got[key("observer_exchanges_total", **series, proxy="proxy-a-8080")] == 1
    assert got[key("observer_exchanges_total", **series, proxy="proxy-b-8080")] == 1
    assert key("observer_exchanges_total", **series, proxy="proxy-c-8080") not in got  # stopped writing
    assert got[key("observer_proxy_snapshot_age_seconds", proxy="proxy-c-8080")] >= STALE_S + 59
    assert got[key("observer_records_stored_total", proxy="proxy-a-8080")] == 1
    assert not any(name.endswith("_created") for name, _ in got)


def test_readyz_names_what_is_wrong_with_a_proxy(api):
    client, folder = api
    assert client.get("/readyz").json() == {"status": "ready", "database": "ok", "proxies": {}}
    path = write_snapshot(folder, "p1", HEALTHY)
    assert client.get("/readyz").json()["proxies"] == {"p1": "ok"}
    write_snapshot(folder, "p1", HEALTHY | {"writer_alive": 0, "spool_bytes": 950})
    r = client.get("/readyz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "not_ready" and body["error"]["code"] == "not_ready"
    assert body["error"]["message"] == (
        "proxy p1: the database writer is not running; the journal holds 950 of its 1000 bytes"
    )
    t = time.time() - STALE_S - 5
    os.utime(path, (t, t))
    assert client.get("/readyz").json()["proxies"]["p1"].startswith("stale: no metrics for")
    (folder / "p1.prom").write_text("not { a metric")
    assert client.get("/readyz").status_code == 200  # an unreadable file is skipped (logged)


def test_a_proxy_stopped_on_purpose_leaves_readyz_and_metrics(api):
    """Trial finding: a container replaced on the same volume (a new host name, a new proxy
    name) left the old proxy's last snapshot behind, "writer not running", then "stale": the API
    was not ready for a day. A clean stop retires the snapshot (``.prom.stopped``)."""
    client, folder = api
    m = ProxyMetrics(pipeline=lambda: HEALTHY | {"writer_alive": 0})  # its final snapshot: writer closed
    writer = SnapshotWriter(m, folder, "old-8080", interval_s=3600)
    writer.start()
    writer.stop()
    writer.write()
    assert client.get("/readyz").status_code == 503
    writer.retire()
    assert client.get("/readyz").json() == {"status": "ready", "database": "ok", "proxies": {}}
    got = samples(client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).content)
    assert not any(dict(labels).get("proxy") == "old-8080" for _, labels in got)
    assert (folder / "old-8080.prom.stopped").is_file() and not (folder / "old-8080.prom").exists()
    writer.retire()  # twice: nothing to rename, no error
