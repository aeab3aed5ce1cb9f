"""Alerts (issue 14 item 3): the rules file, the rules' evaluation on hand-made records and
pipeline values, and delivery to webhooks on a local HTTP server (JSON and Slack bodies,
retries with backoff, no retry of a 4xx), each alert stored with its deliveries."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from observer.alerting.delivery import AlertDispatcher, slack_text
from observer.alerting.rules import Alert, AlertConfig, AlertEngine, load_alert_config
from observer.errors import ConfigError
from observer.records import Exchange, ToolCall, Violation
from observer.store import alerts as alert_rows
from observer.store.store import AuditStore

T0 = 1_780_000_000.0


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "alerts.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[[rule]]\nname = 'a'\nwhen = 'sometimes'\n", "rule.0.when: Input should be"),
        ("[[rule]]\nname = 'a'\nwhen = 'error_rate'\nthreshold = 3\n", "the threshold of error_rate is a share, 0-1"),
        ("[[rule]]\nname = 'a'\nwhen = 'content_filter'\nwebhooks = ['x']\n", "rule a: no webhook named x"),
        ("[[webhook]]\nname = 'w'\nurl = 'ftp://x'\n", "a webhook url is http:// or https://"),
        (
            "[[webhook]]\nname = 'w'\nurl = 'http://x'\n[[webhook]]\nname = 'w'\nurl = 'http://y'\n",
            "webhook names must be unique: w",
        ),
        (
            "[[rule]]\nname = 'a'\nwhen = 'content_filter'\ncolour = 'red'\n",
            "rule.0.colour: Extra inputs are not permitted",
        ),
        (
            "[[webhook]]\nname = 'w'\nurl = 'http://x'\nheaders = { Authorization = 'env:NO_SUCH_VAR_XYZ' }\n",
            "names NO_SUCH_VAR_XYZ, which is not set",
        ),
        ("rule = [", "is not TOML"),
    ],
)
def test_a_bad_alerts_file_is_one_clear_error(tmp_path, text, error):
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_alert_config(write(tmp_path, text))


def test_a_missing_alerts_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the alerts file"):
        load_alert_config(tmp_path / "none.toml")


def record(**over) -> Exchange:
    base = dict(
        id="rec-1",
        dialect="openai.chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/1.1",
        started_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
        model="gpt-4o",
        outcome="completed",
    )
    return Exchange(**(base | over))


def config(*rules: dict, hooks: tuple[dict, ...] = ()) -> AlertConfig:
    return AlertConfig.model_validate({"rule": list(rules), "webhook": list(hooks)})


def test_record_rules_fire_on_the_record_and_respect_the_cooldown():
    engine = AlertEngine(
        config(
            {"name": "tools", "when": "undeclared_tool", "cooldown_s": 60, "severity": "critical"},
            {"name": "filter", "when": "content_filter", "cooldown_s": 0},
        ),
        "proxy-a",
    )
    undeclared = record(
        id="rec-2",
        tool_calls=[ToolCall(0, "c1", "rm_rf", "{}", False), ToolCall(1, "c2", "get_weather", "{}", True)],
        violations=[Violation("undeclared_tool", None, "rm_rf")],
    )
    (alert,) = engine.on_record(undeclared, T0)
    assert (alert.rule, alert.kind, alert.severity, alert.exchange_id) == (
        "tools",
        "undeclared_tool",
        "critical",
        "rec-2",
    )
    assert alert.summary == "undeclared tool call rm_rf on api.openai.com"
    assert alert.details == {"tools": ["rm_rf"], "model": "gpt-4o", "dialect": "openai.chat", "host": "api.openai.com"}
    assert alert.fired_at == datetime.fromtimestamp(T0, timezone.utc) and alert.proxy == "proxy-a"
    assert engine.on_record(undeclared, T0 + 30) == []  # cooldown: counted, not sent
    assert engine.on_record(undeclared, T0 + 40) == []
    (again,) = engine.on_record(undeclared, T0 + 61)
    assert again.details["suppressed_since_last"] == 2
    assert engine.on_record(record(), T0 + 200) == []  # nothing to say
    filtered = record(stop_reason="content_filter", stop_reason_raw="content_filter")
    assert [a.kind for a in engine.on_record(filtered, T0)] == ["content_filter"]
    assert [a.kind for a in engine.on_record(filtered, T0 + 1)] == ["content_filter"]  # cooldown 0


def test_rate_rules_need_enough_exchanges_and_forget_the_old_ones():
    engine = AlertEngine(
        config({"name": "errors", "when": "error_rate", "threshold": 0.25, "window_s": 60, "min_exchanges": 8}),
        "p",
    )
    for n in range(6):
        engine.on_record(record(outcome="error" if n < 3 else "completed"), T0 + n)
    assert engine.on_tick({}, T0 + 6) == []  # 3 of 6: over 25 %, but only 6 exchanges
    for _ in range(2):
        engine.on_record(record(outcome="http_error"), T0 + 7)
    (alert,) = engine.on_tick({}, T0 + 8)  # 5 of 8 = 62.5 %
    assert alert.details == {"exchanges": 8, "matching": 5, "share": 0.625, "threshold": 0.25}
    assert alert.summary == "error rate 62% over 60 s"
    engine2 = AlertEngine(config({"name": "trunc", "when": "truncation_rate", "window_s": 10, "min_exchanges": 1}), "p")
    engine2.on_record(record(outcome="truncated"), T0)
    assert engine2.on_tick({}, T0 + 11) == []  # out of the window


def test_pipeline_rules_fire_on_new_drops_gaps_a_full_journal_and_a_long_outage():
    engine = AlertEngine(
        config(
            {"name": "drops", "when": "record_dropped", "cooldown_s": 0},
            {"name": "gaps", "when": "recording_gap", "cooldown_s": 0},
            {"name": "spool", "when": "spool_filling", "threshold": 0.5, "cooldown_s": 0},
            {"name": "db", "when": "database_down", "threshold": 30, "cooldown_s": 0},
        ),
        "p",
    )
    quiet = {"records_dropped": 0, "gaps_stored": 0, "spool_bytes": 10, "spool_max_bytes": 100, "database_up": 1}
    assert engine.on_tick(quiet, T0) == []
    bad = quiet | {
        "records_dropped": 3,
        "gaps_stored": 1,
        "spool_bytes": 60,
        "database_up": 0,
        "spool_oldest_age_seconds": 45,
    }
    fired = {a.rule: a for a in engine.on_tick(bad, T0 + 5)}
    assert sorted(fired) == ["db", "drops", "gaps", "spool"]
    assert fired["drops"].summary == "3 records dropped" and fired["drops"].details == {"new": 3.0, "total": 3.0}
    assert fired["gaps"].summary == "1 gap records stored"
    assert fired["spool"].summary == "the journal holds 60% of its bound"
    assert fired["db"].summary == "records wait for the database for 45 s"
    assert sorted(a.rule for a in engine.on_tick(bad, T0 + 10)) == ["db", "spool"]  # no new drops or gaps


# ----- delivery to a real local HTTP server -----


class Receiver:
    """A local webhook receiver: ``answers`` per path (status codes, consumed in order; then 200)."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict, dict]] = []
        self.answers: dict[str, list[int]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                receiver.got.append((self.path, dict(self.headers), body))
                queue = receiver.answers.get(self.path, [])
                self.send_response(queue.pop(0) if queue else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.got]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()


def until(pred, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_alerts_reach_json_and_slack_webhooks_with_retries_and_are_stored(receiver, store: AuditStore, monkeypatch):
    monkeypatch.setenv("TEST_HOOK_TOKEN", "hook-secret")
    cfg = config(
        {"name": "tools", "when": "undeclared_tool", "webhooks": ["json", "slack", "flaky"]},
        {"name": "gone", "when": "content_filter", "webhooks": ["missing"]},
        hooks=(
            {"name": "json", "url": f"{receiver.url}/json", "headers": {"Authorization": "env:TEST_HOOK_TOKEN"}},
            {"name": "slack", "url": f"{receiver.url}/slack", "format": "slack"},
            {"name": "flaky", "url": f"{receiver.url}/flaky"},
            {"name": "missing", "url": f"{receiver.url}/missing"},
        ),
    )
    receiver.answers = {"/flaky": [500, 503], "/missing": [404]}
    engine = AlertEngine(cfg, "proxy-a")
    store_fns = (
        lambda row: alert_rows.add_alert(store.engine, row),
        lambda i, d: alert_rows.set_deliveries(store.engine, i, d),
    )
    dispatcher = AlertDispatcher(cfg, engine, lambda: {}, store_fns, backoff_s=(0.05, 0.1), tick_s=0.05)
    dispatcher.start()
    try:
        undeclared = record(
            id="rec-9",
            tool_calls=[ToolCall(0, "c", "rm_rf", "{}", False)],
            violations=[Violation("undeclared_tool", None, "")],
        )
        (alert,) = engine.on_record(undeclared, time.time())
        dispatcher.submit([alert])
        dispatcher.submit(engine.on_record(record(id="rec-10", stop_reason="content_filter"), time.time()))
        until(lambda: dispatcher.delivered == 3 and dispatcher.failed == 1)
    finally:
        dispatcher.close()
    assert sorted(receiver.paths()) == ["/flaky", "/flaky", "/flaky", "/json", "/missing", "/slack"]  # 404: once
    (json_headers, json_body) = next((h, b) for p, h, b in receiver.got if p == "/json")
    assert json_headers["Authorization"] == "hook-secret"
    assert json_body == alert.to_dict()
    assert json_body["exchange_id"] == "rec-9" and json_body["rule"] == "tools" and "rm_rf" in json_body["summary"]
    slack = next(b for p, _, b in receiver.got if p == "/slack")
    assert slack == {"text": slack_text(alert)}
    assert slack["text"].startswith("[warning] tools: undeclared tool call rm_rf on api.openai.com (proxy proxy-a, ")
    rows = {r["rule"]: r for r in alert_rows.list_alerts(store.engine)}
    assert rows["tools"]["deliveries"] == {"json": "delivered", "slack": "delivered", "flaky": "delivered"}
    assert rows["gone"]["deliveries"] == {"missing": "failed: HTTP 404"}
    assert rows["tools"]["exchange_id"] == "rec-9" and rows["tools"]["severity"] == "warning"


def test_an_unreachable_webhook_gives_up_after_its_attempts(store: AuditStore):
    cfg = config(
        {"name": "f", "when": "content_filter"},
        hooks=({"name": "down", "url": "http://127.0.0.1:9/x", "timeout_s": 0.5},),
    )
    engine = AlertEngine(cfg, "p")
    store_fns = (
        lambda row: alert_rows.add_alert(store.engine, row),
        lambda i, d: alert_rows.set_deliveries(store.engine, i, d),
    )
    dispatcher = AlertDispatcher(cfg, engine, lambda: {}, store_fns, backoff_s=(0.01,), max_attempts=3, tick_s=0.05)
    dispatcher.start()
    try:
        dispatcher.submit(engine.on_record(record(stop_reason="content_filter"), time.time()))
        until(lambda: dispatcher.failed == 1)
    finally:
        dispatcher.close()
    (row,) = alert_rows.list_alerts(store.engine)
    assert row["deliveries"] == {"down": "failed: ConnectError after 3 attempts"}


def test_a_delivery_cut_off_by_the_shutdown_says_so(store: AuditStore, caplog):
    """Trial finding: a webhook still being retried when the proxy stopped was logged and stored
    as "failed after 6 attempts", as if given up on; it was cut off after 1 of 8."""
    cfg = config(
        {"name": "f", "when": "content_filter"},
        hooks=({"name": "down", "url": "http://127.0.0.1:9/x", "timeout_s": 0.5},),
    )
    engine = AlertEngine(cfg, "p")
    store_fns = (
        lambda row: alert_rows.add_alert(store.engine, row),
        lambda i, d: alert_rows.set_deliveries(store.engine, i, d),
    )
    dispatcher = AlertDispatcher(cfg, engine, lambda: {}, store_fns, backoff_s=(60.0,), max_attempts=8, tick_s=0.05)
    dispatcher.start()
    try:
        dispatcher.submit(engine.on_record(record(stop_reason="content_filter"), time.time()))
        until(
            lambda: alert_rows.list_alerts(store.engine)
        )  # stored; the webhook's first attempt failed or is under way
    finally:
        dispatcher.close()
    (row,) = alert_rows.list_alerts(store.engine)
    # 1 or 2 attempts: the close may come before the first attempt has failed, or after it (then
    # the retry due in 60 s is made at once, as the last attempt of the shutdown)
    assert re.fullmatch(r"not delivered: stopped after [12] attempts \(ConnectError\)", row["deliveries"]["down"])
    assert re.search(r"not done at shutdown, after [12] of 8 attempts \(last: ConnectError\)", caplog.text)
    assert "failed after" not in caplog.text


def test_a_store_that_refuses_first_still_gets_the_alert_and_the_webhook_is_not_held_back(receiver):
    cfg = config({"name": "f", "when": "content_filter"}, hooks=({"name": "w", "url": f"{receiver.url}/w"},))
    rows: list[dict] = []
    fails = [RuntimeError("db down"), RuntimeError("db down")]

    def add(row: dict) -> None:
        if fails:
            raise fails.pop()
        rows.append(row)

    engine = AlertEngine(cfg, "p")
    dispatcher = AlertDispatcher(cfg, engine, lambda: {}, (add, lambda i, d: None), backoff_s=(0.2,), tick_s=0.05)
    dispatcher.start()
    try:
        dispatcher.submit(engine.on_record(record(stop_reason="content_filter"), time.time()))
        until(lambda: receiver.paths() == ["/w"])
        assert rows == []  # delivered while the store still refused
        until(lambda: len(rows) == 1)
    finally:
        dispatcher.close()
    assert rows[0]["deliveries"] == {"w": "delivered"}


def test_the_queue_is_bounded():
    cfg = config({"name": "f", "when": "content_filter"})
    dispatcher = AlertDispatcher(cfg, AlertEngine(cfg, "p"), lambda: {}, None, queue_max=2)
    alerts = [Alert("f", "content_filter", "warning", "s", datetime.now(timezone.utc), "p") for _ in range(5)]
    dispatcher.submit(alerts)
    assert dispatcher.dropped == 3


def test_ticks_evaluate_the_pipeline_off_the_loop(receiver):
    cfg = config({"name": "drops", "when": "record_dropped"}, hooks=({"name": "w", "url": f"{receiver.url}/w"},))
    values = {"records_dropped": 0}
    dispatcher = AlertDispatcher(cfg, AlertEngine(cfg, "p"), lambda: dict(values), None, tick_s=0.05)
    dispatcher.start()
    try:
        time.sleep(0.2)
        values["records_dropped"] = 2
        until(lambda: receiver.paths() == ["/w"])
    finally:
        dispatcher.close()
    assert receiver.got[0][2]["summary"] == "2 records dropped"


def test_alerts_are_listed_by_the_api(store: AuditStore):
    from fastapi.testclient import TestClient

    from observer.api import create_app

    at = datetime(2026, 12, 1, 10, tzinfo=timezone.utc)
    for n, rule in enumerate(("a", "b", "a")):
        a = Alert(
            rule, "content_filter", "info", f"s{n}", at + timedelta(minutes=n), "p", {"n": n}, f"rec-{n}", id=f"id-{n}"
        )
        alert_rows.add_alert(store.engine, {**a.to_dict(), "fired_at": a.fired_at, "deliveries": {}})
    alert_rows.add_alert(store.engine, {**a.to_dict(), "fired_at": a.fired_at, "deliveries": {}})  # a retry: kept once
    with TestClient(create_app(store, "alerts-token-0123456789")) as client:
        auth = {"Authorization": "Bearer alerts-token-0123456789"}
        assert client.get("/v1/alerts").status_code == 401
        body = client.get("/v1/alerts", headers=auth).json()
        assert [i["id"] for i in body["items"]] == ["id-2", "id-1", "id-0"]
        assert body["items"][0] == {
            "id": "id-2",
            "fired_at": "2026-12-01T10:02:00.000000Z",
            "rule": "a",
            "kind": "content_filter",
            "severity": "info",
            "summary": "s2",
            "proxy": "p",
            "exchange_id": "rec-2",
            "details": {"n": 2},
            "deliveries": {},
        }
        only_a = client.get("/v1/alerts", params={"rule": "a", "since": "2026-12-01T10:01:00Z"}, headers=auth).json()
        assert [i["id"] for i in only_a["items"]] == ["id-2"]
