"""The hash chain over a writer's records and gaps: their canonical bytes and the chain hash
(pure: no I/O, no clock). Design after the compliance notes §3 ("hash chain per observer"),
CloudTrail digests and Certificate Transparency's domain-separated hashing.

``record_hash(n) = SHA-256(DOMAIN || canonical(n) || record_hash(n-1))``, with ``GENESIS`` (32
zero bytes) before a writer's first entry, over the writer's records and gaps in ``seq`` order.

**Canonical bytes** (``canonical_record``, ``canonical_gap``): JSON of one object with keys
sorted, no whitespace, ASCII only (``\\uXXXX`` escapes, lone surrogates included), integers in
decimal, a float that is a whole number as that integer (PostgreSQL's ``jsonb`` gives ``1e20``
back as an integer), other floats as Python's shortest round-trip ``repr``, times as RFC 3339
UTC with microseconds (``Exchange.to_dict``). So the bytes depend only on the values, not on the
database (SQLite or PostgreSQL), its column order or its JSON key order.

A record's object is its ``Exchange.to_dict()`` without the derived keys (``text``,
``request_model``), with ``"kind": "exchange"``, ``"writer_id"`` and ``"seq"`` added, and each
**content field** replaced by ``{"sha256": <hex digest>}`` (``CONTENT_FIELDS``): the chain
commits to a digest of the content, not the content, so content can later be encrypted or
erased (crypto-shredding) and the chain still verifies against the digest kept. A string's
digest is over its UTF-8 bytes; a list's or object's over its canonical JSON.

A gap's object is its row (``seq``, ``seq_end``, ``first_at``, ``last_at``, ``dropped``,
``reason``, ``detail``) with ``"kind": "gap"`` and ``"writer_id"``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from observer.shape import rfc3339

DOMAIN = b"llm-audit/v1\x00"
GENESIS = bytes(32)
#: Derived keys of ``Exchange.to_dict()``: computed from other fields, not committed twice.
DERIVED_KEYS = ("text", "request_model")
#: Content fields, committed by digest: (path in the record's dict, where ``[]`` is every item).
CONTENT_FIELDS = (
    ("request", "messages"),
    ("request", "tools"),
    ("blocks", "[]", "text"),
    ("tool_calls", "[]", "arguments"),
    ("response_body",),
    ("error", "message"),
)


def _normal(value: Any) -> Any:
    """``value`` with every whole-number float made an int (see the module docstring)."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    return value


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of ``value`` (JSON types only; ``TypeError`` otherwise)."""
    return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def digest(value: Any) -> dict[str, str]:
    """``{"sha256": hex}`` of a content value: a string's UTF-8 bytes, else its canonical JSON."""
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else canonical_json(value)
    return {"sha256": hashlib.sha256(raw).hexdigest()}


def _replace(node: Any, path: tuple[str, ...]) -> None:
    head, rest = path[0], path[1:]
    if head == "[]":
        for item in node:
            _replace(item, rest)
        return
    if not isinstance(node, dict) or head not in node:
        return
    if not rest:
        if node[head] is not None:
            node[head] = digest(node[head])
    else:
        _replace(node[head], rest)


def committed_record(record: Mapping[str, Any], writer_id: str, seq: int) -> dict[str, Any]:
    """The object a record's hash commits to (content fields as digests)."""
    obj: dict[str, Any] = {k: v for k, v in record.items() if k not in DERIVED_KEYS}
    # Copy what is replaced (never the caller's dicts).
    if isinstance(obj.get("request"), dict):
        obj["request"] = dict(obj["request"])
    for key in ("blocks", "tool_calls"):
        if isinstance(obj.get(key), list):
            obj[key] = [dict(item) for item in obj[key]]
    if isinstance(obj.get("error"), dict):
        obj["error"] = dict(obj["error"])
    for path in CONTENT_FIELDS:
        _replace(obj, path)
    obj["kind"] = "exchange"
    obj["writer_id"] = writer_id
    obj["seq"] = seq
    return obj


def canonical_record(record: Mapping[str, Any], writer_id: str, seq: int) -> bytes:
    """The canonical bytes of a record (its ``Exchange.to_dict()``) at ``seq`` of ``writer_id``."""
    return canonical_json(committed_record(record, writer_id, seq))


def canonical_gap(gap: Mapping[str, Any], writer_id: str) -> bytes:
    """The canonical bytes of a gap row (``datetime`` or ``None`` times)."""
    obj = {
        "kind": "gap",
        "writer_id": writer_id,
        "seq": gap["seq"],
        "seq_end": gap["seq_end"],
        "first_at": _time(gap.get("first_at")),
        "last_at": _time(gap.get("last_at")),
        "dropped": gap.get("dropped"),
        "reason": gap["reason"],
        "detail": gap.get("detail"),
    }
    return canonical_json(obj)


def chain_hash(prev: bytes, canonical: bytes) -> bytes:
    """``SHA-256(DOMAIN || canonical || prev)`` (32 bytes)."""
    return hashlib.sha256(DOMAIN + canonical + prev).digest()


def _time(value: datetime | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return rfc3339(value)


__all__ = [
    "CONTENT_FIELDS",
    "DOMAIN",
    "GENESIS",
    "canonical_gap",
    "canonical_json",
    "canonical_record",
    "chain_hash",
    "committed_record",
    "digest",
]
