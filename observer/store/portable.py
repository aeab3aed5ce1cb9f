"""Makes a record storable and servable by every supported database and by the API, in the
writer thread (never on the proxy's event loop).

- PostgreSQL ``text`` and ``jsonb`` cannot hold U+0000 (JSON allows ``\\u0000`` in strings):
  it is replaced by U+FFFD on every backend, so records stay identical across SQLite and
  PostgreSQL, and one ``unstorable_character`` violation names the fields that changed.
- A whole-number float of 2^53 or more in request JSON becomes the exact integer it is (see
  ``WHOLE_FLOAT_MIN``), and -0.0 becomes 0.0: PostgreSQL's ``jsonb`` would give both back as
  other numbers, and the record read back (and its chain hash) must be the one written.
- JSON nested deeper than ``MAX_JSON_DEPTH`` levels (a 2 KB request of 1000 brackets was enough
  to crash recursive code and to make the API's serialiser fail) is cut: the too-deep value is
  replaced by a marker string and one ``unstorable_character`` violation says so.

Iterative (explicit stack), so no input depth can raise ``RecursionError``; cost is one pass over
the record's strings and containers.
"""

from __future__ import annotations

from typing import Any

from observer.records import Exchange, Violation, ViolationKind

NUL = "\x00"
REPLACEMENT = "\ufffd"
MAX_JSON_DEPTH = 64  # levels of nesting kept in request JSON (the API serialises up to ~250)
DEPTH_MARKER = "<nested deeper than 64 levels: not stored>"
DEEP = "deep:"  # prefix of a hit that is a depth cut, not a NUL
#: Whole-number floats from this magnitude on are stored as the integer they are exactly:
#: PostgreSQL's jsonb keeps ``1e300`` as the decimal 10^300, not the float's own value, so the
#: record read back (and its chain hash, ``observer.store.chain``) would differ.
WHOLE_FLOAT_MIN = float(2**53)


def _clean(value: Any, path: str, hits: list[str]) -> Any:
    """``value`` with NUL replaced in every string (keys too) and containers cut at
    ``MAX_JSON_DEPTH``; appends ``path`` to ``hits`` once per change kind found."""
    if isinstance(value, str):
        if NUL in value:
            hits.append(path)
            return value.replace(NUL, REPLACEMENT)
        return value
    if isinstance(value, float):
        if abs(value) >= WHOLE_FLOAT_MIN and value.is_integer():
            return int(value)  # the same number; jsonb would keep a different one (its decimal text)
        if value == 0.0:
            return 0.0  # -0.0: jsonb's numeric has no negative zero
        return value
    if not isinstance(value, dict | list):
        return value
    root: list[Any] = [None]
    # Work items: (source container, target container, key in target, depth).
    stack: list[tuple[Any, Any, Any, int]] = [(value, root, 0, 1)]
    deep = False
    while stack:
        src, parent, key, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            parent[key] = DEPTH_MARKER
            deep = True
            continue
        if isinstance(src, dict):
            out: Any = {}
            parent[key] = out
            for k, v in src.items():
                if isinstance(k, str) and NUL in k:
                    hits.append(path)
                    k = k.replace(NUL, REPLACEMENT)
                if isinstance(v, dict | list):
                    out[k] = None
                    stack.append((v, out, k, depth + 1))
                else:
                    out[k] = _clean(v, path, hits)
        else:
            out = [None] * len(src)
            parent[key] = out
            for i, v in enumerate(src):
                if isinstance(v, dict | list):
                    stack.append((v, out, i, depth + 1))
                else:
                    out[i] = _clean(v, path, hits)
    if deep:
        hits.append(DEEP + path)
    return root[0]


def make_portable(record: Exchange) -> Exchange:
    """Replaces U+0000 in every string of ``record`` and cuts JSON nested beyond
    ``MAX_JSON_DEPTH`` (in place); records which fields changed in one ``unstorable_character``
    violation; returns the record. Idempotent."""
    hits: list[str] = []
    for name in (
        "host",
        "path",
        "method",
        "http_version",
        "client_address",
        "proxy_user",
        "key_fingerprint",
        "request_last_event_id",
        "last_event_id",
        "request_id",
        "model",
        "response_id",
        "system_fingerprint",
        "service_tier",
        "choices",
        "stop_reason",
        "stop_reason_raw",
        "response_body",
        "transport_error",
    ):
        setattr(record, name, _clean(getattr(record, name), name, hits))
    record.usage.details = _clean(record.usage.details, "usage.details", hits)
    for b in record.blocks:
        b.text = _clean(b.text, "blocks.text", hits)
        b.type = _clean(b.type, "blocks.type", hits)
        b.stop_reason = _clean(b.stop_reason, "blocks.stop_reason", hits)
    for t in record.tool_calls:
        t.id = _clean(t.id, "tool_calls.id", hits)
        t.name = _clean(t.name, "tool_calls.name", hits)
        t.arguments = _clean(t.arguments, "tool_calls.arguments", hits)
    if record.error is not None:
        record.error.code = _clean(record.error.code, "error.code", hits)
        record.error.message = _clean(record.error.message, "error.message", hits)
    req = record.request
    for name in (
        "version",
        "model",
        "messages",
        "tools",
        "parameters",
        "metadata",
        "extensions",
        "tool_names",
        "end_user",
        "request_id",
    ):
        setattr(req, name, _clean(getattr(req, name), f"request.{name}", hits))
    record.violations = [
        Violation(v.kind, v.seq, _clean(v.detail, "violations.detail", hits)) for v in record.violations
    ]
    nul = [h for h in dict.fromkeys(hits) if not h.startswith(DEEP)]
    deep = [h.removeprefix(DEEP) for h in dict.fromkeys(hits) if h.startswith(DEEP)]
    if nul:
        record.violations.append(
            Violation(ViolationKind.UNSTORABLE_CHARACTER, None, f"U+0000 replaced by U+FFFD in: {', '.join(nul)}")
        )
    if deep:
        record.violations.append(
            Violation(
                ViolationKind.UNSTORABLE_CHARACTER,
                None,
                f"JSON nested beyond {MAX_JSON_DEPTH} levels cut in: {', '.join(deep)}",
            )
        )
    return record
