"""The record's shape declared once: to_dict/from_dict and the store's rows derived from the
record dataclasses (``observer.shape``, ``observer.store.rows``)."""

from __future__ import annotations

import dataclasses
import typing
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

from observer.records import Block, ErrorInfo, Exchange, Outcome, RequestFacts, ToolCall, Usage, Violation
from observer.shape import Kind, Shaped, derived, keys, shaped
from observer.store import rows
from observer.store.models import ExchangeRow
from observer.store.portable import make_portable

UTC = timezone.utc
T = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)

#: The record's keys as README "The record" and GET /v1/exchanges/{id} show them.
RECORD_KEYS = [
    "id",
    "dialect",
    "scheme",
    "host",
    "port",
    "path",
    "method",
    "http_version",
    "client_address",
    "proxy_user",
    "key_fingerprint",
    "status_code",
    "started_at",
    "ended_at",
    "ttft_s",
    "request_id",
    "request",
    "request_model",
    "model",
    "text",
    "response_id",
    "system_fingerprint",
    "service_tier",
    "blocks",
    "reasoning",
    "choices",
    "tool_calls",
    "usage",
    "stop_reason",
    "stop_reason_raw",
    "error",
    "outcome",
    "violations",
    "response_body",
    "transport_error",
    "response_bytes",
    "events",
    "provenance",
    "request_last_event_id",
    "last_event_id",
]


def sample() -> Exchange:
    return Exchange(
        "r1",
        "openai.chat",
        "h",
        "/v1/chat/completions",
        "POST",
        "HTTP/1.1",
        T + timedelta(hours=2),
        scheme="https",
        port=443,
        status_code=200,
        ended_at=T.astimezone(timezone(timedelta(hours=-5))),
        ttft_s=0.5,
        request=RequestFacts(model="gpt", messages=[{"role": "user", "content": "hi"}], body_bytes=9),
        model="gpt-1",
        blocks=[Block(2, "text", "b"), Block(1, "reasoning", "r"), Block(0, "text", "a", "end_turn")],
        tool_calls=[ToolCall(0, "c1", "f", "{}", True)],
        usage=Usage(3, None, True),
        error=ErrorInfo("e", None),
        outcome=Outcome.ERROR,
        violations=[Violation("seq_gap", 2**63 - 1, "d")],
        response_bytes=7,
        events=5,
    )


def test_to_dict_by_hand() -> None:
    """Keys in the record's order; times RFC 3339 UTC; blocks by index; enums as plain strings;
    derived keys (request_model, text) where the record shows them."""
    d = sample().to_dict()
    assert list(d) == RECORD_KEYS
    assert d["started_at"] == "2025-06-01T14:00:00.123456Z" and d["ended_at"] == "2025-06-01T12:00:00.123456Z"
    assert (d["request_model"], d["text"]) == ("gpt", "ab")
    assert [b["index"] for b in d["blocks"]] == [0, 1, 2]
    assert d["blocks"][0] == {"index": 0, "type": "text", "text": "a", "stop_reason": "end_turn"}
    assert d["tool_calls"] == [{"index": 0, "id": "c1", "name": "f", "arguments": "{}", "declared": True}]
    assert d["usage"] == {
        "input_tokens": 3,
        "output_tokens": None,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": True,
    }
    assert (d["reasoning"], d["choices"], d["response_id"]) == ("r", None, None)
    assert d["error"] == {"code": "e", "message": None}
    assert d["outcome"] == "error" and type(d["outcome"]) is str
    assert d["violations"] == [{"kind": "seq_gap", "seq": 2**63 - 1, "detail": "d"}]
    assert type(Violation(Outcome.ERROR).to_dict()["kind"]) is str
    assert list(d["request"]) == [f.name for f in dataclasses.fields(RequestFacts)]
    assert Exchange("x", "d", "h", "/", "GET", "1.1", T).to_dict()["error"] is None


def test_from_dict_inverts_to_dict() -> None:
    """from_dict(to_dict()) gives an equal record (blocks in index order: to_dict sorts them)."""
    rec = sample()
    back = Exchange.from_dict(rec.to_dict())
    assert back.to_dict() == rec.to_dict()
    assert back.started_at == rec.started_at and back.started_at.tzinfo is UTC
    assert back.error == rec.error and back.usage == rec.usage and back.violations == rec.violations


def test_from_dict_needs_every_key_but_request_facts_take_defaults() -> None:
    """A spool line missing a key is refused; request facts written before a field existed are
    read with that field's default (a fresh list each time)."""
    d = sample().to_dict()
    del d["events"]
    with pytest.raises(KeyError):
        Exchange.from_dict(d)
    a, b = RequestFacts.from_dict({}), RequestFacts.from_dict({"model": "m"})
    assert a == RequestFacts() and b.model == "m" and a.tool_names is not b.tool_names


def test_a_record_of_an_older_version_without_provenance_is_read_as_observed_live() -> None:
    """``provenance`` was added later (``ADDED``): a journal entry written before it has no such
    key and is read with ``provenance`` None; any other missing key is still refused."""
    d = sample().to_dict()
    assert d["provenance"] is None
    del d["provenance"]
    assert Exchange.from_dict(d).provenance is None
    del d["response_bytes"]
    with pytest.raises(KeyError):
        Exchange.from_dict(d)


def test_from_dict_refuses_bad_values() -> None:
    """A time without offset, or null where the record needs a value, raises."""
    d = sample().to_dict()
    with pytest.raises(ValueError, match="without offset"):
        Exchange.from_dict(d | {"started_at": "2025-06-01T12:00:00"})
    with pytest.raises(TypeError):
        Exchange.from_dict(d | {"started_at": None})
    with pytest.raises(TypeError):
        Exchange.from_dict(d | {"usage": None})


def test_compiled_to_dict_is_one_dict_display() -> None:
    """to_dict is compiled from the keys: attribute reads and converter calls, nothing else."""
    assert Usage.to_dict_source == (
        "def to_dict(self):\n    return {\n        'input_tokens': self.input_tokens,\n"
        "        'output_tokens': self.output_tokens,\n"
        "        'cache_read_input_tokens': self.cache_read_input_tokens,\n"
        "        'cache_creation_input_tokens': self.cache_creation_input_tokens,\n"
        "        'reasoning_output_tokens': self.reasoning_output_tokens,\n"
        "        'total_tokens': self.total_tokens,\n        'details': self.details,\n"
        "        'reported': self.reported,\n    }\n"
    )
    assert "'error': None if self.error is None else self.error.to_dict()," in Exchange.to_dict_source


def test_shape_declaration_errors() -> None:
    """@shaped refuses a class that is not a Shaped dataclass and a derived key after no field."""
    with pytest.raises(TypeError, match="needs a dataclass"):

        @shaped
        @dataclasses.dataclass
        class NotShaped:
            a: int

    with pytest.raises(TypeError, match="not a field"):

        @shaped
        @dataclasses.dataclass(slots=True)
        class BadDerived(Shaped):
            a: int

            @derived(after="b")
            def c(self) -> int:
                return self.a

    with pytest.raises(TypeError, match="not @shaped"):
        Shaped().to_dict()


def test_rows_cover_every_column() -> None:
    """Every column of every table is written from the record (the derivation checks it at
    import; here the result), and FLATTENED names only real columns."""
    exchange, children = rows.rows_from_records([sample()])
    tables = {t.name: t for t in ExchangeRow.metadata.sorted_tables}
    assert set(exchange[0]) == {c.name for c in tables["exchanges"].columns} - {"created_at", *rows.JOURNAL_COLUMNS}
    for table, items in children.items():
        assert items and set(items[0]) == {c.name for c in table.columns}
    all_columns = {c.name for t in tables.values() for c in t.columns}
    assert set(rows.FLATTENED.values()) <= all_columns


def test_a_field_without_a_column_fails_at_derivation() -> None:
    """Control: a record key with no column (and no FLATTENED entry) is refused by name."""

    @shaped
    @dataclasses.dataclass(slots=True)
    class Wider(Shaped):
        index: int
        type: str
        text: str
        stop_reason: str | None
        language: str | None = None

    table = ExchangeRow.__mapper__.relationships["blocks"].mapper.local_table
    with pytest.raises(TypeError, match=r"Wider\.language: no column 'language' in exchange_blocks"):
        rows._Mapping(Wider, table, "blocks.", ("exchange_id", "position"), {})

    @shaped
    @dataclasses.dataclass(slots=True)
    class One(Shaped):
        index: int

    wide = sa.Table("t", sa.MetaData(), sa.Column("index", sa.Integer), sa.Column("extra", sa.Text))
    with pytest.raises(TypeError, match=r"columns \['extra'\] written by no key of One, \[\] twice"):
        rows._Mapping(One, wide, "", (), {})


def test_summary_columns_are_what_the_summary_reads() -> None:
    """The list page selects exactly the columns its items are built from."""
    names = {c.key for c in rows.SUMMARY_COLUMNS}
    source = rows.SOURCES["summary_from_row"]
    assert names == {n for n in names if f"m[{n!r}]" in source}
    assert {"id", "started_at"} <= names


def nul_value(hint: Any) -> Any:
    """A value of ``hint`` with U+0000 in every string it can hold, or ``None`` (no string)."""
    base = (
        [a for a in typing.get_args(hint) if a is not type(None)]
        if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType)
        else [hint]
    )
    hint = base[0]
    if hint is str:
        return "a\x00"
    origin = typing.get_origin(hint)
    if origin is list:
        return [nul_value(typing.get_args(hint)[0]) or "a\x00"]
    if origin is dict or hint is Any:
        return {"k\x00": "v\x00"}
    return None


#: Keys the observer sets itself, never from the wire: not cleaned by make_portable.
OBSERVER_SET = {"id", "dialect", "scheme", "outcome", "violations.kind"}


def test_make_portable_cleans_every_string_field() -> None:
    """Every string-bearing field of the record (nested ones too) is in make_portable's lists:
    a field added to the record without them fails here (PostgreSQL would refuse its NUL)."""
    rec = Exchange(
        "r",
        "d",
        "h",
        "/",
        "POST",
        "1.1",
        T,
        error=ErrorInfo(None, None),
        blocks=[Block(0)],
        tool_calls=[ToolCall(0, None, None)],
        violations=[Violation("seq_gap")],
    )
    holders: list[tuple[str, Any]] = [
        ("", rec),
        ("request.", rec.request),
        ("error.", rec.error),
        ("usage.", rec.usage),
        ("blocks.", rec.blocks[0]),
        ("tool_calls.", rec.tool_calls[0]),
        ("violations.", rec.violations[0]),
    ]
    planted = []
    for prefix, obj in holders:
        hints = typing.get_type_hints(type(obj))
        for key in keys(type(obj)):
            if key.kind in (Kind.VALUE,) and f"{prefix}{key.name}" not in OBSERVER_SET:
                value = nul_value(hints[key.name])
                if value is not None:
                    object.__setattr__(obj, key.name, value)
                    planted.append(f"{prefix}{key.name}")
    assert len(planted) > 20
    d = make_portable(rec).to_dict()

    def strings(v: Any) -> list[str]:
        if isinstance(v, str):
            return [v]
        if isinstance(v, dict):
            return [s for k, x in v.items() for s in [k, *strings(x)]]
        if isinstance(v, list):
            return [s for x in v for s in strings(x)]
        return []

    assert [s for s in strings(d) if "\x00" in s] == []
    assert any(v["kind"] == "unstorable_character" for v in d["violations"])


def test_rfc3339_times_are_read_exactly_or_refused() -> None:
    """Trial findings: a 7th digit of a second was cut off unseen; lower-case t/z (RFC 3339
    §5.6) were refused; year 1 was written as '1-01-01'."""
    from datetime import datetime, timezone

    import pytest

    from observer.shape import parse_rfc3339, rfc3339

    assert parse_rfc3339("2026-12-01t17:58:26.349412z") == datetime(
        2026, 12, 1, 17, 58, 26, 349412, tzinfo=timezone.utc
    )
    with pytest.raises(ValueError, match="more than 6 digits of a second"):
        parse_rfc3339("2026-12-01T17:58:26.3494125Z")
    with pytest.raises(ValueError, match="out of range in UTC"):
        parse_rfc3339("0001-01-01T00:00:00+01:00")
    assert rfc3339(datetime(1, 1, 1, tzinfo=timezone.utc)) == "0001-01-01T00:00:00.000000Z"
