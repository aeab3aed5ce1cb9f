"""Issue 14 item 2 through a real ``observer run``: after known traffic, ``GET /metrics`` on the
API port has the proxy's counts and token sums (draft §5.5's complete example reports
``input_tokens: 42, output_tokens: 8`` per exchange; an HTTP 429 answer reports none)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.harness import LLM_CONTENT_TYPE, ObserverProcess, observer_cli_available
from tests.e2e.upstream import UpstreamServer

pytestmark = pytest.mark.e2e


def scrape(obs: ObserverProcess) -> dict[tuple[str, frozenset], float]:
    r = httpx.get(f"{obs.api_url}/metrics", headers={"Authorization": f"Bearer {obs.token}"}, timeout=5)
    r.raise_for_status()
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = {k: v for k, v in s.labels.items() if k != "proxy"}
            out[(s.name, frozenset(labels.items()))] = s.value
    return out


def test_metrics_after_known_traffic(upstream: UpstreamServer) -> None:
    ok, why = observer_cli_available()
    if not ok:
        pytest.skip(f"observer CLI not available: {why}")
    body = json.dumps({"version": "1.0", "stream": True, "model": "m", "messages": [{"role": "user", "content": "x"}]})
    with ObserverProcess() as obs:
        with httpx.Client(proxy=obs.proxy_url, verify=obs.ca_path, timeout=20) as client:
            for n in range(3):
                r = client.post(
                    upstream.url(f"/v1/stream?tid=m-{n}", tls=True),
                    content=body,
                    headers={"content-type": LLM_CONTENT_TYPE},
                )
                assert r.status_code == 200
            r = client.post(
                upstream.url("/v1/stream?status=429&tid=m-err", tls=True),
                content=body,
                headers={"content-type": LLM_CONTENT_TYPE},
            )
            assert r.status_code == 429
        host = "127.0.0.1"
        completed = (
            "observer_exchanges_total",
            frozenset({"dialect": "llm-stream-1.0", "model": "example-model", "outcome": "completed"}.items()),
        )
        deadline = time.monotonic() + 20
        got = scrape(obs)
        while got.get(completed) != 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            got = scrape(obs)
        assert got.get(completed) == 3, sorted(k for k in got if k[0] == "observer_exchanges_total")
        err = (
            "observer_exchanges_total",
            frozenset({"dialect": "llm-stream-1.0", "model": "m", "outcome": "http_error"}.items()),
        )
        assert got[err] == 1
        assert got[("observer_host_exchanges_total", frozenset({"host": host, "outcome": "completed"}.items()))] == 3
        tokens = {"dialect": "llm-stream-1.0", "model": "example-model"}
        assert got[("observer_tokens_total", frozenset({**tokens, "type": "input"}.items()))] == 3 * 42
        assert got[("observer_tokens_total", frozenset({**tokens, "type": "output"}.items()))] == 3 * 8
        assert (
            got[("observer_usage_not_reported_total", frozenset({"dialect": "llm-stream-1.0", "model": "m"}.items()))]
            == 1
        )
        assert (
            got[("observer_time_to_first_token_seconds_count", frozenset({"dialect": "llm-stream-1.0"}.items()))] == 3
        )
        assert got[("observer_records_journaled_total", frozenset())] == 4
        stored_deadline = time.monotonic() + 10
        while got.get(("observer_records_stored_total", frozenset())) != 4 and time.monotonic() < stored_deadline:
            time.sleep(0.5)
            got = scrape(obs)
        assert got[("observer_records_stored_total", frozenset())] == 4
        assert got[("observer_records_dropped_total", frozenset())] == 0
        assert got[("observer_database_up", frozenset())] == 1
        assert got[("observer_db_write_seconds_count", frozenset())] >= 1
        ready = httpx.get(f"{obs.api_url}/readyz", timeout=5).json()
        assert ready["status"] == "ready" and list(ready["proxies"].values()) == ["ok"], ready
