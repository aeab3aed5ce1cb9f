"""Reading a vendor's usage object into one ``UsageEvent``: where each count lives is declared
per dialect as a ``UsageMap`` (data, not code), read by one function.

A count is a non-negative JSON integer that fits 64 bits (``toolkit.count``). A key that is
absent or ``null`` is not reported (``None`` in the event, never 0); a key present with any other
value is an ``invalid_event`` naming it, and is left out. Nothing is computed: a total is the
vendor's total as sent.

``details`` (``observer.records.Usage.details``) are gathered from three shapes vendors use:
an object of counts (OpenAI ``prompt_tokens_details: {"audio_tokens": 3}``, Anthropic
``cache_creation: {"ephemeral_5m_input_tokens": 5}``), whose keys lose their ``_input_tokens``
/ ``_tokens`` suffix (``audio``, ``ephemeral_5m``) and skip the keys already mapped to a named
count (``cached_tokens``, ``reasoning_tokens``); a list of ``{"modality", "tokenCount"}``
(Gemini ``promptTokensDetails``), keyed by the lower-cased modality; and single counts given a
name (Ollama's ``total_duration`` as ``duration_ns.total``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from observer.dialects.toolkit import count
from observer.events import UsageEvent
from observer.records import Violation, ViolationKind

__all__ = ["UsageMap", "read_usage"]

_SUFFIXES = ("_input_tokens", "_tokens", "_token_count")
MAX_DETAIL_ITEMS = 32  # entries read from one details object or list (a vendor sends a few)


@dataclass(frozen=True, slots=True)
class UsageMap:
    """Where one vendor's usage object keeps each count: each named count as dotted paths into
    the object, the first present one wins (``("prompt_tokens_details.cached_tokens",
    "prompt_cache_hit_tokens")``); ``objects``: ``(group, path)`` of objects of counts;
    ``modalities``: ``(group, path)`` of ``[{"modality", "tokenCount"}]`` lists; ``named``:
    ``(group, name, path)`` single counts; ``mapped``: keys inside those objects that a named
    count already took (not repeated in the details)."""

    input: tuple[str, ...] = ()
    output: tuple[str, ...] = ()
    cache_read: tuple[str, ...] = ()
    cache_creation: tuple[str, ...] = ()
    reasoning: tuple[str, ...] = ()
    total: tuple[str, ...] = ()
    objects: tuple[tuple[str, str], ...] = ()
    modalities: tuple[tuple[str, str], ...] = ()
    named: tuple[tuple[str, str, str], ...] = ()
    mapped: frozenset[str] = frozenset()


def read_usage(usage: Any, spec: UsageMap, seq: int | None, out: list[Any], where: str = "usage") -> UsageEvent | None:
    """The ``UsageEvent`` of the vendor usage object ``usage`` read by ``spec``, appended to
    ``out`` and returned; ``None`` (nothing appended but violations) when it holds no count or
    is not an object. Bad values: ``invalid_event`` violations (``seq``) naming
    ``{where}.{path}`` (``where`` empty: the path alone)."""
    if not isinstance(usage, Mapping):
        return None
    where = f"{where}." if where else ""
    counts = [
        _first(usage, paths, seq, out, where)
        for paths in (spec.input, spec.output, spec.cache_read, spec.cache_creation, spec.reasoning, spec.total)
    ]
    details: list[tuple[str, str, int]] = []
    for group, path in spec.objects:
        obj = _at(usage, path)
        if isinstance(obj, Mapping):
            for key in list(obj)[:MAX_DETAIL_ITEMS]:
                if key in spec.mapped or obj[key] is None:
                    continue
                value = _count(obj[key], seq, out, f"{where}{path}.{key}")
                if value is not None:
                    details.append((group, _name(key), value))
    for group, path in spec.modalities:
        items = _at(usage, path)
        if isinstance(items, list):
            for item in items[:MAX_DETAIL_ITEMS]:
                modality = item.get("modality") if isinstance(item, Mapping) else None
                if not isinstance(modality, str) or not modality:
                    out.append(Violation(ViolationKind.INVALID_EVENT, seq, f"{where}{path}[]: no modality"))
                    continue
                value = _count(item.get("tokenCount"), seq, out, f"{where}{path}[{modality}]")
                if value is not None:
                    details.append((group, modality.lower(), value))
    for group, name, path in spec.named:
        raw = _at(usage, path)
        value = None if raw is None else _count(raw, seq, out, f"{where}{path}")
        if value is not None:
            details.append((group, name, value))
    if all(c is None for c in counts) and not details:
        return None
    event = UsageEvent(seq, *counts, details=tuple(details))
    out.append(event)
    return event


def _first(usage: Mapping[str, Any], paths: tuple[str, ...], seq: int | None, out: list[Any], where: str) -> int | None:
    for path in paths:
        raw = _at(usage, path)
        if raw is not None:
            return _count(raw, seq, out, f"{where}{path}")
    return None


def _count(raw: Any, seq: int | None, out: list[Any], name: str) -> int | None:
    value = count(raw)
    if value is None:
        out.append(Violation(ViolationKind.INVALID_EVENT, seq, f"{name} is not a token count: {raw!r:.40}"))
    return value


def _at(obj: Mapping[str, Any], path: str) -> Any:
    """The value at dotted ``path`` (``None`` when any step is missing or not an object)."""
    for step in path.split("."):
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(step)  # type: ignore[assignment]
    return obj


def _name(key: str) -> str:
    for suffix in _SUFFIXES:
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)]
    return key
