"""Makes a record storable in every supported database, in the writer thread.

PostgreSQL ``text`` and ``jsonb`` cannot hold U+0000 (JSON allows ``\\u0000`` in strings), so a
stream could otherwise get its whole record refused — and dodge the audit. The character is
replaced by U+FFFD on every backend (records stay identical across SQLite and PostgreSQL) and
one ``unstorable_character`` violation names the fields that changed. Runs off the proxy's
event loop (called by ``AuditStore.write_many``); cost is one C-level scan per string.
"""

from __future__ import annotations

from typing import Any

from observer.records import Exchange, Violation, ViolationKind

NUL = "\x00"
REPLACEMENT = "\ufffd"


def _clean(value: Any, path: str, hits: list[str]) -> Any:
    if isinstance(value, str):
        if NUL in value:
            hits.append(path)
            return value.replace(NUL, REPLACEMENT)
        return value
    if isinstance(value, dict):
        return {_clean(k, path, hits): _clean(v, path, hits) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v, path, hits) for v in value]
    return value


def make_portable(record: Exchange) -> Exchange:
    """Replaces U+0000 in every string of ``record`` (in place) and records which fields
    changed in one ``unstorable_character`` violation; returns the record."""
    hits: list[str] = []
    for name in ("host", "path", "method", "http_version", "request_id", "model", "stop_reason",
                 "stop_reason_raw", "response_body", "transport_error"):  # fmt: skip
        setattr(record, name, _clean(getattr(record, name), name, hits))
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
    for name in ("version", "model", "messages", "tools", "parameters", "metadata", "extensions", "tool_names",
                 "end_user", "request_id"):  # fmt: skip
        setattr(req, name, _clean(getattr(req, name), f"request.{name}", hits))
    record.violations = [
        Violation(v.kind, v.seq, _clean(v.detail, "violations.detail", hits)) for v in record.violations
    ]
    if hits:
        fields = ", ".join(dict.fromkeys(hits))
        record.violations.append(
            Violation(ViolationKind.UNSTORABLE_CHARACTER, None, f"U+0000 replaced by U+FFFD in: {fields}")
        )
    return record
