"""The API's response schemas against the record classes: same keys, same order, same types.

The schemas are written by hand (their descriptions are the OpenAPI docs); what they must hold
is derived here from the record classes (``observer.shape.keys``), so a record field added
without its schema field fails, naming it.
"""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from observer.api.schemas import (
    BlockOut,
    ChoiceOut,
    ErrorInfoOut,
    ExchangeOut,
    ExchangeSummary,
    ProvenanceOut,
    RequestOut,
    ToolCallOut,
    UsageOut,
    ViolationOut,
)
from observer.records import Block, ErrorInfo, Exchange, Provenance, RequestFacts, ToolCall, Usage, Violation
from observer.shape import Kind, Shaped, keys, shaped
from observer.store.rows import SUMMARY_KEYS

SCHEMA_OF: dict[type[Shaped], type[BaseModel]] = {
    Exchange: ExchangeOut,
    RequestFacts: RequestOut,
    Block: BlockOut,
    ToolCall: ToolCallOut,
    Usage: UsageOut,
    ErrorInfo: ErrorInfoOut,
    Violation: ViolationOut,
    Provenance: ProvenanceOut,
}


#: Content a viewer does not get (``observer.api.routers.exchanges.withhold_content``): null then.
WITHHELD = {
    (Exchange, "text"),
    (Exchange, "reasoning"),
    (Block, "text"),
    (ToolCall, "arguments"),
    (RequestFacts, "messages"),
    (RequestFacts, "tools"),
    (RequestFacts, "metadata"),
}
#: Keys held as plain JSON in the record whose schema spells out their items (each choice's
#: ``text`` is withheld content, hence nullable there).
ITEMS = {(Exchange, "choices"): list[ChoiceOut] | None}
#: Keys the API adds after the record's own: the store's conversation link and the withholding flag.
ADDED = {Exchange: ["conversation_id", "resumes_id", "key_owner", "content_withheld"]}


def expected_annotation(cls: type[Shaped], name: str) -> Any:
    """The JSON-side annotation of key ``name`` of ``cls``: times as strings, nested records as
    their schema, withheld content nullable, everything else as the field (or derived property)
    declares it."""
    if (cls, name) in ITEMS:
        return ITEMS[cls, name]
    annotation = _annotation(cls, name)
    return annotation | None if (cls, name) in WITHHELD else annotation


def _annotation(cls: type[Shaped], name: str) -> Any:
    key = {k.name: k for k in keys(cls)}[name]
    if key.kind is Kind.DERIVED:
        return typing.get_type_hints(getattr(cls, name).fget)["return"]
    hint = typing.get_type_hints(cls)[name]
    if key.kind is Kind.TIME:
        base: Any = str
    elif key.kind is Kind.RECORD:
        base = SCHEMA_OF[key.record]
    elif key.kind is Kind.RECORDS:
        return list[SCHEMA_OF[key.record]]
    else:
        return hint
    return base | None if key.optional else base


def mismatches(cls: type[Shaped], schema: type[BaseModel]) -> list[str]:
    """What ``schema`` lacks, has in excess, orders or types differently from ``cls.to_dict()``."""
    added = ADDED.get(cls, [])
    want = [k.name for k in keys(cls)]
    have = [n for n in schema.model_fields if n not in added]
    if list(schema.model_fields)[len(have) :] != added:
        return [f"{schema.__name__} must end with the added keys {added}"]
    problems = [
        f"{schema.__name__} lacks {n!r}: add `{n}: {expected_annotation(cls, n)}`" for n in want if n not in have
    ]
    problems += [f"{schema.__name__}.{n} is no key of {cls.__name__}" for n in have if n not in want]
    if not problems and want != have:
        problems.append(f"{schema.__name__} lists its fields as {have}, the record as {want}")
    for n in (n for n in want if n in have):
        info = schema.model_fields[n]
        if info.annotation != expected_annotation(cls, n):
            problems.append(f"{schema.__name__}.{n}: {info.annotation}, the record gives {expected_annotation(cls, n)}")
        if not info.is_required():
            problems.append(f"{schema.__name__}.{n} has a default: every key is always sent")
    return problems


def test_every_record_class_has_its_schema() -> None:
    """Every record class reachable from Exchange (nested records, list items) has a schema."""
    reachable: set[type[Shaped]] = set()
    todo: list[type[Shaped]] = [Exchange]
    while todo:
        cls = todo.pop()
        reachable.add(cls)
        todo.extend(k.record for k in keys(cls) if k.record is not None and k.record not in reachable)
    assert reachable == set(SCHEMA_OF)


def test_schemas_mirror_the_records() -> None:
    """Each schema lists the keys of its record's to_dict(), in order, with matching types."""
    assert [p for cls, schema in SCHEMA_OF.items() for p in mismatches(cls, schema)] == []


def test_a_field_added_to_the_record_is_reported() -> None:
    """Control: a record with one field more than its schema is reported by name and type."""

    @shaped
    @dataclasses.dataclass(slots=True)
    class Wider(Shaped):
        code: str | None
        message: str | None
        retry_at: datetime | None = None

    assert mismatches(Wider, ErrorInfoOut) == ["ErrorInfoOut lacks 'retry_at': add `retry_at: str | None`"]


def test_summary_is_the_listed_keys_of_the_record() -> None:
    """ExchangeSummary holds SUMMARY_KEYS in order, each typed and documented as in ExchangeOut
    (end_user, the one key that is not the record's, as in RequestOut)."""
    assert tuple(ExchangeSummary.model_fields) == SUMMARY_KEYS
    for name, info in ExchangeSummary.model_fields.items():
        source = ExchangeOut.model_fields.get(name) or RequestOut.model_fields[name]
        assert info.annotation == source.annotation, name
        assert info.is_required(), name
        if name != "end_user":
            assert info.description == source.description, name
