"""The hash chain over a writer's records and gaps: their canonical bytes and the chain hash
(pure: no I/O, no clock). Design after the compliance notes §3 ("hash chain per observer"),
CloudTrail digests and Certificate Transparency's domain-separated hashing.

``record_hash(n) = SHA-256(DOMAIN || canonical(n) || record_hash(n-1))``, with ``GENESIS`` (32
zero bytes) before a writer's first entry, over the writer's records and gaps in ``seq`` order.

**Canonical bytes** (``canonical_record``, ``canonical_gap``): RFC 8259 JSON of one object as
``orjson.dumps(obj, option=OPT_SORT_KEYS)`` writes it: UTF-8, no whitespace, object keys sorted
by code point, integers in decimal, floats in their shortest round-trip form, control
characters escaped (``\\n``, ``\\u001f``, ...); an object orjson cannot encode (a lone
surrogate, an integer beyond 64 bits) is written by Python's ``json.dumps`` with the same sorting
and separators, ``ensure_ascii=False``, as UTF-8 with ``surrogatepass``. Times are RFC 3339 UTC
with microseconds (``Exchange.to_dict``). So the bytes depend only on the values, not on the
database (SQLite or PostgreSQL), its column order or its JSON key order. (Values the database
would give back differently are made storable first, ``observer.store.portable``: a negative
zero or a whole-number float of 2^53 or more in request JSON.)

A record's object is its ``Exchange.to_dict()`` without the derived keys (``text``,
``request_model``), with ``"kind": "exchange"``, ``"writer_id"`` and ``"seq"`` added, and each
**content field** replaced by ``{"sha256": <hex digest>}`` (``CONTENT_FIELDS``): the chain
commits to a digest of the content, not the content, so content can later be encrypted or
erased (crypto-shredding) and the chain still verifies against the digest kept. A string's
digest is over its UTF-8 bytes; a list's or object's over its canonical JSON. A key added to the
record after records were chained (``ADDED_KEYS``: ``provenance``, the sender and response identity,
``choices``, the usage details) is committed only when it holds something (not null, not an
empty list or object), so a record stored before it existed hashes as it did then (and a live
record's ``"provenance": null`` is not committed).

A gap's object is its row (``seq``, ``seq_end``, ``first_at``, ``last_at``, ``dropped``,
``reason``, ``detail``) with ``"kind": "gap"`` and ``"writer_id"``.

The store's own chain (legal holds, purges: ``observer.store.events``) is the writer
``store_id``; an event's object is ``{"kind": "store_event", "writer_id", "seq", "event",
"at", "actor", "detail"}``. A purge removes runs of consecutive records of a writer; its event's
``detail.runs_sha256`` commits to them (``runs_digest``), and each run keeps the hash of its last
record, from which the writer's chain goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from observer.shape import rfc3339

DOMAIN = b"llm-audit/v1\x00"
GENESIS = bytes(32)
#: Derived keys of ``Exchange.to_dict()``: computed from other fields, not committed twice.
DERIVED_KEYS = ("text", "reasoning", "request_model")
#: Keys added to ``Exchange`` (a top-level key, or ``usage.<key>``) after records were chained:
#: left out of the committed object when empty (``None``, ``[]``, ``{}``). Every field with
#: ``observer.shape.ADDED`` metadata is here (tests/unit/test_chain.py checks it).
ADDED_KEYS = (
    "client_address",
    "proxy_user",
    "key_fingerprint",
    "provenance",
    "response_id",
    "system_fingerprint",
    "service_tier",
    "choices",
    "usage.cache_read_input_tokens",
    "usage.cache_creation_input_tokens",
    "usage.reasoning_output_tokens",
    "usage.total_tokens",
    "usage.details",
    "request_last_event_id",
    "last_event_id",
)
_EMPTY: tuple[Any, ...] = (None, [], {})
#: Content fields, committed by digest: (path in the record's dict, where ``[]`` is every item).
CONTENT_FIELDS = (
    ("request", "messages"),
    ("request", "tools"),
    ("blocks", "[]", "text"),
    ("choices", "[]", "text"),
    ("tool_calls", "[]", "arguments"),
    ("response_body",),
    ("error", "message"),
)


def canonical_json(value: Any) -> bytes:
    """The canonical JSON bytes of ``value`` (JSON types only; ``TypeError`` otherwise)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # a lone surrogate, an integer beyond 64 bits
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8", "surrogatepass")


def digest(value: Any) -> dict[str, str]:
    """``{"sha256": hex}`` of a content value: a string's UTF-8 bytes, else its canonical JSON."""
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else canonical_json(value)
    return {"sha256": hashlib.sha256(raw).hexdigest()}


def _digests(items: Any, key: str) -> Any:
    """A list of dicts with ``key`` replaced by its digest (new dicts; anything else as is)."""
    if not isinstance(items, list):
        return items
    out = []
    for item in items:
        if isinstance(item, dict) and item.get(key) is not None:
            item = {**item, key: digest(item[key])}
        out.append(item)
    return out


def committed_record(record: Mapping[str, Any], writer_id: str, seq: int) -> dict[str, Any]:
    """The object a record's hash commits to (``CONTENT_FIELDS`` as digests, null
    ``ADDED_KEYS`` left out; the caller's dicts are not changed)."""
    obj: dict[str, Any] = {k: v for k, v in record.items() if k not in DERIVED_KEYS}
    for path in ADDED_KEYS:
        head, _, key = path.partition(".")
        if not key:
            if obj.get(head) in _EMPTY:
                obj.pop(head, None)
        elif isinstance(obj.get(head), dict) and obj[head].get(key) in _EMPTY:
            obj[head] = {k: v for k, v in obj[head].items() if k != key}
    request = obj.get("request")
    if isinstance(request, dict):
        request = dict(request)
        for key in ("messages", "tools"):
            if request.get(key) is not None:
                request[key] = digest(request[key])
        obj["request"] = request
    obj["blocks"] = _digests(obj.get("blocks"), "text")
    if "choices" in obj:
        obj["choices"] = _digests(obj["choices"], "text")
    obj["tool_calls"] = _digests(obj.get("tool_calls"), "arguments")
    if obj.get("response_body") is not None:
        obj["response_body"] = digest(obj["response_body"])
    error = obj.get("error")
    if isinstance(error, dict) and error.get("message") is not None:
        obj["error"] = {**error, "message": digest(error["message"])}
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


def canonical_event(event: Mapping[str, Any], store_id: str) -> bytes:
    """The canonical bytes of a store event row (``seq``, ``kind``, ``at``, ``actor``,
    ``detail``): the chain of the writer ``store_id`` (``observer.store.events``)."""
    obj = {
        "kind": "store_event",
        "writer_id": store_id,
        "seq": event["seq"],
        "event": event["kind"],
        "at": _time(event["at"]),
        "actor": event["actor"],
        "detail": event["detail"],
    }
    return canonical_json(obj)


#: The access log's columns a chain hash commits to (``observer.store.access``), besides its seq.
ACCESS_FIELDS = ("principal", "role", "client", "method", "endpoint", "path", "params", "status", "rows", "ids")


def canonical_access(entry: Mapping[str, Any], writer_id: str) -> bytes:
    """The canonical bytes of an access-log row (``seq``, ``at`` and ``ACCESS_FIELDS``): the
    chain of the writer ``writer_id`` (``observer.store.access.access_writer``)."""
    obj = {"kind": "access", "writer_id": writer_id, "seq": entry["seq"], "at": _time(entry["at"])}
    obj.update({k: entry.get(k) for k in ACCESS_FIELDS})
    return canonical_json(obj)


def runs_digest(runs: Sequence[Sequence[Any]]) -> str:
    """Hex SHA-256 of the canonical JSON of purged runs, each ``[writer_id, first_seq,
    last_seq, last_hash]``, sorted: what a purge's store event commits to."""
    items = sorted([str(r[0]), int(r[1]), int(r[2]), str(r[3])] for r in runs)
    return hashlib.sha256(canonical_json(items)).hexdigest()


def event_chain_break(events: Sequence[Mapping[str, Any]], store_id: str) -> tuple[int, str] | None:
    """The first store event (its place, 1-based) that does not follow the ones before, and
    why: ``"missing"`` (its seq is not its place: one deleted) or ``"changed"`` (its hash is not
    recomputed from it and its predecessor); ``None`` when the whole chain holds."""
    prev = GENESIS
    for i, event in enumerate(events, 1):
        if event["seq"] != i:
            return i, "missing"
        h = chain_hash(prev, canonical_event(event, store_id))
        if event["record_hash"] != h.hex():
            return i, "changed"
        prev = h
    return None


def purges_not_matching_runs(events: Sequence[Mapping[str, Any]], runs: Sequence[Sequence[Any]]) -> list[int]:
    """The seqs of the purge events whose ``detail.runs_sha256`` is not the digest of the runs
    naming them (each run ``[writer_id, first_seq, last_seq, last_hash, event_seq]``)."""
    by_event: dict[int, list[Sequence[Any]]] = {}
    for run in runs:
        by_event.setdefault(int(run[4]), []).append(run[:4])
    return [
        e["seq"]
        for e in events
        if e["kind"] == "purge" and runs_digest(by_event.get(e["seq"], [])) != e["detail"]["runs_sha256"]
    ]


def chain_hash(prev: bytes, canonical: bytes) -> bytes:
    """``SHA-256(DOMAIN || canonical || prev)`` (32 bytes)."""
    return hashlib.sha256(DOMAIN + canonical + prev).digest()


def _time(value: datetime | str | None) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return rfc3339(value)


__all__ = [
    "ADDED_KEYS",
    "CONTENT_FIELDS",
    "DOMAIN",
    "GENESIS",
    "canonical_event",
    "canonical_gap",
    "canonical_json",
    "canonical_record",
    "chain_hash",
    "committed_record",
    "digest",
    "event_chain_break",
    "purges_not_matching_runs",
    "runs_digest",
]
