"""Redaction of credentials from what the record keeps (API keys are never stored).

Headers are never recorded at all. What is recorded and may carry a credential:

- **The query string** (``redact_path``). Vendors and clouds accept credentials there (Gemini
  ``?key=``, Azure SAS ``sig=``, AWS SigV4 ``X-Amz-Signature``/``X-Amz-Credential``/
  ``X-Amz-Security-Token``, GCS ``X-Goog-Signature``, OAuth ``access_token``/``code``/
  ``client_secret``). A parameter name is split into words at ``-``, ``_`` and ``.`` and matched
  case-insensitively: the whole name against ``SECRET_QUERY_NAMES``, each word against
  ``SECRET_QUERY_WORDS`` (so ``x-api-key`` and ``refresh_token`` match, ``keyboard`` and
  ``max_tokens`` do not).
- **The request body's parameters and metadata** (``redact_fields``): OpenAI-compatible gateways
  take the upstream's key in the body (LiteLLM: ``api_key``, ``aws_secret_access_key``,
  ``aws_session_token``, ``vertex_credentials``), Anthropic's MCP connector an
  ``authorization_token`` per server, and free-form ``metadata`` can hold anything. Body names are
  matched more narrowly than query names, because real generation parameters end in ``key`` or
  ``tokens`` (``prompt_cache_key``, ``max_tokens``): see ``is_secret_field``. Messages and tool
  declarations are not touched (a tool's JSON schema may declare a ``password`` property; it is
  a schema, not a secret).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode

from observer.records import RequestFacts

REDACTED = "REDACTED"
SECRET_QUERY_NAMES = frozenset(
    {"sig", "code", "pwd", "auth", "session", "sessionid", "jwt", "sas", "apikey", "passwd", "accesstoken", "authtoken"}
)
SECRET_QUERY_WORDS = frozenset(
    {"key", "token", "secret", "password", "passwd", "signature", "credential", "credentials", "authorization"}
)
_WORD_SPLIT = re.compile(r"[-_.]")
#: Body field words that make a name a credential wherever they appear (``client_secret``,
#: ``db_password``, ``vertex_credentials``, ``authorization_token``).
SECRET_FIELD_WORDS = frozenset(
    {"secret", "password", "passwd", "credential", "credentials", "authorization", "signature", "jwt"}
)
#: Words that, right before a final ``token``, make it a credential (``access_token``; not
#: ``stop_token`` or ``eos_token``, which are vocabulary tokens).
_TOKEN_KINDS = frozenset({"access", "refresh", "id", "auth", "session", "bearer", "api", "security", "oauth"})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def is_secret_param(name: str) -> bool:
    """True for query parameter names that carry credentials (see the module docstring)."""
    lowered = name.lower()
    if lowered in SECRET_QUERY_NAMES:
        return True
    return any(word in SECRET_QUERY_WORDS for word in _WORD_SPLIT.split(lowered))


def redact_path(path: str) -> str:
    """Returns ``path`` (with query) with the values of credential parameters replaced by
    ``REDACTED``; other parameters and their order are kept. A path without a query, or
    without credential parameters, is returned unchanged."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(is_secret_param(k) for k, _ in pairs):
        return path
    return base + "?" + urlencode([(k, REDACTED if is_secret_param(k) else v) for k, v in pairs])


def is_secret_field(name: str) -> bool:
    """True for a request-body field name that carries a credential. The name is split into
    words at ``-``, ``_``, ``.`` and camelCase humps and lower-cased; it is a credential when it
    ends in ``api key`` (``api_key``, ``apiKey``, ``openai_api_key``) or is ``apikey``; ends in
    ``token`` that stands alone or follows one of ``_TOKEN_KINDS`` (``token``,
    ``access_token``, ``aws_session_token``); contains ``access key`` or ``private key``
    (``aws_access_key_id``); or has a word in ``SECRET_FIELD_WORDS``. Not credentials:
    ``prompt_cache_key``, ``idempotency_key``, ``max_tokens``, ``budget_tokens``, ``stop_token``."""
    words = [w for w in _WORD_SPLIT.split(_CAMEL.sub("_", name).lower()) if w]
    if not words:
        return False
    if words[-1] == "apikey" or words[-2:] == ["api", "key"]:
        return True
    if words[-1] == "token" and (len(words) == 1 or words[-2] in _TOKEN_KINDS):
        return True
    pairs = set(zip(words, words[1:]))
    if ("access", "key") in pairs or ("private", "key") in pairs:
        return True
    return any(w in SECRET_FIELD_WORDS for w in words)


def redact_fields(value: Any) -> int:
    """Replaces, **in place**, every non-empty string held under a credential name
    (``is_secret_field``) anywhere in ``value`` (JSON: dicts, lists, scalars) by ``REDACTED``;
    returns how many were replaced. Other values under such names are kept (``"password":
    {"type": "string"}`` in a response schema is not a secret). Iterative, so any nesting the
    JSON parser accepted is walked; never raises on JSON input. In place because the request
    facts own what the dialect parsed from the body (no one else holds it)."""
    n = 0
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if isinstance(item, str):
                    if item and isinstance(k, str) and is_secret_field(k):
                        v[k] = REDACTED
                        n += 1
                elif isinstance(item, (dict, list)):
                    stack.append(item)
        elif isinstance(v, list):
            stack.extend(item for item in v if isinstance(item, (dict, list)))
    return n


def redact_request(facts: RequestFacts) -> int:
    """Redacts ``facts.parameters`` and ``facts.metadata`` in place (``redact_fields``); returns
    how many values were replaced. Called on every parsed request before it joins a record."""
    return redact_fields(facts.parameters) + redact_fields(facts.metadata)
