"""The review page (``observer.api.ui``) in-process: sign-in, the cookie session, pages per
role, CSRF, and what a viewer's pages leave out; the browser test is
``tests/e2e/test_review_page.py``."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from observer.api import create_app
from observer.api.ui import csrf_token
from observer.records import Block, Exchange
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore
from observer.store.tokens import create_token

BOOTSTRAP = "ui-bootstrap-token-0123456789"
RECORD = "c0000000-0000-4000-8000-000000000001"
PROMPT = "PROMPTcapybara"
ANSWER = "ANSWERibis"
T0 = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture
def ui(
    store: AuditStore, make_exchange: Callable[..., Exchange], tmp_path: Path
) -> Iterator[tuple[TestClient, dict[str, str]]]:
    rec = make_exchange(RECORD, T0, model="gpt-4o")
    rec.request.messages = [{"role": "user", "content": PROMPT}]
    rec.blocks = [Block(index=0, type="text", text=ANSWER)]
    store.write_many([rec])
    key = CheckpointKey.load_or_create(tmp_path / "key.pem")
    tokens = {"bootstrap": BOOTSTRAP}
    for role in ("viewer", "auditor", "responder"):
        tokens[role], _ = create_token(store.engine, key, store.store_id(), name=role, role=role, actor="t", at=T0)
    with TestClient(create_app(store, BOOTSTRAP, key)) as client:
        yield client, tokens


def _sign_in(client: TestClient, token: str) -> Any:
    client.cookies.clear()
    response = client.post("/ui/login", content=f"token={token}", headers=FORM, follow_redirects=False)
    if response.status_code == 303:
        client.cookies.set("observer_token", token, path="/ui")  # the test client's jar ignores Path=/ui
    return response


def _log(client: TestClient) -> list[tuple[Any, ...]]:
    items = client.get("/v1/access-log", headers={"Authorization": f"Bearer {BOOTSTRAP}"}).json()["items"]
    return [(e["principal"], e["method"], e["endpoint"], e["status"], e["params"].get("authorization")) for e in items]


def test_pages_need_a_session_and_sign_in_is_logged(ui: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = ui
    first = client.get("/ui/", follow_redirects=False)
    assert (first.status_code, first.headers["location"]) == (303, "/ui/login")
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"
    assert client.get("/ui/login").status_code == 200
    bad = _sign_in(client, "not-a-token")
    assert bad.status_code == 401 and "That token is not valid." in bad.text
    good = _sign_in(client, tokens["auditor"])
    assert good.status_code == 303 and good.headers["location"] == "/ui/"
    cookie = good.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    page = client.get("/ui/")
    assert page.status_code == 200 and RECORD in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert _log(client)[:7] == [  # newest first; a POST is logged before it runs (status 0) and when answered
        ("auditor", "GET", "/ui/", 200, None),
        ("auditor", "POST", "/ui/login", 303, None),
        (None, "POST", "/ui/login", 0, "missing"),
        (None, "POST", "/ui/login", 401, "unknown"),
        (None, "POST", "/ui/login", 0, "missing"),
        (None, "GET", "/ui/login", 200, "missing"),
        (None, "GET", "/ui", 307, "missing"),
    ]
    assert all(tokens["auditor"] not in str(e) for e in _log(client))  # the token itself is never logged
    out = client.post("/ui/logout", follow_redirects=False)
    assert out.status_code == 303 and "observer_token=" in out.headers["set-cookie"]


def test_a_viewer_page_holds_no_content(ui: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = ui
    _sign_in(client, tokens["viewer"])
    page = client.get(f"/ui/exchanges/{RECORD}")
    assert page.status_code == 200 and "sees metadata and usage only" in page.text
    assert PROMPT not in page.text and ANSWER not in page.text
    assert "Open incident" not in page.text  # a viewer may not open one
    assert "Search text" not in client.get("/ui/").text
    refused = client.get("/ui/?q=PROMPTcapybara")
    assert "Your role may not search content." in refused.text and RECORD not in refused.text
    assert client.get("/ui/incidents").status_code == 403
    _sign_in(client, tokens["auditor"])
    full = client.get(f"/ui/exchanges/{RECORD}")
    assert PROMPT in full.text and ANSWER in full.text
    assert RECORD in client.get("/ui/?q=PROMPTcapybara").text


def test_filters_and_bad_values(ui: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = ui
    _sign_in(client, tokens["viewer"])
    assert RECORD in client.get("/ui/?model=gpt-4o&since=2026-11-30").text
    assert RECORD not in client.get("/ui/?model=other").text
    assert "since: not a date" in client.get("/ui/?since=yesterday").text
    assert "too long" in client.get("/ui/?host=" + "h" * 600).text
    assert client.get("/ui/exchanges/nope").status_code == 404
    conversation = client.get(f"/ui/conversations/{RECORD}")
    assert conversation.status_code == 200 and "1 exchange," in conversation.text


def test_an_incident_from_an_exchange(ui: tuple[TestClient, dict[str, str]]) -> None:
    client, tokens = ui
    _sign_in(client, tokens["responder"])
    page = client.get(f"/ui/exchanges/{RECORD}").text
    csrf = re.search(r'name="csrf" value="([0-9a-f]{64})"', page).group(1)  # type: ignore[union-attr]
    assert csrf == csrf_token(tokens["responder"])
    form = f"csrf={csrf}&exchange_id={RECORD}&title=Leak&category=death&aware_at=2026-11-30T10:00:00Z&note=n"
    made = client.post("/ui/incidents", content=form, headers=FORM, follow_redirects=False)
    assert made.status_code == 303
    incident = client.get(made.headers["location"]).text
    assert "2026-12-10T10:00:00.000000Z" in incident and RECORD in incident  # Art. 73(4): 10 days
    assert "Leak" in client.get("/ui/incidents").text
    forged = client.post("/ui/incidents", content=form.replace(csrf, "0" * 64), headers=FORM)
    assert forged.status_code == 403
    bad = client.post("/ui/incidents", content=form.replace("category=death", "category=nope"), headers=FORM)
    assert bad.status_code == 400
    assert client.get("/ui/incidents/" + "0" * 36).status_code == 404
    _sign_in(client, tokens["auditor"])
    csrf = csrf_token(tokens["auditor"])
    denied = client.post("/ui/incidents", content=form.replace(form.split("&")[0], f"csrf={csrf}"), headers=FORM)
    assert denied.status_code == 403  # an auditor reads incidents, a responder opens them
