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

import dataclasses
import functools
import json
import re
import unicodedata
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
#: Parts that make a body field name a credential wherever they occur in it (the name NFKC-
#: normalised, lower-cased, only letters and digits kept: ``db_password`` -> ``dbpassword``).
SECRET_FIELD_PARTS = (
    "secret",
    "password",
    "passwd",
    "passphrase",
    "credential",
    "apikey",
    "privatekey",
    "accesskey",
    "authorization",
    "cookie",
    "bearer",
    "connectionstring",
    "passcode",
)
#: Whole words (split at non-alphanumerics and camelCase humps) that make a name a credential.
SECRET_FIELD_WORDS = frozenset({"pwd", "pass", "jwt", "pat", "sas", "otp", "dsn"})
#: A last word that names something *about* a credential, not the credential (``password_hint``,
#: ``credential_id``, ``secret_name``, ``token_type``): such names are kept.
ABOUT_WORDS = frozenset(
    {
        "id",
        "ids",
        "name",
        "names",
        "type",
        "types",
        "provider",
        "method",
        "mode",
        "hint",
        "issuer",
        "style",
        "enabled",
        "required",
        "expiry",
        "expires",
        "ttl",
        "length",
        "count",
        "version",
        "format",
        "policy",
        "scope",
        "scopes",
        "url",
        "uri",
        "path",
        "file",
        "ref",
        "arn",
    }
)
#: Words before a final ``token`` that make it a vocabulary or paging token, not a credential.
VOCAB_WORDS = frozenset(
    {
        "stop",
        "eos",
        "bos",
        "pad",
        "unk",
        "sep",
        "cls",
        "mask",
        "start",
        "end",
        "image",
        "audio",
        "video",
        "forced",
        "special",
        "page",
        "continuation",
        "max",
        "min",
        "first",
        "last",
        "next",
        "prev",
        "previous",
        "decoder",
    }
)
#: Words before a final ``key`` that make it a lookup key, not a credential (``prompt_cache_key``).
LOOKUP_WORDS = frozenset(
    {
        "cache",
        "idempotency",
        "sort",
        "partition",
        "routing",
        "group",
        "dedup",
        "dedupe",
        "deduplication",
        "primary",
        "foreign",
        "lookup",
        "conversation",
        "thread",
        "trace",
        "correlation",
        "object",
        "hash",
        "range",
        "message",
        "event",
        "state",
        "hot",
        "shortcut",
        "unique",
        "template",
        "prompt",
        "lora",
        "adapter",
        "model",
        "feature",
        "experiment",
        "variant",
        "cohort",
        "flag",
        "item",
        "entry",
        "map",
        "dict",
        "row",
        "column",
        "field",
        "sorting",
    }
)
#: Trailing words dropped before the ``key``/``token`` tests (``openai_key_1``, ``api_token_v2``,
#: ``token_value``).
_SUFFIX_WORDS = frozenset({"value", "val", "str", "string"})
#: Words before a final ``tokens`` that make it a list of credentials (``access_tokens``).
_TOKEN_KINDS = frozenset({"access", "refresh", "id", "auth", "session", "bearer", "api", "security", "oauth"})
#: JSON Schema keywords whose object maps names of properties or definitions to sub-schemas, in
#: an object that is a schema (one of ``_SCHEMA_MARKS``); a name there is a field name only if its value is
#: not a schema (a string or number is tested as usual).
SCHEMA_NAME_MAPS = frozenset(
    {
        "properties",
        "patternProperties",
        "$defs",
        "definitions",
        "defs",
        "dependentSchemas",
        "dependentRequired",
        "dependencies",
    }
)
_SCHEMA_MARKS = frozenset({"type", "$ref", "$schema", "anyOf", "oneOf", "allOf", "items", "required", "enum"})
#: Strings that are credentials whatever name holds them (anchored, linear): an HTTP
#: ``Authorization`` value, OpenAI/Anthropic keys, GitHub tokens, AWS access key ids, Google API
#: keys, Slack tokens, JWTs.
_SECRET_VALUE = re.compile(
    r"(?:(?:(?:proxy-)?authorization\s*:\s*)?"
    r"(?:(?:bearer|token)\s+[A-Za-z0-9._~+/=-]{16,}|basic\s+[A-Za-z0-9+/]{12,}=*)"
    r"|(?-i:sk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{30,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35}|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}))",
    re.IGNORECASE,
)
# Where a ``_SECRET_VALUE`` can start, lower-cased (``redact_shaped`` finds them with ``str.find``:
# a regex search over a 64 KiB body took 7-15 ms of the proxy's loop, the finds ~0.3 ms).
_SECRET_STARTS = (
    "bearer",
    "token",
    "basic",
    "authorization",
    "proxy-authorization",
    "sk-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "akia",
    "aiza",
    "xoxa-",
    "xoxb-",
    "xoxp-",
    "xoxo-",
    "xoxs-",
    "xoxr-",
    "eyj",
)
MAX_SHAPE_CANDIDATES = 1000  # places ``redact_shaped`` tries in one text; past it the text is replaced whole
_FIELD_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^\W\d_]+")
_NOT_ALNUM = re.compile(r"[\W_]+")
_VERSION = re.compile(r"v?[0-9]+")
_WS_SPLIT = re.compile(r"(\s+)")
_AUTHORITY_END = re.compile(r"[/?#]")
_MIN_ECHO = 8  # shortest removed value that ``scrub`` looks for (characters): shorter ones are too common
MAX_SCRUB_VALUES = 64  # removed values ``scrub`` searches for, longest first (bounded work per record)
MAX_URLS = 1000  # URLs examined in one string; a string with more is replaced whole (bounded work)
MAX_NAME = 256  # characters of a field name examined; a longer name is taken for a credential's
MAX_CHARS = 8 << 20  # characters of names and strings examined per request part (bounded work)
MAX_QUERY_CHARS = 256 << 10  # characters of URL queries parsed per request part (bounded work)
MAX_QUERY = 8192  # characters of a URL's query or fragment parsed; a longer one is replaced whole
MAX_FIELDS = 50_000  # values ``redact_request`` examines per request part; a part with more is not kept


def is_secret_param(name: str) -> bool:
    """True for query parameter names that carry credentials (see the module docstring), and
    for any name ``is_secret_field`` takes for one (``apiToken``, ``clientSecret``)."""
    lowered = name.lower()
    if lowered in SECRET_QUERY_NAMES:
        return True
    return any(word in SECRET_QUERY_WORDS for word in _WORD_SPLIT.split(lowered)) or is_secret_field(name)


def redact_path(path: str, removed: list[str] | None = None) -> str:
    """Returns ``path`` (with query) with the values of credential parameters replaced by
    ``REDACTED``; other parameters and their order are kept. A path without a query, or
    without credential parameters, is returned unchanged; a query longer than ``MAX_QUERY``
    characters is replaced whole. What was replaced is appended to ``removed`` (for ``scrub``:
    an upstream's error may quote the URL)."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    new = _redact_pairs(query, removed)  # (bounded: trial, a 15 MB query took 8.8 s of the loop)
    return path if new is query else base + "?" + new


def is_secret_field(name: str) -> bool:
    """True for a request-body field name that carries a credential. The name is NFKC-normalised
    (``ｐａｓｓｗｏｒｄ`` -> ``password``); ``compact`` is it lower-cased with only letters and
    digits, ``words`` its words (split at other characters and camelCase humps:
    ``azureADToken`` -> azure, ad, token), with a trailing number, version or ``value`` word
    dropped for the ``key``/``token`` tests (``openai_key_1``, ``api_token_v2``). Not a
    credential when its last word is in ``ABOUT_WORDS`` (``password_hint``, ``credential_id``,
    ``secret_name``). A credential when ``compact`` contains one of ``SECRET_FIELD_PARTS``
    (``client_secret``, ``dbPassword``, ``api_keys``); or it ends in ``token`` and no word
    before is in ``VOCAB_WORDS`` (``token``, ``hf_token``, ``azure_ad_token``; not
    ``stop_token``, ``next_page_token``); or it ends in ``tokens`` after one of
    ``_TOKEN_KINDS`` (``access_tokens``; not ``max_tokens``); or its last word is ``key`` or
    ``keys`` and the word before is not in ``LOOKUP_WORDS`` (``key``, ``master_key``; not
    ``prompt_cache_key``); or its last word is ``auth`` (``x-auth``, not ``auth_user``); or a
    word is in ``SECRET_FIELD_WORDS`` (``pwd``, ``jwt``, ``github_pat``). A name longer than
    ``MAX_NAME`` characters is taken for a credential's without examining it (no real parameter
    is that long; bounded work: trial finding, 15 MB names took seconds). Results for names up
    to ``MAX_NAME`` are cached (4,096 of them: at most ~1 MiB)."""
    if len(name) > MAX_NAME:
        return True
    return _is_secret_field(name)


@functools.lru_cache(maxsize=4096)
def _is_secret_field(name: str) -> bool:
    name = unicodedata.normalize("NFKC", name)
    words = [w.lower() for w in _FIELD_WORDS.findall(name)]
    if not words or words[-1] in ABOUT_WORDS:
        return False
    compact = _NOT_ALNUM.sub("", name.lower())
    if any(part in compact for part in SECRET_FIELD_PARTS):
        return True
    stem = list(words)
    while len(stem) > 1 and (_VERSION.fullmatch(stem[-1]) or stem[-1] in _SUFFIX_WORDS or stem[-1] == "v"):
        stem.pop()
    last, before = stem[-1], stem[:-1]
    if last.endswith("token"):
        return (not before or before[-1] not in VOCAB_WORDS) and last[:-5] not in VOCAB_WORDS
    if last == "tokens":
        return bool(before) and before[-1] in _TOKEN_KINDS
    if last in ("key", "keys"):
        return not before or before[-1] not in LOOKUP_WORDS
    if last == "auth" or (last == "header" and "auth" in before):
        return True
    return any(w in SECRET_FIELD_WORDS for w in words)


def redact_string(value: str, removed: list[str] | None = None, query_budget: list[int] | None = None) -> str:
    """``value`` with the secret parts of every URL in it replaced by ``REDACTED``: the
    user-info's password (``postgres://u:REDACTED@db``) or a user-info without one
    (``https://REDACTED@github.com``: a token), and the values of credential parameters
    (``is_secret_param``) in its query and fragment (``#access_token=``); a whole string that is
    a credential by its shape (``_SECRET_VALUE``: ``Bearer ...``, ``sk-...``, ``ghp_...``, a JWT)
    becomes ``REDACTED``, and so does a string with more than ``MAX_URLS`` URLs (bounded work).
    What was replaced is appended to ``removed``. ``query_budget`` (``[characters]``, shared by
    the strings of one request part) is decreased by every query parsed; past zero,
    ``OverflowError`` (parsing is the costly step: ~0.3 µs per character). Linear in the length
    (URLs are found by ``str.find``, their parts by ``partition``: no backtracking regex over the
    whole string; trial finding: a regex took 20 s on a 256 KB string, on the proxy's loop)."""
    if len(value) >= 8 and _SECRET_VALUE.fullmatch(
        value.strip() if value[0].isspace() or value[-1].isspace() else value
    ):
        if removed is not None:
            removed.append(value)
        return REDACTED
    if "://" not in value:
        return value
    if value.count("://") > MAX_URLS:
        if removed is not None:
            removed.append(value)
        return REDACTED
    parts = _WS_SPLIT.split(value) if not value.isprintable() or " " in value else [value]
    changed = False
    for i, part in enumerate(parts):
        if "://" in part:
            new = _redact_url(part, removed, query_budget)
            if new != part:
                parts[i] = new
                changed = True
    return "".join(parts) if changed else value


def _redact_url(text: str, removed: list[str] | None, query_budget: list[int] | None = None) -> str:
    """One whitespace-free piece of text holding ``://`` (see ``redact_string``)."""
    out: list[str] = []
    pos = 0
    while True:
        at = text.find("://", pos)
        if at < 0:
            out.append(text[pos:])
            break
        start = at + 3
        n = len(text)
        m = _AUTHORITY_END.search(text, start)
        end = m.start() if m else n
        authority = text[start:end]
        userinfo, sep, host = authority.rpartition("@")
        out.append(text[pos:start])
        if sep and userinfo:
            user, colon, password = userinfo.partition(":")
            secret = password if colon else user
            if removed is not None and secret:
                removed.append(secret)
            out.append((user + ":" + REDACTED if colon else REDACTED) + "@" + host)
        else:
            out.append(authority)
        # path, query and fragment up to the next URL
        nxt = text.find("://", end)
        stop = n if nxt < 0 else max(end, _url_stop(text, end, nxt))
        out.append(_redact_query(text[end:stop], removed, query_budget))
        pos = stop
    return "".join(out)


def _url_stop(text: str, end: int, nxt: int) -> int:
    """Where the URL that ends its authority at ``end`` ends when another ``://`` follows at
    ``nxt``: before that URL's scheme (the letters, digits, ``+.-`` right before ``nxt``)."""
    i = nxt
    while i > end and (text[i - 1].isalnum() or text[i - 1] in "+.-"):
        i -= 1
    return i


def _redact_query(rest: str, removed: list[str] | None, query_budget: list[int] | None = None) -> str:
    """Path, query and fragment of a URL with credential parameters' values redacted; each
    parsed once, and one longer than ``MAX_QUERY`` characters replaced whole."""
    if "?" not in rest and "#" not in rest:
        return rest
    head, hsep, frag = rest.partition("#")
    path, qsep, query = head.partition("?")
    if qsep:
        query = _redact_pairs(query, removed, query_budget)
    if hsep and "=" in frag:
        frag = _redact_pairs(frag, removed, query_budget)
    return path + qsep + query + hsep + frag


def _redact_pairs(query: str, removed: list[str] | None, query_budget: list[int] | None = None) -> str:
    if len(query) > MAX_QUERY:
        if removed is not None:
            removed.append(query)
        return REDACTED
    if query_budget is not None:
        query_budget[0] -= len(query)
        if query_budget[0] < 0:
            raise OverflowError("too many URL query characters")
    pairs = parse_qsl(query, keep_blank_values=True)
    secret = [is_secret_param(k) for k, _ in pairs]
    if not any(secret):
        return query
    if removed is not None:
        removed.extend(v for (_, v), s in zip(pairs, secret, strict=True) if s)
    return urlencode([(k, REDACTED if s else v) for (k, v), s in zip(pairs, secret, strict=True)])


def redact_fields(
    value: Any, removed: list[str] | None = None, budget: int = MAX_FIELDS, char_budget: int = MAX_CHARS
) -> int:
    """Redacts ``value`` (JSON: dicts, lists, scalars) **in place** and returns how many values
    were replaced by ``REDACTED``: everything under a credential name (``is_secret_field``) that
    is not ``null``, a boolean, empty or a JSON reference (``#/...``), and the secret parts of any
    string (``redact_string``).
    In an object that is a JSON Schema (it has one of ``_SCHEMA_MARKS``), the names in its ``SCHEMA_NAME_MAPS``
    are property names: one whose value is a sub-schema (an object or a boolean), or for
    ``dependentRequired``/``dependencies`` a list of names, is not tested. The string forms of
    what was replaced are appended to ``removed`` (for ``scrub``). Iterative, so any nesting the
    JSON parser accepted is walked. Examines at most ``budget`` values and raises
    ``OverflowError`` past it (the caller drops the part: bounded work on the proxy's loop;
    trial finding: 880k keys took 1.8 s), and likewise past ``char_budget`` characters of names
    and strings or ``MAX_QUERY_CHARS`` characters of URL queries (49,000 URLs of 75 query pairs
    took 10.8 s). A label/value pair (``{"name": "Authorization", "value": ...}``, ``{"key":
    "OPENAI_API_KEY", "value": ...}``) has its value redacted when the label is a credential
    name; the label itself stays (a two-item list is not taken for a pair: a schema's
    ``"required": ["password", "username"]`` is one). In place because the request facts own
    what the dialect parsed from the body."""
    n = 0
    seen = 0
    chars = 0
    query_budget = [MAX_QUERY_CHARS]
    stack: list[tuple[Any, str | None]] = [(value, None)]
    while stack:
        v, schema_map = stack.pop()
        tv = type(v)
        if tv is dict or isinstance(v, dict):
            seen += len(v)
            if seen > budget:
                raise OverflowError(f"more than {budget} values")
            maps_here = not _SCHEMA_MARKS.isdisjoint(v)
            label = v.get("name", v.get("key")) if "value" in v else None
            if type(label) is str and is_secret_field(label) and v["value"] not in (None, "", True, False):
                if removed is not None:
                    _leaves(v["value"], removed)
                v["value"] = REDACTED
                n += 1
            for k, item in v.items():
                ti = type(item)
                if item is None or ti is bool:
                    continue
                if type(k) is str:
                    chars += len(k)
                    secret_name = is_secret_field(k) and not (label is not None and k in ("name", "key"))
                else:
                    secret_name = False
                if schema_map is not None and (
                    ti is dict
                    or (
                        schema_map in ("dependentRequired", "dependencies")
                        and ti is list
                        and all(type(x) is str for x in item)
                    )
                ):
                    stack.append((item, None))
                    continue
                if ti is str:
                    chars += len(item)
                    if chars > char_budget:
                        raise OverflowError(f"more than {char_budget} characters")
                if secret_name:
                    if item == "" or item == [] or item == {} or (ti is str and item[:2] == "#/"):
                        continue  # nothing, or a JSON reference (a discriminator's ``mapping``)
                    if removed is not None:
                        _leaves(item, removed)
                    v[k] = REDACTED
                    n += 1
                elif ti is str:
                    new = redact_string(item, removed, query_budget)
                    if new is not item:
                        v[k] = new
                        n += 1
                elif ti is dict or ti is list:
                    stack.append((item, k if maps_here and ti is dict and k in SCHEMA_NAME_MAPS else None))
        elif tv is list or isinstance(v, list):
            seen += len(v)
            if seen > budget:
                raise OverflowError(f"more than {budget} values")
            for i, item in enumerate(v):
                ti = type(item)
                if ti is str:
                    chars += len(item)
                    if chars > char_budget:
                        raise OverflowError(f"more than {char_budget} characters")
                    new = redact_string(item, removed, query_budget)
                    if new is not item:
                        v[i] = new
                        n += 1
                elif ti is dict or ti is list:
                    stack.append((item, None))
    return n


def _leaves(value: Any, out: list[str]) -> None:
    """Appends the string forms of the string and number leaves of ``value`` to ``out`` (at
    most ``MAX_SCRUB_VALUES`` * 4 in all: ``scrub`` uses the longest ``MAX_SCRUB_VALUES``)."""
    stack = [value]
    while stack and len(out) < MAX_SCRUB_VALUES * 4:
        v = stack.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append(str(v))
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def redact_request(facts: RequestFacts) -> tuple[list[str], list[str]]:
    """Redacts ``facts.parameters``, ``facts.metadata`` and ``facts.tools`` in place
    (``redact_fields``), and ``end_user``, ``model`` and ``tool_names`` (``redact_string``: they
    are copied from the body before it was redacted). ``request_id`` is left for the record to
    compare with the stream's (``request_id_mismatch``); ``redact_record`` redacts both.
    Returns ``(removed, dropped)``: the values removed (for ``scrub``; kept only in memory until
    the flow's record is made) and the names of the parts that held more than ``MAX_FIELDS``
    values, ``MAX_CHARS`` characters or ``MAX_QUERY_CHARS`` of URL queries, which are replaced by
    an empty one (they cannot be
    checked in bounded time; the caller records a violation)."""
    removed: list[str] = []
    dropped: list[str] = []
    for name in ("parameters", "metadata", "tools"):
        part = getattr(facts, name)
        try:
            redact_fields(part, removed)
        except OverflowError:
            setattr(facts, name, [] if isinstance(part, list) else {})
            dropped.append(name)
    for name in ("end_user", "model"):
        v = getattr(facts, name)
        if isinstance(v, str):
            setattr(facts, name, redact_string(v, removed))
    facts.tool_names = [redact_string(t, removed) if isinstance(t, str) else t for t in facts.tool_names]
    return _longest(removed), dropped


def _longest(removed: list[str]) -> list[str]:
    """The distinct removed values ``scrub`` looks for: at least ``_MIN_ECHO`` characters, the
    ``MAX_SCRUB_VALUES`` longest, longest first (so a value that contains another goes whole)."""
    return sorted({r for r in removed if len(r) >= _MIN_ECHO}, key=len, reverse=True)[:MAX_SCRUB_VALUES]


def _echo_forms(removed: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Each value of ``_longest(removed)`` with the forms an echo may take: as it is and
    JSON-escaped (quotes, non-ASCII as ``\\u`` escapes, slashes as PHP escapes them)."""
    out = []
    for secret in _longest(removed):
        escaped = json.dumps(secret)[1:-1]
        forms = (secret, escaped, escaped.replace("/", "\\/"), json.dumps(secret, ensure_ascii=False)[1:-1])
        out.append((secret, tuple(dict.fromkeys(forms))))
    return out


def scrub(text: str | None, removed: list[str]) -> str | None:
    """``text`` with every occurrence of a removed value (``_longest``) replaced by
    ``REDACTED``: in any of its ``_echo_forms`` and at the very end cut short (an echo cut by the
    record's body limit). Bounded: at most ``MAX_SCRUB_VALUES`` * 4 searches of ``text``."""
    if not text or not removed:
        return text
    return _scrub(text, _echo_forms(removed))


def _scrub(text: str | None, echoes: list[tuple[str, tuple[str, ...]]]) -> str | None:
    if not text or not echoes:
        return text
    for _, forms in echoes:
        for form in forms:
            if form in text:
                text = text.replace(form, REDACTED)
    for secret, _ in echoes:  # a tail that is the start of a secret (the body limit cut the echo)
        tail = text[-min(len(secret) - 1, 256) :]
        i = tail.find(secret[0])
        while 0 <= i <= len(tail) - _MIN_ECHO:
            if secret.startswith(tail[i:]):
                text = text[: len(text) - len(tail) + i] + REDACTED
                break
            i = tail.find(secret[0], i + 1)
    return text


def redact_shaped(text: str | None) -> str | None:
    """``text`` with every run shaped like a credential (``_SECRET_VALUE``: ``Bearer ...``,
    ``sk-...``, ``AKIA...``, a JWT, ...) replaced by ``REDACTED``, wherever it stands: for the
    parts of a record that may echo what the observer never saw as a value (a request body it
    could not parse, a header). Bounded: the places a shape can start are found with ``str.find``
    and each is tried once; a text with more than ``MAX_SHAPE_CANDIDATES`` of them is replaced
    whole."""
    if not text or len(text) < _MIN_ECHO:
        return text
    low = text.lower()
    starts: list[int] = []
    for prefix in _SECRET_STARTS:
        i = low.find(prefix)
        while i >= 0:
            starts.append(i)
            if len(starts) > MAX_SHAPE_CANDIDATES:
                return REDACTED  # bounded work: too many places to try one by one
            i = low.find(prefix, i + 1)
    if not starts:
        return text
    out: list[str] = []
    last = 0
    for i in sorted(starts):
        if i < last or (i and (text[i - 1].isalnum() or text[i - 1] in "_-")):
            continue  # inside a replaced run, or inside a word (``risk-``, ``mytoken``)
        m = _SECRET_VALUE.match(text, i)
        if m:
            out += (text[last:i], REDACTED)
            last = m.end()
    if not out:
        return text
    out.append(text[last:])
    return "".join(out)


def header_secrets(headers: Any) -> list[str]:
    """The credential values of request ``headers`` (name -> value; names any case): every
    header whose name is a credential's (``is_secret_field``: ``Authorization``,
    ``x-api-key``, ``api-key``, ``x-goog-api-key``, ``Cookie``), whole and, after an auth
    scheme (``Bearer x``), without it. Headers are never stored; these are only looked for as
    echoes (``scrub``)."""
    out: list[str] = []
    for name, value in headers.items():
        if value and is_secret_field(name):
            out.append(value)
            scheme, _, credential = value.partition(" ")
            if credential and scheme.isalpha():
                out.append(credential.strip())
    return out


#: The record's response identity fields, redacted as the request ids are (``redact_record``).
_IDENTITY_FIELDS = ("response_id", "system_fingerprint", "service_tier")


def redact_record(record: Any, removed: list[str]) -> None:
    """The last pass over a finished record (``observer.records.Exchange``), in place: echoes
    of ``removed`` values (``scrub``) leave ``response_body``, the error, ``transport_error``,
    (which also lose any credential-shaped run: ``redact_shaped``),
    the request ids (the request's and the one the stream gave), the response's identity
    (``response_id``, ``system_fingerprint``, ``service_tier``: a server or a header may echo the
    caller's key as an id; trial finding) and violation details; a credential in any of those ids
    (``redact_string``) goes too. The echo forms are built once for all of them."""
    echoes = _echo_forms(removed) if removed else []
    record.response_body = redact_shaped(_scrub(record.response_body, echoes))
    if record.error is not None:
        record.error.message = redact_shaped(_scrub(record.error.message, echoes))
        record.error.code = _scrub(record.error.code, echoes)
    record.transport_error = redact_shaped(_scrub(record.transport_error, echoes))
    ids = [(record, "request_id"), (record.request, "request_id"), *((record, n) for n in _IDENTITY_FIELDS)]
    for holder, name in ids:
        value = getattr(holder, name)
        if isinstance(value, str):
            setattr(holder, name, _scrub(redact_string(value), echoes))
    if echoes and record.violations:
        record.violations = [
            dataclasses.replace(v, detail=_scrub(v.detail, echoes)) if v.detail else v for v in record.violations
        ]
