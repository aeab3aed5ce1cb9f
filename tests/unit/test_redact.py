"""Credentials in query strings never reach the record (trial finding: password, x-api-key,
code, secret, X-Amz-*, X-Goog-Signature, client_secret, refresh_token were kept in clear)."""

from __future__ import annotations

import pytest

from observer.redact import redact_path


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
