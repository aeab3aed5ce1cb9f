"""schemathesis against the running API (a real uvicorn server on 127.0.0.1), on SQLite and
PostgreSQL: for every operation of the OpenAPI document, bounded generated requests (valid and
invalid ones), none answered with a 5xx, and every error in the one error shape.

The store holds a few records, an incident and a hold, so that ids exist; the bootstrap (admin)
token is sent, so every route runs past authorisation. ``EXAMPLES`` per operation keeps the run
under a minute per engine.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings

from observer.api.app import ApiOptions, create_app
from observer.records import Exchange
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore

TOKEN = "fuzz-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 25
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api_url(store: AuditStore, make_exchange: Callable[..., Exchange], tmp_path: Path) -> Iterator[str]:
    store.write_many(
        [make_exchange(f"f000000{i}-0000-4000-8000-000000000000", T0 + timedelta(minutes=i)) for i in range(3)]
    )
    key = CheckpointKey.load_or_create(tmp_path / "key.pem")
    app = create_app(store, TOKEN, key, ApiOptions(exports_dir=tmp_path / "exports"))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/healthz", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    httpx.post(
        base + "/v1/incidents",
        headers=AUTH,
        json={"title": "t", "category": "other", "aware_at": "2026-11-02T00:00:00Z", "exchange_ids": []},
        timeout=10,
    ).raise_for_status()
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_no_operation_answers_5xx(api_url: str) -> None:
    """Every operation, EXAMPLES generated requests each: no 5xx; errors have the one shape."""
    schema = schemathesis.openapi.from_url(api_url + "/openapi.json")
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call(headers=AUTH, timeout=30)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query}: {response.status_code} {response.text[:200]}"
                )
            elif response.status_code >= 400:
                body = response.json()
                if set(body) != {"error"} or set(body["error"]) != {"code", "message"}:
                    failures.append(f"{case.method} {case.formatted_path}: error shape {body!r:.200}")

        check()
    assert operations >= 15, operations
    assert failures == [], "\n".join(failures[:20])
