"""Query API: bearer auth, record and list endpoints, one error shape, OpenAPI."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from fastapi.testclient import TestClient

from observer.api import create_app
from observer.errors import ConfigError
from observer.records import Exchange, Usage, Violation
from observer.store.store import AuditStore

TOKEN = "s3cret-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = datetime(2025, 6, 1, 9, 0, 0, tzinfo=timezone.utc)


@pytest.fixture
def records(make_exchange: Callable[..., Exchange]) -> list[Exchange]:
    """Five records, one second apart; the newest has usage and a violation beyond 2^53."""
    recs = [make_exchange(f"ex-{i}", T0 + timedelta(seconds=i)) for i in range(5)]
    recs[4].usage = Usage(input_tokens=12, output_tokens=3, reported=True)
    recs[4].violations = [Violation(kind="seq_exhausted", seq=2**53 + 1, detail="beyond 2^53")]
    return recs


@pytest.fixture
def client(store: AuditStore, records: list[Exchange]) -> Iterator[TestClient]:
    store.write_many(records)
    with TestClient(create_app(store, TOKEN)) as test_client:
        yield test_client


def _error(response: Any) -> dict[str, str]:
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]


def test_healthz_needs_no_token(client: TestClient) -> None:
    """Supervisors probe /healthz without credentials."""
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_says_whether_the_database_answers(client: TestClient) -> None:
    """Ready while the store answers; 503 "unreachable" when it does not (the proxy then keeps
    recording to its journal), without a token either way."""
    assert client.get("/readyz").json() == {"status": "ready", "database": "ok", "proxies": {}}
    down = AuditStore("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
    with TestClient(create_app(down, TOKEN)) as c:
        response = c.get("/readyz")
    down.dispose()
    assert (response.status_code, response.json()) == (
        503,
        {
            "error": {"code": "not_ready", "message": "the database does not answer"},
            "status": "not_ready",
            "database": "unreachable",
            "proxies": {},
        },
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer tökén".encode()},
    ],
    ids=["missing", "wrong", "longer", "basic-scheme", "no-scheme", "empty", "non-ascii"],
)
@pytest.mark.parametrize("path", ["/v1/exchanges", "/v1/exchanges/ex-1", "/v1/exchanges?limit=0"])
def test_data_endpoints_need_the_token(client: TestClient, headers: dict[str, Any], path: str) -> None:
    """401 with WWW-Authenticate: Bearer, before any validation (limit=0 is not reported)."""
    response = client.get(path, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert _error(response) == {"code": "unauthorized", "message": "missing or invalid bearer token"}


def test_get_returns_the_record(client: TestClient, records: list[Exchange]) -> None:
    """GET /v1/exchanges/{id} is the record's to_dict(), big integers exact."""
    response = client.get("/v1/exchanges/ex-4", headers=AUTH)
    assert response.status_code == 200
    expected = {
        **records[4].to_dict(),
        "conversation_id": "ex-4",
        "resumes_id": None,
        "key_owner": None,
        "content_withheld": False,
    }
    assert response.json() == expected
    assert list(response.json()) == list(expected)
    assert '"seq":9007199254740993' in response.text.replace(" ", "")
    assert response.json()["started_at"] == "2025-06-01T09:00:04.000000Z"


def test_get_unknown_is_404(client: TestClient) -> None:
    """A missing record has the error shape."""
    response = client.get("/v1/exchanges/nope", headers=AUTH)
    assert response.status_code == 404
    assert _error(response) == {"code": "not_found", "message": "no exchange with id 'nope'"}
    nul = client.get("/v1/exchanges/%00", headers=AUTH)  # a 500 on PostgreSQL before (trial finding)
    assert nul.status_code == 404 and _error(nul)["code"] == "not_found"


def test_unknown_route_is_404_with_the_error_shape(client: TestClient) -> None:
    """Even the router's own 404 uses the shape."""
    response = client.get("/v2/nothing", headers=AUTH)
    assert response.status_code == 404
    assert _error(response)["code"] == "not_found"


def test_method_not_allowed_has_the_error_shape(client: TestClient) -> None:
    """405 too."""
    response = client.post("/v1/exchanges", headers=AUTH)
    assert response.status_code == 405
    assert _error(response)["code"] == "method_not_allowed"


def test_list_pages_through_everything(client: TestClient) -> None:
    """limit=2 over five records: three pages, newest first, each once."""
    seen: list[str] = []
    url = "/v1/exchanges?limit=2"
    pages = []
    while True:
        response = client.get(url, headers=AUTH)
        assert response.status_code == 200
        page = response.json()
        pages.append(len(page["items"]))
        seen.extend(item["id"] for item in page["items"])
        if page["next_cursor"] is None:
            break
        url = f"/v1/exchanges?limit=2&cursor={page['next_cursor']}"
    assert seen == ["ex-4", "ex-3", "ex-2", "ex-1", "ex-0"]
    assert pages == [2, 2, 1]


def test_list_default_page_and_item(client: TestClient) -> None:
    """Default limit (50) returns all five; an item is the record summary."""
    page = client.get("/v1/exchanges", headers=AUTH).json()
    assert page["next_cursor"] is None
    assert len(page["items"]) == 5
    assert page["items"][0] == {
        "id": "ex-4",
        "dialect": "openai-chat",
        "scheme": "http",
        "host": "api.openai.com",
        "port": None,
        "path": "/v1/chat/completions",
        "method": "POST",
        "status_code": 200,
        "started_at": "2025-06-01T09:00:04.000000Z",
        "ended_at": None,
        "ttft_s": None,
        "request_id": None,
        "request_model": None,
        "end_user": None,
        "proxy_user": None,
        "key_fingerprint": None,
        "model": None,
        "usage": {
            "input_tokens": 12,
            "output_tokens": 3,
            "cache_read_input_tokens": None,
            "cache_creation_input_tokens": None,
            "reasoning_output_tokens": None,
            "total_tokens": None,
            "details": None,
            "reported": True,
        },
        "stop_reason": None,
        "error": None,
        "outcome": "completed",
        "response_bytes": 0,
        "events": 0,
        "conversation_id": "ex-4",  # its own: the first of its conversation
    }


@pytest.mark.parametrize("query", ["limit=0", "limit=501", "limit=ten", "cursor=" + "A" * 513])
def test_invalid_query_is_400(client: TestClient, query: str) -> None:
    """Validation errors use the shape, naming the parameter."""
    response = client.get(f"/v1/exchanges?{query}", headers=AUTH)
    assert response.status_code == 400
    error = _error(response)
    assert error["code"] == "invalid_parameter"
    assert error["message"].startswith("query." + query.split("=")[0])


def test_bad_cursor_is_400(client: TestClient) -> None:
    """A cursor the API did not issue."""
    response = client.get("/v1/exchanges?cursor=bm90LWEtY3Vyc29y", headers=AUTH)
    assert response.status_code == 400
    assert _error(response) == {
        "code": "invalid_cursor",
        "message": "invalid cursor; pass a next_cursor from a previous page",
    }


def test_openapi_documents_the_endpoints(client: TestClient) -> None:
    """/openapi.json and /docs are public and describe both data endpoints and their auth."""
    spec = client.get("/openapi.json")
    assert spec.status_code == 200
    paths = spec.json()["paths"]
    assert {"/v1/exchanges", "/v1/exchanges/{exchange_id}", "/healthz"} <= set(paths)
    assert paths["/v1/exchanges/{exchange_id}"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in paths["/healthz"]["get"]
    schemas = spec.json()["components"]["schemas"]
    assert {"ExchangeOut", "ExchangePage", "ErrorResponse"} <= set(schemas)
    assert "violations" in schemas["ExchangeOut"]["properties"]
    assert client.get("/docs").status_code == 200


def test_store_down_is_503_and_bugs_are_500(store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Database errors and unexpected exceptions still answer with the error shape; with the
    database down nothing can be logged, so nothing is answered but 503."""
    down = AuditStore("postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=1")
    with TestClient(create_app(down, TOKEN), raise_server_exceptions=False) as client:
        response = client.get("/v1/exchanges", headers=AUTH)
    down.dispose()
    assert response.status_code == 503
    assert _error(response)["code"] in ("store_unavailable", "access_log_unavailable")

    def bug(id: str, **_: Any) -> Any:  # noqa: A002
        raise RuntimeError("bug")

    monkeypatch.setattr(store, "get", bug)
    with TestClient(create_app(store, TOKEN), raise_server_exceptions=False) as client:
        response = client.get("/v1/exchanges/x", headers=AUTH)
    assert response.status_code == 500
    assert _error(response) == {"code": "internal_error", "message": "internal error"}


def test_empty_token_is_refused() -> None:
    """An API without a token would be open: refuse to build it."""
    with pytest.raises(ConfigError):
        create_app(object(), "")  # type: ignore[arg-type]


def test_record_with_non_object_messages_is_served(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """A request whose messages are not all objects is recorded as sent and still served."""
    rec = make_exchange("b0000000-0000-4000-8000-00000000000b", T0)
    rec.request.messages = ["hi", {"role": "user", "content": "x"}, 7]
    store.write_many([rec])
    with TestClient(create_app(store, TOKEN)) as c:
        r = c.get(f"/v1/exchanges/{rec.id}", headers=AUTH)
    assert r.status_code == 200
    assert r.json()["request"]["messages"] == ["hi", {"role": "user", "content": "x"}, 7]


def test_not_found_echoes_a_bounded_id(client: TestClient) -> None:
    """Trial finding: the 404 message echoed a 10,000-character id back."""
    r = client.get("/v1/exchanges/" + "x" * 10_000, headers=AUTH)
    assert r.status_code == 404
    assert _error(r)["message"] == "no exchange with id '" + "x" * 80 + "...'"
