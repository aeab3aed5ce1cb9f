"""AuditStore on SQLite and PostgreSQL: exact round trip of records, keyset pagination, cursors."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from observer.records import Block, ErrorInfo, Exchange, RequestFacts, ToolCall, Usage, Violation
from observer.store.migrate import upgrade
from observer.store.store import AuditStore, InvalidCursor, exchange_from_dict

UTC = timezone.utc


def full_record() -> Exchange:
    """Blocks out of index order (one non-text), tool calls, usage, an error, violations with seq
    beyond 2^53, unicode everywhere."""
    return Exchange(
        id="0b5e3c1e-6a4e-4b7a-9f1e-2d3c4b5a6f70",
        dialect="anthropic-messages",
        scheme="https",
        host="api.anthropic.com",
        port=443,
        path="/v1/messages",
        method="POST",
        http_version="HTTP/2.0",
        client_address="10.20.30.40",
        proxy_user="jörg",
        key_fingerprint="hmac-sha256:0123456789abcdef0123456789abcdef",
        status_code=200,
        started_at=datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC),
        ended_at=datetime(2025, 6, 1, 12, 0, 3, 500000, tzinfo=UTC),
        ttft_s=0.412,
        request_id="msg_01XFDUDYJgAACzvnptvVoYEL",
        request=RequestFacts(
            version=None,
            stream=True,
            model="claude-sonnet-4-5",
            messages=[
                {"role": "system", "content": "Antworte knapp."},
                {"role": "user", "content": [{"type": "text", "text": "Wie spät ist es in Tōkyō? 🗼"}]},
                {"role": "user", "content": [{"type": "image", "media_type": "image/png", "data_bytes": 20480}]},
            ],
            tools=[{"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}],
            parameters={"max_tokens": 1024, "temperature": 0.7, "stop": ["\n\nHuman:"]},
            metadata={"user_id": "u-42"},
            extensions=["x-acme.trace"],
            body_bytes=27811,
        ),
        model="claude-sonnet-4-5-20250929",
        response_id="msg_01XFDUDYJgAACzvnptvVoYEL",
        service_tier="priority",
        choices=[
            {"index": 0, "text": "Es ist 21:00 Uhr", "stop_reason": None, "stop_reason_raw": None},
            {"index": 1, "text": " in Tōkyō. 🗼", "stop_reason": "end_turn", "stop_reason_raw": "end_turn"},
        ],
        blocks=[
            Block(index=1, type="text", text=" in Tōkyō. 🗼", stop_reason="end_turn"),
            Block(index=2, type="reasoning", text="The user wants the time."),
            Block(index=0, type="text", text="Es ist 21:00 Uhr"),
        ],
        tool_calls=[
            ToolCall(index=0, id="toolu_01A", name="get_time", arguments='{"tz": "Asia/Tokyo"}', declared=True),
            ToolCall(index=1, id="toolu_01B", name="rm_rf", arguments='{"path":"/"', declared=False),
        ],
        usage=Usage(
            input_tokens=1234,
            output_tokens=56,
            cache_read_input_tokens=2**53 + 1,
            cache_creation_input_tokens=0,
            total_tokens=None,
            details={"cache_creation": {"ephemeral_1h": 3}, "output": {"thinking": 2}},
            reported=True,
        ),
        stop_reason="tool_calls",
        stop_reason_raw="tool_use",
        error=ErrorInfo(code="overloaded_error", message="Überlastet — bitte später erneut"),
        outcome="error",
        violations=[
            Violation(kind="seq_exhausted", seq=2**53 + 1, detail="seq beyond 2^53"),
            Violation(kind="undeclared_tool", seq=None, detail="rm_rf"),
            Violation(kind="seq_gap", seq=2**63 - 1, detail="expected 12, got 9223372036854775807"),
        ],
        response_bytes=4096,
        events=37,
    )


def unreported_usage_record() -> Exchange:
    """Client abort: usage never reported (null counts, not 0); an error event without code or
    message; a tool call whose index, id and name never arrived."""
    return Exchange(
        id="5f0c2a9b-3d41-4e8a-b7c6-000000000002",
        dialect="openai-chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/1.1",
        status_code=200,
        started_at=datetime(2025, 6, 1, 12, 0, 1, tzinfo=UTC),
        ended_at=datetime(2025, 6, 1, 12, 0, 2, 250000, tzinfo=UTC),
        request=RequestFacts(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], body_bytes=64),
        model="gpt-4o-2024-08-06",
        blocks=[Block(index=0, text="Hel")],
        tool_calls=[ToolCall(index=None, id=None, name=None)],
        usage=Usage(),
        error=ErrorInfo(code=None, message=None),
        outcome="client_aborted",
        response_bytes=311,
        events=3,
    )


def http_error_record() -> Exchange:
    """A 429 answered before any stream: the body is recorded, nothing else."""
    return Exchange(
        id="9a7d1e44-8b2f-4c3a-a1d0-000000000003",
        dialect="openai-chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/1.1",
        status_code=429,
        started_at=datetime(2025, 6, 1, 12, 0, 2, tzinfo=UTC),
        ended_at=datetime(2025, 6, 1, 12, 0, 2, 90000, tzinfo=UTC),
        outcome="http_error",
        response_body='{"error":{"type":"rate_limit_error","message":"Rate limit reached"}}',
        response_bytes=68,
    )


def transport_error_record() -> Exchange:
    """The connection failed; started_at given at +02:00 is stored and returned in UTC."""
    return Exchange(
        id="c3d4e5f6-0000-4000-8000-000000000004",
        dialect="gemini",
        host="generativelanguage.googleapis.com",
        path="/v1beta/models/gemini-2.5-flash:streamGenerateContent",
        method="POST",
        http_version="HTTP/2.0",
        started_at=datetime(2025, 6, 1, 14, 0, 0, tzinfo=timezone(timedelta(hours=2))),
        outcome="truncated",
        transport_error="Connection killed.",
    )


ALL_RECORDS = (full_record, unreported_usage_record, http_error_record, transport_error_record)


def test_get_returns_exactly_to_dict(store: AuditStore) -> None:
    """Every record read back equals its to_dict(), key for key and in the same key order."""
    records = [make() for make in ALL_RECORDS]
    store.write_many(records)
    for rec in records:
        got = store.get(rec.id)
        assert got == rec.to_dict()
        assert got is not None and list(got) == list(rec.to_dict())
        json.dumps(got)  # JSON-ready


def test_round_trip_hand_checked_values(store: AuditStore) -> None:
    """Spot checks against literal values, not only against to_dict()."""
    store.write_many([full_record(), unreported_usage_record(), http_error_record(), transport_error_record()])

    full = store.get("0b5e3c1e-6a4e-4b7a-9f1e-2d3c4b5a6f70")
    assert full is not None
    assert full["started_at"] == "2025-06-01T12:00:00.123456Z"
    assert full["ended_at"] == "2025-06-01T12:00:03.500000Z"
    assert full["text"] == "Es ist 21:00 Uhr in Tōkyō. 🗼"
    assert [b["index"] for b in full["blocks"]] == [0, 1, 2]
    assert full["request_model"] == "claude-sonnet-4-5"
    assert full["model"] == "claude-sonnet-4-5-20250929"
    assert full["usage"] == {
        "input_tokens": 1234,
        "output_tokens": 56,
        "cache_read_input_tokens": 9007199254740993,
        "cache_creation_input_tokens": 0,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": {"cache_creation": {"ephemeral_1h": 3}, "output": {"thinking": 2}},
        "reported": True,
    }
    assert (full["client_address"], full["proxy_user"], full["service_tier"]) == ("10.20.30.40", "jörg", "priority")
    assert full["reasoning"] == "The user wants the time."
    assert [c["text"] for c in full["choices"]] == ["Es ist 21:00 Uhr", " in Tōkyō. 🗼"]
    assert [v["seq"] for v in full["violations"]] == [9007199254740993, None, 9223372036854775807]
    assert full["tool_calls"][1] == {
        "index": 1,
        "id": "toolu_01B",
        "name": "rm_rf",
        "arguments": '{"path":"/"',
        "declared": False,
    }
    assert full["error"] == {"code": "overloaded_error", "message": "Überlastet — bitte später erneut"}
    assert full["request"]["parameters"] == {"max_tokens": 1024, "temperature": 0.7, "stop": ["\n\nHuman:"]}
    assert full["ttft_s"] == 0.412

    aborted = store.get("5f0c2a9b-3d41-4e8a-b7c6-000000000002")
    assert aborted is not None
    assert aborted["usage"] == {
        "input_tokens": None,
        "output_tokens": None,
        "cache_read_input_tokens": None,
        "cache_creation_input_tokens": None,
        "reasoning_output_tokens": None,
        "total_tokens": None,
        "details": None,
        "reported": False,
    }
    assert (aborted["response_id"], aborted["choices"], aborted["key_fingerprint"]) == (None, None, None)
    assert aborted["error"] == {"code": None, "message": None}
    assert aborted["tool_calls"] == [{"index": None, "id": None, "name": None, "arguments": "", "declared": False}]

    http_error = store.get("9a7d1e44-8b2f-4c3a-a1d0-000000000003")
    assert http_error is not None
    assert http_error["status_code"] == 429
    assert http_error["response_body"] == '{"error":{"type":"rate_limit_error","message":"Rate limit reached"}}'
    assert http_error["error"] is None
    assert http_error["text"] == ""
    assert http_error["request"]["model"] is None

    failed = store.get("c3d4e5f6-0000-4000-8000-000000000004")
    assert failed is not None
    assert failed["started_at"] == "2025-06-01T12:00:00.000000Z"
    assert failed["ended_at"] is None
    assert failed["transport_error"] == "Connection killed."


def test_get_unknown_id_is_none(store: AuditStore) -> None:
    """An id that was never written reads as None."""
    assert store.get("no-such-id") is None


def test_write_many_is_idempotent_on_the_id(store: AuditStore) -> None:
    """Writing a record again (a replay) or twice in one batch stores it once."""
    rec = full_record()
    store.write_many([rec, rec])
    store.write_many([rec, http_error_record()])
    assert store.get(rec.id) == rec.to_dict()
    with store.engine.connect() as conn:
        counts = [
            conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("exchanges", "exchange_blocks", "exchange_tool_calls", "exchange_violations")
        ]
    assert counts == [2, 3, 2, 3]


def test_write_many_is_one_transaction(store: AuditStore) -> None:
    """A batch with a record the database refuses (a naive time) writes nothing at all."""
    naive = http_error_record()
    naive.id = "naive-time"
    naive.started_at = datetime(2025, 6, 1, 12, 0, 0)
    with pytest.raises(sa.exc.StatementError):
        store.write_many([full_record(), naive])
    assert store.get(full_record().id) is None
    store.write_many([])  # nothing to do


def test_deleting_a_record_deletes_its_children(store: AuditStore) -> None:
    """Child rows go with their exchange (ON DELETE CASCADE; SQLite needs foreign_keys=ON)."""
    store.write_many([full_record()])
    with store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM exchanges"))
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM exchange_violations")).scalar_one() == 0


T0 = datetime(2025, 6, 1, 9, 0, 0, tzinfo=UTC)

#: Seven records; rec-c, rec-d and rec-e share one started_at, so the id breaks the tie.
PAGED = [
    ("rec-a", T0),
    ("rec-b", T0 + timedelta(seconds=1)),
    ("rec-c", T0 + timedelta(seconds=2)),
    ("rec-d", T0 + timedelta(seconds=2)),
    ("rec-e", T0 + timedelta(seconds=2)),
    ("rec-f", T0 + timedelta(seconds=2, microseconds=1)),
    ("rec-g", T0 + timedelta(minutes=5)),
]
NEWEST_FIRST = ["rec-g", "rec-f", "rec-e", "rec-d", "rec-c", "rec-b", "rec-a"]


def test_list_pages_newest_first_each_record_once(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """Pages of 3 over 7 records (3 with equal started_at): every record once, in order."""
    store.write_many([make_exchange(i, t) for i, t in PAGED])
    seen: list[str] = []
    pages = 0
    cursor: str | None = None
    while True:
        items, cursor = store.list(3, cursor)
        pages += 1
        seen.extend(item["id"] for item in items)
        if cursor is None:
            break
    assert seen == NEWEST_FIRST
    assert pages == 3


def test_list_last_full_page_has_no_cursor(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """When the page exactly holds the rest, next_cursor is None (no empty extra page)."""
    store.write_many([make_exchange(i, t) for i, t in PAGED])
    items, cursor = store.list(7)
    assert [i["id"] for i in items] == NEWEST_FIRST
    assert cursor is None
    assert store.list(50) == (items, None)


def test_list_item_shape(store: AuditStore) -> None:
    """A list item is the record's summary, with the same values as the full record."""
    store.write_many([full_record()])
    items, cursor = store.list(1)
    assert cursor is None
    assert items == [
        {
            "id": "0b5e3c1e-6a4e-4b7a-9f1e-2d3c4b5a6f70",
            "dialect": "anthropic-messages",
            "scheme": "https",
            "host": "api.anthropic.com",
            "port": 443,
            "path": "/v1/messages",
            "method": "POST",
            "status_code": 200,
            "started_at": "2025-06-01T12:00:00.123456Z",
            "ended_at": "2025-06-01T12:00:03.500000Z",
            "ttft_s": 0.412,
            "request_id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "request_model": "claude-sonnet-4-5",
            "end_user": None,
            "proxy_user": "jörg",
            "key_fingerprint": "hmac-sha256:0123456789abcdef0123456789abcdef",
            "model": "claude-sonnet-4-5-20250929",
            "usage": {
                "input_tokens": 1234,
                "output_tokens": 56,
                "cache_read_input_tokens": 9007199254740993,
                "cache_creation_input_tokens": 0,
                "reasoning_output_tokens": None,
                "total_tokens": None,
                "details": {"cache_creation": {"ephemeral_1h": 3}, "output": {"thinking": 2}},
                "reported": True,
            },
            "stop_reason": "tool_calls",
            "error": {"code": "overloaded_error", "message": "Überlastet — bitte später erneut"},
            "outcome": "error",
            "response_bytes": 4096,
            "events": 37,
            "conversation_id": "0b5e3c1e-6a4e-4b7a-9f1e-2d3c4b5a6f70",  # its own: the first of its conversation
        }
    ]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64 at all!",
        _b64(b"not json"),
        _b64(b'{"started_at": "2025-06-01T09:00:00Z"}'),
        _b64(b'["2025-06-01T09:00:00Z"]'),
        _b64(b'["yesterday", "rec-a"]'),
        _b64(b'["2025-06-01T09:00:00", "rec-a"]'),  # no offset
        _b64(b'[1748768400, "rec-a"]'),
        _b64(b'{"2025-06-01T09:00:00Z": 1, "rec-a": 2}'),  # two keys would unpack like a pair
        _b64(b'["0001-01-01T00:00:00+01:00", "rec-a"]'),  # before year 1 in UTC
        _b64(b'["2025-06-01T09:00:00Z", "rec-a", "extra"]'),
        _b64(b"\xff\xfe"),
        "A" * 600,
    ],
)
def test_list_bad_cursor_raises(store: AuditStore, cursor: str) -> None:
    """A cursor the store did not issue raises InvalidCursor (a ValueError, code invalid_cursor)."""
    with pytest.raises(InvalidCursor) as info:
        store.list(3, cursor)
    assert isinstance(info.value, ValueError)
    assert info.value.code == "invalid_cursor"


@pytest.mark.parametrize("limit", [0, -1, 501])
def test_list_limit_out_of_range(store: AuditStore, limit: int) -> None:
    """limit must be within 1..500."""
    with pytest.raises(ValueError):
        store.list(limit)


@pytest.mark.parametrize("make", ALL_RECORDS)
def test_exchange_from_dict_round_trips_through_json(make: Callable[[], Exchange]) -> None:
    """The spool's encoding: to_dict -> JSON -> exchange_from_dict -> to_dict is lossless."""
    rec = make()
    back = exchange_from_dict(json.loads(json.dumps(rec.to_dict())))
    assert back.to_dict() == rec.to_dict()
    assert back.started_at == rec.started_at


def test_sqlite_pragmas(tmp_path: Path) -> None:
    """SQLite connections run in WAL mode with foreign keys enforced and synchronous=FULL."""
    url = f"sqlite:///{tmp_path / 'p.db'}"
    upgrade(url)
    store = AuditStore(url)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    store.dispose()


def test_postgresql_sessions_run_without_jit(pg_migrated_url: str) -> None:
    """The store's PostgreSQL sessions have JIT off (the server's default is on), and keep it
    after a rollback: it is set once per connection, outside any transaction."""
    store = AuditStore(pg_migrated_url)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW jit").scalar() == "off"
            conn.rollback()
            assert conn.exec_driver_sql("SHOW jit").scalar() == "off"
    finally:
        store.dispose()


def test_sqlite_relative_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sqlite:///observer.db`` is a file in the current directory."""
    monkeypatch.chdir(tmp_path)
    upgrade("sqlite:///observer.db")
    store = AuditStore("sqlite:///observer.db")
    store.write_many([http_error_record()])
    store.ping()
    store.dispose()
    assert (tmp_path / "observer.db").is_file()


def test_from_engine(migrated_url: str) -> None:
    """A store built around an existing engine works like one built from the URL."""
    engine = sa.create_engine(migrated_url)
    store = AuditStore.from_engine(engine)
    store.write_many([http_error_record()])
    assert store.get(http_error_record().id) == http_error_record().to_dict()
    assert store.engine is engine
    store.dispose()


def test_ping_fails_when_unreachable(tmp_path: Path) -> None:
    """ping raises when the database cannot be opened."""
    store = AuditStore(f"sqlite:///{tmp_path / 'missing-dir' / 'x.db'}")
    with pytest.raises(sa.exc.OperationalError):
        store.ping()


def test_nul_characters_are_stored_as_replacement_with_a_violation(store: AuditStore) -> None:
    """U+0000 (legal in JSON strings, refused by PostgreSQL text/jsonb) must not get a record
    refused: it is stored as U+FFFD on every backend, and the record says where."""
    rec = unreported_usage_record()
    rec.blocks[0].text = "a\x00b"
    rec.request.metadata = {"user\x00": "x\x00y"}
    store.write_many([rec])
    got = store.get(rec.id)
    assert got is not None
    assert got["text"] == "a\ufffdb"
    assert got["request"]["metadata"] == {"user\ufffd": "x\ufffdy"}
    assert got["violations"][-1] == {
        "kind": "unstorable_character",
        "seq": None,
        "detail": "U+0000 replaced by U+FFFD in: blocks.text, request.metadata",
    }
    store.write_many([rec])  # a retry of the same object adds nothing
    assert store.get(rec.id)["violations"] == got["violations"]


def test_request_facts_round_trip_every_field(store: AuditStore) -> None:
    """Every RequestFacts field survives the store (a helper found tool_names and end_user
    silently dropped on read)."""
    rec = unreported_usage_record()
    rec.request = RequestFacts(
        version="1.0",
        stream=True,
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"name": "get_weather"}],
        parameters={"temperature": 0},
        metadata={"k": "v"},
        extensions=["acme:x"],
        body_bytes=123,
        tool_names=["get_weather"],
        end_user="user-7",
        request_id="req-9",
    )
    store.write_many([rec])
    got = store.get(rec.id)["request"]
    assert got == {
        "version": "1.0",
        "stream": True,
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_weather"}],
        "parameters": {"temperature": 0},
        "metadata": {"k": "v"},
        "extensions": ["acme:x"],
        "body_bytes": 123,
        "tool_names": ["get_weather"],
        "end_user": "user-7",
        "request_id": "req-9",
    }
    assert store.list(1)[0][0]["end_user"] == "user-7"


def test_deeply_nested_request_is_cut_not_fatal(store: AuditStore) -> None:
    """Trial finding: a 2 KB request of 1000 nested brackets crashed the writer (RecursionError,
    retried forever, audit trail stopped) and 260 levels made the API fail. Now nesting beyond
    64 levels is cut with a violation, and the record is stored and served."""
    deep: object = []
    for _ in range(1000):
        deep = [deep]
    rec = unreported_usage_record()
    rec.request.parameters = {"x": deep}
    store.write_many([rec])
    got = store.get(rec.id)
    assert got is not None
    value = got["request"]["parameters"]["x"]
    lists = 0  # parameters is level 1; the lists at levels 2..64 are kept, level 65 is cut
    while isinstance(value, list):
        value, lists = value[0], lists + 1
    assert value == "<nested deeper than 64 levels: not stored>"
    assert lists == 63
    assert got["violations"][-1] == {
        "kind": "unstorable_character",
        "seq": None,
        "detail": "JSON nested beyond 64 levels cut in: request.parameters",
    }


@pytest.mark.parametrize(
    "text",
    [
        '{"a":[1,2.5,-0.0,1e300,"\\u00e9",null,true],"b":{}}',
        '{"nan":NaN,"inf":Infinity}',  # the standard library reads them, orjson does not
        '{"big":123456789012345678901234567890}',  # beyond 64 bits: orjson makes it a float
        '{"neg":-9223372036854775809,"u64":18446744073709551615}',  # 19 and 20 digits
        '{"lone":"\\ud800x"}',  # a lone surrogate escape
        '"plain"',
    ],
)
def test_json_is_read_as_the_standard_library_reads_it(text: str) -> None:
    """The store's JSON columns and the journal's entries (``format.loads``)."""
    import json
    import math

    from observer.jsontext import loads

    got, want = loads(text), json.loads(text)
    if "nan" in text:
        assert math.isnan(got["nan"]) and got["inf"] == want["inf"] == math.inf
    else:
        assert got == want and type(got) is type(want)


@pytest.mark.parametrize("rid", ["a\x00b", "\x00", "x" * 37])
def test_an_id_no_record_can_have_is_none(store: AuditStore, rid: str) -> None:
    """Trial finding: GET /v1/exchanges/%00 gave 500 on PostgreSQL (a NUL in a query is an error there)."""
    assert store.get(rid) is None


def _stat_rows(store: AuditStore) -> int | None:
    """The row count ``sqlite_stat1`` holds for ``exchanges`` (None: never analyzed)."""
    with store.engine.connect() as conn:
        if not conn.exec_driver_sql("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").first():
            return None
        stat = conn.exec_driver_sql("SELECT stat FROM sqlite_stat1 WHERE idx = 'ix_exchanges_started_at_id'").scalar()
    return None if stat is None else int(stat.split()[0])


def test_sqlite_statistics_are_refreshed_as_the_store_doubles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_exchange: Callable[..., Exchange]
) -> None:
    """SQLite gets ``ANALYZE`` from the writer at ``FIRST`` records and then at each doubling of
    the stored count (here FIRST = 4: at 4, 8, 16), remembered across store objects."""
    monkeypatch.setattr("observer.store.analyze.FIRST", 4)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    store = AuditStore(url)
    t0 = datetime(2025, 6, 1, tzinfo=timezone.utc)
    n = 0

    def write(count: int, into: AuditStore) -> None:
        nonlocal n
        into.write_many([make_exchange(f"r{n + k}", t0 + timedelta(seconds=n + k)) for k in range(count)])
        n += count

    counts = []
    for count in (3, 1, 3, 1, 7):
        write(count, store)
        counts.append(_stat_rows(store))
    assert counts == [None, 4, 4, 8, 8]  # after 3, 4, 7, 8, 15 records
    store.dispose()
    again = AuditStore(url)  # a restart: the count of the last run comes from store_meta
    write(1, again)
    assert _stat_rows(again) == 16
    write(15, again)
    assert _stat_rows(again) == 16  # 31 < 32
    write(1, again)
    assert _stat_rows(again) == 32
    again.dispose()
