"""Redaction of credentials from what the record keeps (API keys are never stored).

Headers are never recorded at all. What is recorded and may carry a credential:

- **The query string** (``redact_path``). Vendors and clouds accept credentials there (Gemini
  ``?key=``, Azure SAS ``sig=``, AWS SigV4 ``X-Amz-Signature``/``X-Amz-Credential``/
  ``X-Amz-Security-Token``, GCS ``X-Goog-Signature``, OAuth ``access_token``/``code``/
  ``client_secret``). A parameter name is split into words at ``-``, ``_`` and ``.`` and matched
  case-insensitively: the whole name against ``SECRET_QUERY_NAMES``, each word against
  ``SECRET_QUERY_WORDS`` (so ``x-api-key`` and ``refresh_token`` match, ``keyboard`` and
  ``max_tokens`` do not).
- **The request body's parameters, metadata and tool declarations** (``redact_request``):
  OpenAI-compatible gateways take upstream credentials in the body (LiteLLM: ``api_key``,
  ``aws_secret_access_key``, ``aws_session_token``, ``aws_web_identity_token``,
  ``vertex_credentials``, ``azure_ad_token``), OpenAI's Responses API an MCP tool's
  ``authorization`` and ``headers``, and free-form ``metadata`` can hold anything. A field name
  is a credential by ``is_secret_field``: stricter about ``key`` and ``token`` than the query rule,
  because real generation parameters end in them (``prompt_cache_key``, ``max_tokens``,
  ``stop_token``), looser about ``secret``/``password``/``credential``/``apikey`` (matched
  anywhere in the name: ``dbPassword``, ``openAIApiKey``; lossy for ``password_hint``, safe).
  Everything under such a name is replaced, whatever its shape (a list of keys, a service
  account object), except ``null``, booleans and empty values. Names of JSON Schema properties
  and definitions (``properties``, ``$defs``, ...) are not field names: a tool or
  ``response_format`` schema may declare a ``password`` property, and it stays. Any string
  holding a URL keeps its host but loses a password in its user-info
  (``postgres://u:REDACTED@db``) and the values of credential query parameters.
- **Echoes of those values** (``scrub``): an upstream's validation error may quote the request
  (``{"loc": ["body", "api_key"], "input": "sk-..."}``); every value removed from the request
  is also removed from the record's ``response_body`` and error message. Messages are kept as
  sent: what users typed is the record.
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
#: Parts that make a body field name a credential wherever they occur in it (lower-cased, only
#: letters and digits kept: ``db_password`` -> ``dbpassword``, ``openAIApiKey`` -> ``openaiapikey``).
SECRET_FIELD_PARTS = (
    "secret", "password", "passwd", "passphrase", "credential", "apikey", "privatekey", "accesskey",
    "authorization", "cookie", "bearer",
)  # fmt: skip
#: Whole words (split at ``-_. `` and camelCase humps) that make a body field name a credential.
SECRET_FIELD_WORDS = frozenset({"auth", "pwd", "pass", "jwt", "signature", "sas", "otp"})
#: Names ending in ``token`` that are vocabulary or paging tokens, not credentials (compact form).
NOT_SECRET_TOKENS = frozenset(
    {"stoptoken", "eostoken", "bostoken", "padtoken", "unktoken", "septoken", "clstoken", "masktoken", "starttoken",
     "endtoken", "pagetoken", "nextpagetoken", "prevpagetoken", "previouspagetoken", "continuationtoken",
     "maxtoken", "mintoken", "lasttoken", "firsttoken"}
)  # fmt: skip
#: Names ending in the word ``key`` that name a lookup key, not a credential (compact form).
NOT_SECRET_KEYS = frozenset(
    {"promptcachekey", "idempotencykey", "cachekey", "sortkey", "partitionkey", "routingkey", "groupkey", "dedupkey",
     "dedupekey", "deduplicationkey", "primarykey", "foreignkey", "lookupkey", "conversationkey", "threadkey",
     "tracekey", "correlationkey", "objectkey", "hashkey", "rangekey", "messagekey", "eventkey", "statekey",
     "hotkey", "shortcutkey", "uniquekey", "keyboardkey"}
)  # fmt: skip
#: Words before a final ``tokens`` that make it a list of credentials (``access_tokens``).
_TOKEN_KINDS = frozenset({"access", "refresh", "id", "auth", "session", "bearer", "api", "security", "oauth"})
#: Keys whose object maps names of JSON Schema things (properties, definitions), not fields.
SCHEMA_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "defs", "mapping", "dependentSchemas",
     "dependentRequired"}
)  # fmt: skip
_FIELD_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_NOT_ALNUM = re.compile(r"[^a-z0-9]")
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)([^\s/?#@]+)(@)")
_MIN_ECHO = 6  # shortest removed value that ``scrub`` looks for (characters): shorter ones are too common


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
    """True for a request-body field name that carries a credential. ``compact`` is the name
    lower-cased with only letters and digits; ``words`` its words (split at any other character
    and at camelCase humps: ``azureADToken`` -> azure, ad, token). A credential when ``compact``
    contains one of ``SECRET_FIELD_PARTS`` (``client_secret``, ``dbPassword``, ``api_keys``,
    ``aws_access_key_id``); or it ends in ``token`` and is not in ``NOT_SECRET_TOKENS``
    (``token``, ``hf_token``, ``azure_ad_token``; not ``stop_token``, ``next_page_token``); or
    it ends in ``tokens`` after one of ``_TOKEN_KINDS`` (``access_tokens``; not ``max_tokens``);
    or its last word is ``key`` and it is not in ``NOT_SECRET_KEYS`` (``key``, ``master_key``,
    ``openai_key``; not ``prompt_cache_key``); or a word is in ``SECRET_FIELD_WORDS`` (``auth``,
    ``pwd``, ``jwt``)."""
    compact = _NOT_ALNUM.sub("", name.lower())
    if not compact:
        return False
    if any(part in compact for part in SECRET_FIELD_PARTS):
        return True
    if compact.endswith("token"):
        return compact not in NOT_SECRET_TOKENS
    words = [w.lower() for w in _FIELD_WORDS.findall(name)]
    if not words:
        return False
    if words[-1] == "tokens":
        return len(words) > 1 and words[-2] in _TOKEN_KINDS
    if words[-1] == "key":
        return compact not in NOT_SECRET_KEYS
    return any(w in SECRET_FIELD_WORDS for w in words)


def redact_string(value: str) -> str:
    """``value`` with a URL's user-info password and its credential query parameters
    (``is_secret_param``) replaced by ``REDACTED``; other strings are returned as they are."""
    if "://" not in value:
        return value
    out = _URL_USERINFO.sub(lambda m: m.group(1) + REDACTED + m.group(3), value)
    if "?" in out and " " not in out:
        out = redact_path(out)
    return out


def redact_fields(value: Any, removed: list[str] | None = None) -> int:
    """Redacts ``value`` (JSON: dicts, lists, scalars) **in place** and returns how many values
    were replaced by ``REDACTED``: everything under a credential name (``is_secret_field``)
    that is not ``null``, a boolean or empty, and the secret parts of URLs in any string
    (``redact_string``). Keys of an object held under one of ``SCHEMA_NAME_MAPS`` are names of
    schema properties, not fields: they are not tested (their values are walked). The string
    forms of the values replaced (the leaves of a replaced list or object) are appended to
    ``removed`` (for ``scrub``). Iterative, so any nesting the JSON parser accepted is walked;
    never raises on JSON input. In place because the request facts own what the dialect parsed
    from the body (no one else holds it)."""
    n = 0
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        v, names_are_schema = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if item is None or item is True or item is False:
                    continue
                if not names_are_schema and isinstance(k, str) and is_secret_field(k):
                    if item == "" or item == [] or item == {}:
                        continue
                    if removed is not None:
                        _leaves(item, removed)
                    v[k] = REDACTED
                    n += 1
                elif isinstance(item, str):
                    new = redact_string(item)
                    if new is not item and new != item:
                        v[k] = new
                        n += 1
                elif isinstance(item, (dict, list)):
                    stack.append((item, isinstance(k, str) and k in SCHEMA_NAME_MAPS and isinstance(item, dict)))
        elif isinstance(v, list):
            for i, item in enumerate(v):
                if isinstance(item, str):
                    new = redact_string(item)
                    if new is not item and new != item:
                        v[i] = new
                        n += 1
                elif isinstance(item, (dict, list)):
                    stack.append((item, False))
    return n


def _leaves(value: Any, out: list[str]) -> None:
    """Appends the string forms of the string and number leaves of ``value`` to ``out``."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(str(v))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def redact_request(facts: RequestFacts) -> list[str]:
    """Redacts ``facts.parameters``, ``facts.metadata`` and ``facts.tools`` in place
    (``redact_fields``); returns the values removed (for ``scrub``; kept only in memory until
    the flow's record is made). Called on every parsed request before it joins a record."""
    removed: list[str] = []
    for part in (facts.parameters, facts.metadata, facts.tools):
        redact_fields(part, removed)
    return removed


def scrub(text: str | None, removed: list[str]) -> str | None:
    """``text`` with every occurrence of a removed value at least ``_MIN_ECHO`` characters long
    replaced by ``REDACTED`` (longest first, so a value that contains another goes whole)."""
    if not text or not removed:
        return text
    for secret in sorted({r for r in removed if len(r) >= _MIN_ECHO}, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text
