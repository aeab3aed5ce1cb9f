"""Query API roles: every endpoint x every kind of caller, and what a viewer may not see.

The table below is written by hand (compliance-requirements item 8): allowed -> 200, the role
lacks the permission -> 403, no valid principal (no token, a revoked or unknown one) -> 401. A
viewer reads records without their content and may not search it (``q``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from observer.api import create_app
from observer.api.app import ApiOptions
from observer.records import Block, Exchange, ToolCall, Usage
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore
from observer.store.tokens import create_token, revoke_token

BOOTSTRAP = "bootstrap-token-for-role-tests"
T0 = datetime(2025, 6, 1, 9, 0, 0, tzinfo=timezone.utc)
RECORD = "a0000000-0000-4000-8000-000000000001"
PROMPT = "PROMPTzebraquokka"
COMPLETION = "COMPLETIONwalrusnarwhal"
REASONING = "REASONINGpangolin"
ARGUMENTS = '{"city": "ARGUMENTSokapi"}'
BODY = "BODYaxolotl"
SECRETS = (PROMPT, COMPLETION, REASONING, "ARGUMENTSokapi", BODY)

# The operations (method, path, JSON body) and the callers; the expected status of each pair below.
INCIDENT = {"title": "t", "category": "other", "aware_at": "2025-06-02T00:00:00Z"}
ENDPOINTS: dict[str, tuple[str, str, Any]] = {
    "list": ("GET", "/v1/exchanges", None),
    "get": ("GET", f"/v1/exchanges/{RECORD}", None),
    "conversation": ("GET", f"/v1/conversations/{RECORD}", None),
    "stats": ("GET", "/v1/stats?group_by=model", None),
    "conformance": ("GET", "/v1/conformance?group_by=host", None),
    "replay": ("GET", f"/v1/exchanges/{RECORD}/replay", None),
    "incidents": ("GET", "/v1/incidents", None),
    "incident": ("GET", "/v1/incidents/{incident}", None),
    "open_incident": ("POST", "/v1/incidents", INCIDENT),
    "change_incident": ("PATCH", "/v1/incidents/{incident}", {"note": "seen"}),
    "holds": ("GET", "/v1/holds", None),
    "make_hold": ("POST", "/v1/holds", {"reason": "case 1", "user": "alice"}),
    "exports": ("GET", "/v1/exports", None),
    "export": ("GET", "/v1/exports/{export}", None),
    "start_export": ("POST", "/v1/exports", {"format": "jsonl", "since": "2030-01-01T00:00:00Z"}),
    "retention": ("GET", "/v1/retention", None),
    "purge": ("POST", "/v1/retention/purge", {"dry_run": True}),
    "access_log": ("GET", "/v1/access-log", None),
    "alerts": ("GET", "/v1/alerts", None),
}
#: (method, route template) of every /v1 operation the table covers; the others are tested on
#: their own below (they change state a second call would see: releasing a hold, a finished
#: export's file).
COVERED = {
    (
        m,
        p.split("?")[0]
        .replace(RECORD, "{exchange_id}")
        .replace("{incident}", "{incident_id}")
        .replace("{export}", "{job_id}"),
    )
    for m, p, _b in ENDPOINTS.values()
}
COVERED = {(m, p.replace("/v1/conversations/{exchange_id}", "/v1/conversations/{conversation_id}")) for m, p in COVERED}
OWN_TESTS = {("DELETE", "/v1/holds/{hold_id}"), ("GET", "/v1/exports/{job_id}/files/{name}")}
CALLERS = ("viewer", "auditor", "responder", "admin", "bootstrap", "none", "revoked", "unknown")
_READ = {"list": 200, "get": 200, "conversation": 200, "stats": 200, "conformance": 200, "alerts": 200}
_AUDIT = {
    "replay": 200,
    "incidents": 200,
    "incident": 200,
    "holds": 200,
    "exports": 200,
    "export": 200,
    "start_export": 202,
}
_RESPOND = {"open_incident": 201, "change_incident": 200, "make_hold": 201}
_ADMIN = {"retention": 200, "purge": 200}
_DENIED = dict.fromkeys(ENDPOINTS, 403)
EXPECTED: dict[str, dict[str, int]] = {
    "viewer": {**_DENIED, **_READ},
    "auditor": {**_DENIED, **_READ, **_AUDIT, "access_log": 200},
    "responder": {**_DENIED, **_READ, **_AUDIT, **_RESPOND},
    "admin": {**_READ, **_AUDIT, **_RESPOND, **_ADMIN, "access_log": 200},
    "bootstrap": {**_READ, **_AUDIT, **_RESPOND, **_ADMIN, "access_log": 200},
    "none": dict.fromkeys(ENDPOINTS, 401),
    "revoked": dict.fromkeys(ENDPOINTS, 401),
    "unknown": dict.fromkeys(ENDPOINTS, 401),
}


@dataclass
class Api:
    client: TestClient
    headers: dict[str, dict[str, str]]  # caller -> headers
    ids: dict[str, str]  # incident, export: made by the bootstrap caller

    def get(self, caller: str, path: str, **kwargs: Any) -> Any:
        return self.client.get(path, headers=self.headers[caller], **kwargs)

    def call(self, caller: str, endpoint: str) -> Any:
        method, path, body = ENDPOINTS[endpoint]
        if endpoint == "start_export":
            self.wait_for_exports()  # at most two run at once (409 busy): not what the table is about
        path = path.format(**self.ids) if "{" in path else path
        return self.client.request(method, path, headers=self.headers[caller], json=body)

    def wait_for_exports(self) -> None:
        import time

        for _ in range(200):
            jobs = self.get("bootstrap", "/v1/exports").json()
            if all(j["status"] != "running" for j in jobs):
                return
            time.sleep(0.05)
        raise AssertionError(f"exports still running: {jobs}")


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


@pytest.fixture
def record(make_exchange: Callable[..., Exchange]) -> Exchange:
    """One record with content in every place a viewer must not see it."""
    rec = make_exchange(RECORD, T0, model="gpt-4o", ended_at=T0 + timedelta(seconds=2))
    rec.request.messages = [{"role": "user", "content": [{"type": "text", "text": f"tell me {PROMPT}"}]}]
    rec.request.end_user = "alice"
    rec.blocks = [Block(index=0, type="reasoning", text=REASONING), Block(index=1, text=f"sure: {COMPLETION}")]
    rec.tool_calls = [ToolCall(index=0, id="call-1", name="get_weather", arguments=ARGUMENTS)]
    rec.usage = Usage(input_tokens=10, output_tokens=4, reported=True)
    rec.stop_reason = "tool_use"
    rec.response_body = BODY
    return rec


@pytest.fixture
def api(store: AuditStore, key: CheckpointKey, record: Exchange, tmp_path: Path) -> Iterator[Api]:
    store.write_many([record])
    store_id = store.store_id()
    headers: dict[str, dict[str, str]] = {
        "bootstrap": {"Authorization": f"Bearer {BOOTSTRAP}"},
        "none": {},
        "unknown": {"Authorization": "Bearer obs_" + "x" * 43},
    }
    for role in ("viewer", "auditor", "responder", "admin"):
        token, _ = create_token(store.engine, key, store_id, name=f"{role}-1", role=role, actor="test", at=T0)
        headers[role] = {"Authorization": f"Bearer {token}"}
    token, _ = create_token(store.engine, key, store_id, name="gone", role="admin", actor="test", at=T0)
    revoke_token(store.engine, key, store_id, ref="gone", actor="test", at=T0)
    headers["revoked"] = {"Authorization": f"Bearer {token}"}
    options = ApiOptions(exports_dir=tmp_path / "exports")
    with TestClient(create_app(store, BOOTSTRAP, key, options)) as client:
        incident = client.post("/v1/incidents", headers=headers["bootstrap"], json=INCIDENT).json()["id"]
        job = client.post("/v1/exports", headers=headers["bootstrap"], json={"format": "jsonl"}).json()["id"]
        api = Api(client, headers, {"incident": incident, "export": job})
        yield api
        api.wait_for_exports()  # no export thread reading while the schema is dropped


def _error(response: Any) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]


def test_the_table_covers_every_operation() -> None:
    """Every /v1 operation of the OpenAPI document is in the table or has its own test."""
    app = create_app(object(), BOOTSTRAP)  # type: ignore[arg-type]
    operations = {(m.upper(), p) for p, item in app.openapi()["paths"].items() if p.startswith("/v1") for m in item}
    assert operations == COVERED | OWN_TESTS
    assert set(EXPECTED) == set(CALLERS) and all(set(row) == set(ENDPOINTS) for row in EXPECTED.values())


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_every_role_gets_what_the_table_says(api: Api, endpoint: str) -> None:
    """Each caller on each endpoint: the status of the table, the error shape when refused."""
    got = {caller: api.call(caller, endpoint) for caller in CALLERS}
    assert {c: r.status_code for c, r in got.items()} == {c: EXPECTED[c][endpoint] for c in CALLERS}
    for response in got.values():
        if response.status_code == 401:
            assert response.headers["www-authenticate"] == "Bearer"
            assert _error(response) == {"code": "unauthorized", "message": "missing or invalid bearer token"}
        elif response.status_code == 403:
            assert _error(response)["code"] == "forbidden"
            assert "www-authenticate" not in response.headers


def test_viewer_reads_a_record_without_its_content(api: Api, record: Exchange) -> None:
    """Text, block texts, tool arguments, request messages and the response body are null; the
    metadata (model, usage, tool names, end user) stays; the raw answer holds no secret."""
    response = api.call("viewer", "get")
    assert response.status_code == 200
    body = response.json()
    assert body["content_withheld"] is True
    assert body["text"] is None
    assert [b["text"] for b in body["blocks"]] == [None, None]
    assert [b["type"] for b in body["blocks"]] == ["reasoning", "text"]
    assert body["tool_calls"] == [
        {"index": 0, "id": "call-1", "name": "get_weather", "arguments": None, "declared": False}
    ]
    assert body["request"]["messages"] is None
    assert body["response_body"] is None
    assert body["request"]["end_user"] == "alice"
    assert body["model"] == "gpt-4o"
    assert (body["usage"]["input_tokens"], body["usage"]["output_tokens"], body["usage"]["reported"]) == (10, 4, True)
    assert body["reasoning"] is None  # the record has a reasoning block: content
    for secret in SECRETS:
        assert secret not in response.text
    # The same record read by an auditor has all of it (so the strings above are really there).
    full = api.call("auditor", "get")
    assert full.json()["content_withheld"] is False
    for secret in SECRETS:
        assert secret in full.text
    assert full.json() == {
        **record.to_dict(),
        "conversation_id": full.json()["conversation_id"],
        "resumes_id": None,
        "key_owner": None,
        "content_withheld": False,
    }
    assert full.json()["reasoning"] != ""


@pytest.mark.parametrize("caller", ["auditor", "responder", "admin", "bootstrap"])
def test_content_roles_read_the_content(api: Api, caller: str) -> None:
    body = api.call(caller, "get").json()
    assert body["content_withheld"] is False
    assert body["text"] == f"sure: {COMPLETION}"
    assert body["tool_calls"][0]["arguments"] == ARGUMENTS


def test_viewer_lists_and_counts_without_content(api: Api) -> None:
    """The list and stats carry no content for anyone; a viewer gets them whole."""
    listed = api.get("viewer", "/v1/exchanges")
    assert [i["id"] for i in listed.json()["items"]] == [RECORD]
    stats = api.get("viewer", "/v1/stats?group_by=user")
    assert stats.json()["groups"] == [
        {
            "user": "alice",
            "exchanges": 1,
            "input_tokens": 10,
            "input_tokens_reported": 1,
            "output_tokens": 4,
            "output_tokens_reported": 1,
            "cache_read_input_tokens": 0,
            "cache_read_input_tokens_reported": 0,
            "cache_creation_input_tokens": 0,
            "cache_creation_input_tokens_reported": 0,
            "reasoning_output_tokens": 0,
            "reasoning_output_tokens_reported": 0,
            "usage_not_reported": 0,
        }
    ]
    for response in (listed, stats):
        for secret in SECRETS:
            assert secret not in response.text


@pytest.mark.parametrize(
    "path", ["/v1/exchanges?q=zebra", "/v1/stats?group_by=model&q=zebra", "/v1/exchanges?q=%3F%21"]
)
def test_viewer_may_not_search(api: Api, path: str) -> None:
    """q searches content: 403 for a viewer (even a q without a word), allowed to an auditor."""
    response = api.get("viewer", path)
    assert response.status_code == 403
    assert _error(response) == {"code": "forbidden", "message": "the role viewer may not search content"}
    assert api.get("auditor", path).status_code == (400 if "%3F" in path else 200)


def test_viewer_may_use_the_metadata_filters(api: Api) -> None:
    assert [i["id"] for i in api.get("viewer", "/v1/exchanges?tool=get_weather&user=alice").json()["items"]] == [RECORD]
    assert api.get("viewer", "/v1/exchanges?tool=other").json()["items"] == []


def test_an_unknown_route_needs_no_role_but_is_404(api: Api) -> None:
    """The router's 404 for anyone (a valid token or none): there is nothing there to protect."""
    for caller in ("viewer", "none"):
        response = api.get(caller, "/v1/nothing")
        assert response.status_code == 404 and _error(response)["code"] == "not_found"


def test_a_token_revoked_while_the_api_runs_is_refused_at_once(api: Api, store: AuditStore, key: CheckpointKey) -> None:
    assert api.get("auditor", "/v1/exchanges").status_code == 200
    revoke_token(store.engine, key, store.store_id(), ref="auditor-1", actor="test", at=T0)
    assert api.get("auditor", "/v1/exchanges").status_code == 401


def test_releasing_a_hold_needs_the_holds_permission(api: Api) -> None:
    """DELETE /v1/holds/{id}: 401 without a valid token, 403 for viewers and auditors; a
    responder releases it (200), after which it is released already (409)."""
    made = api.client.post("/v1/holds", headers=api.headers["bootstrap"], json={"reason": "r", "user": "alice"})
    path = f"/v1/holds/{made.json()['id']}?reason=done"
    statuses = {c: api.client.delete(path, headers=api.headers[c]).status_code for c in ("none", "viewer", "auditor")}
    assert statuses == {"none": 401, "viewer": 403, "auditor": 403}
    assert api.client.delete(path, headers=api.headers["responder"]).status_code == 200
    assert api.client.delete(path, headers=api.headers["admin"]).status_code == 409


def test_export_files_need_the_export_permission(api: Api) -> None:
    """GET /v1/exports/{id}/files/{name}: 403 for a viewer, the file for an auditor."""
    import time

    job = api.ids["export"]
    for _ in range(100):
        state = api.get("auditor", f"/v1/exports/{job}").json()
        if state["status"] != "running":
            break
        time.sleep(0.05)
    assert state["status"] == "done", state
    path = f"/v1/exports/{job}/files/manifest.json"
    assert api.get("viewer", path).status_code == 403
    assert api.get("none", path).status_code == 401
    response = api.get("auditor", path)
    assert response.status_code == 200 and response.json()["store_id"]
