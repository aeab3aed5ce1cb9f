"""Credentials in query strings never reach the record (trial finding: password, x-api-key,
code, secret, X-Amz-*, X-Goog-Signature, client_secret, refresh_token were kept in clear)."""

from __future__ import annotations

import pytest

from observer.records import RequestFacts
from observer.redact import is_secret_field, redact_fields, redact_path, redact_request


@pytest.mark.parametrize(
    "name",
    ["key", "api_key", "API-KEY", "x-api-key", "apikey", "access_token", "access-token", "refresh_token", "id_token",
     "token", "client_secret", "secret", "password", "passwd", "pwd", "sig", "signature", "code", "X-Amz-Signature",
     "X-Amz-Credential", "X-Amz-Security-Token", "X-Goog-Signature", "X-Goog-Credential", "auth", "authorization",
     "session", "jwt"],
)  # fmt: skip
def test_secret_names_redacted(name):
    assert redact_path(f"/v1/x?{name}=s3cr3t&model=m") == f"/v1/x?{name}=REDACTED&model=m"


def test_other_parameters_and_paths_unchanged():
    assert redact_path("/v1beta/models/gemini:streamGenerateContent?alt=sse") == (
        "/v1beta/models/gemini:streamGenerateContent?alt=sse"
    )
    assert redact_path("/v1/stream") == "/v1/stream"
    assert redact_path("/a?alt=sse&key=k1&key=k2") == "/a?alt=sse&key=REDACTED&key=REDACTED"


@pytest.mark.parametrize("name", ["keyboard", "max_tokens", "monkey", "alt", "model", "tokens_used", "page"])
def test_ordinary_names_kept(name):
    """Trial finding: keyboard=2 was redacted; max_tokens would have been."""
    assert redact_path(f"/v1/x?{name}=2") == f"/v1/x?{name}=2"


# --- request bodies (trial finding: ``api_key`` in an OpenAI-compatible body was stored verbatim) ---


@pytest.mark.parametrize(
    "name",
    ["api_key", "apiKey", "API_KEY", "apikey", "openai_api_key", "x-api-key", "token", "access_token", "accessToken",
     "refresh_token", "id_token", "aws_session_token", "aws_secret_access_key", "aws_access_key_id",
     "vertex_credentials", "authorization", "authorization_token", "client_secret", "secret", "password", "db.password",
     "privateKey", "jwt", "signature"],
)  # fmt: skip
def test_secret_field_names(name):
    assert is_secret_field(name)


@pytest.mark.parametrize(
    "name",
    ["prompt_cache_key", "idempotency_key", "key", "max_tokens", "max_completion_tokens", "maxOutputTokens",
     "budget_tokens", "stop_token", "eos_token", "tokens", "keyboard", "user", "safety_identifier", "cachedContent",
     "previous_response_id", "service_tier", "temperature", ""],
)  # fmt: skip
def test_ordinary_field_names(name):
    """Real generation parameters end in ``key`` and ``tokens``; they stay readable."""
    assert not is_secret_field(name)


def test_redact_fields_replaces_secret_strings_at_any_depth_in_place():
    params = {
        "api_key": "sk-live-1",
        "temperature": 0.2,
        "prompt_cache_key": "user-42",
        "mcp_servers": [{"name": "crm", "url": "https://mcp.example", "authorization_token": "tok-9"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {
            "properties": {"password": {"type": "string"}}, "required": ["password"]}}},
        "extra": {"aws_secret_access_key": "", "token": None, "access_token": 5},
    }  # fmt: skip
    assert redact_fields(params) == 2
    assert params == {
        "api_key": "REDACTED",
        "temperature": 0.2,
        "prompt_cache_key": "user-42",
        "mcp_servers": [{"name": "crm", "url": "https://mcp.example", "authorization_token": "REDACTED"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {
            "properties": {"password": {"type": "string"}}, "required": ["password"]}}},
        "extra": {"aws_secret_access_key": "", "token": None, "access_token": 5},
    }  # fmt: skip


def test_redact_fields_walks_any_nesting_without_recursion():
    """orjson accepts 1024 levels, Python's recursion limit is 1000: the walk is iterative."""
    root: dict = {}
    cur = root
    for _ in range(5000):
        cur["n"] = [{}]
        cur = cur["n"][0]
    cur["password"] = "hunter2"
    assert redact_fields(root) == 1
    assert cur == {"password": "REDACTED"}
    assert redact_fields({"a": [1, "x", [None]]}) == 0
    assert redact_fields("api_key") == 0


def test_redact_request_covers_parameters_and_metadata_only():
    facts = RequestFacts(
        model="m",
        messages=[{"role": "user", "content": "my password is hunter2", "password": "kept"}],
        tools=[{"type": "function", "function": {"name": "login", "parameters": {"properties": {"token": "x"}}}}],
        parameters={"api_key": "sk-1", "max_tokens": 5},
        metadata={"session_token": "s-1", "team": "a"},
    )
    assert redact_request(facts) == 2
    assert facts.parameters == {"api_key": "REDACTED", "max_tokens": 5}
    assert facts.metadata == {"session_token": "REDACTED", "team": "a"}
    assert facts.messages == [{"role": "user", "content": "my password is hunter2", "password": "kept"}]
    assert facts.tools[0]["function"]["parameters"] == {"properties": {"token": "x"}}
