"""Issue 14 item 3 through a real ``observer run``: an undeclared tool call (draft §8.2) fires
the rule of the alerts file; a local webhook receives it (JSON and Slack bodies), and the API
lists it with its deliveries."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.harness import ObserverProcess, observer_cli_available, stream_request, wait_until
from tests.e2e.upstream import UpstreamServer

pytestmark = pytest.mark.e2e


def test_an_undeclared_tool_call_alerts_a_webhook_and_is_stored(upstream: UpstreamServer, tmp_path) -> None:
    ok, why = observer_cli_available()
    if not ok:
        pytest.skip(f"observer CLI not available: {why}")
    got: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append((self.path, json.loads(self.rfile.read(int(self.headers["content-length"])))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}"
    rules = tmp_path / "alerts.toml"
    rules.write_text(
        f'[[webhook]]\nname = "secops"\nurl = "{hook}/json"\n\n'
        f'[[webhook]]\nname = "chat"\nurl = "{hook}/slack"\nformat = "slack"\n\n'
        '[[rule]]\nname = "undeclared tool"\nwhen = "undeclared_tool"\nseverity = "critical"\n'
    )
    try:
        with ObserverProcess(sets={"observer_alerts_file": str(rules)}) as obs:
            req = {
                "version": "1.0",
                "model": "m",
                "stream": True,
                "tools": [],
                "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
            }
            res = stream_request(
                upstream.url("/v1/stream?script=tool_flow&tid=alert-1&gap_ms=10"), proxy=obs.proxy_url, json_body=req
            )
            assert res.error is None
            wait_until(lambda: len(got) == 2, 20, what="two webhook deliveries")
            bodies = dict(got)
            assert bodies["/json"]["rule"] == "undeclared tool" and bodies["/json"]["severity"] == "critical"
            assert bodies["/json"]["summary"] == "undeclared tool call get_weather on 127.0.0.1"
            assert bodies["/slack"]["text"].startswith("[critical] undeclared tool: undeclared tool call get_weather")
            api = obs.api()
            record_id = bodies["/json"]["exchange_id"]
            assert api.get(record_id)["tool_calls"][0]["name"] == "get_weather"
            deadline = time.monotonic() + 10
            while True:
                (item,) = api.request("/v1/alerts").json()["items"]
                if item["deliveries"] == {"secops": "delivered", "chat": "delivered"} or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert item["deliveries"] == {"secops": "delivered", "chat": "delivered"}
            assert item["exchange_id"] == record_id and item["kind"] == "undeclared_tool"
            api.close()
    finally:
        server.shutdown()
