"""Filters, full-text search, the stored-order feed and statistics of the query API.

Five hand-built records; every expected id list and every count below is written by hand from
the records (``RECORDS``), not read back from the code. Lists are newest first by
``started_at``: q4, q5, q3, q2, q1.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from observer.api import create_app
from observer.records import Block, ErrorInfo, Exchange, ToolCall, Usage, Violation
from observer.store import query
from observer.store.models import ToolCallRow, ViolationRow
from observer.store.store import AuditStore
from observer.store.stored import horizon

TOKEN = "token-for-query-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = datetime(2025, 6, 1, 9, 0, 0, tzinfo=timezone.utc)
MINUS_2 = timezone(timedelta(hours=-2))


def _records(make: Callable[..., Exchange]) -> list[Exchange]:
    def user(content: Any) -> list[dict[str, Any]]:
        return [{"role": "user", "content": content}]

    q1 = make("q1", T0, model="gpt-4o", request_id="req-1", stop_reason="end_turn")
    q1.request.model = "gpt-4o"
    q1.request.end_user = "alice"
    q1.request.messages = user("Bonjour zebra")
    q1.blocks = [Block(index=0, text="Le café est prêt")]
    q1.tool_calls = [ToolCall(index=0, id="c1", name="get_weather", arguments='{"city": "Lyon"}')]
    # The cost classes: q1 read 4 tokens from a cache and reported 0 reasoning tokens, q2 reported
    # a cache read of 0 and wrote 12, q5 reported 9 reasoning tokens and nothing of a cache.
    q1.usage = Usage(
        input_tokens=10, output_tokens=5, cache_read_input_tokens=4, reasoning_output_tokens=0, reported=True
    )

    q2 = make("q2", T0 + timedelta(hours=1), model="claude-3", dialect="anthropic-messages", stop_reason="tool_use")
    q2.host = "api.anthropic.com"
    q2.request.model = "claude-3-latest"
    q2.request.end_user = "bob"
    q2.request.messages = user([{"type": "text", "text": "tell me about walruses"}])
    q2.blocks = [Block(index=0, text="walrus tusks")]
    q2.tool_calls = [
        ToolCall(index=0, id="c2", name="search", arguments="{}"),
        ToolCall(index=1, id="c3", name="get_weather", arguments="{}"),
    ]
    q2.usage = Usage(
        input_tokens=20, output_tokens=7, cache_read_input_tokens=0, cache_creation_input_tokens=12, reported=True
    )

    q3 = make("q3", T0 + timedelta(hours=2), model="gpt-4o", outcome="error")
    q3.request.model = "gpt-4o-mini"
    q3.request.end_user = "alice"
    q3.request.messages = user("CAFÉ au lait")
    q3.error = ErrorInfo(code="overloaded", message="try later")
    q3.violations = [Violation(kind="seq_gap", seq=3)]

    # 23:30 at -02:00 on June 2nd is 01:30 UTC on June 3rd: its day is 2025-06-03.
    q4 = make("q4", datetime(2025, 6, 2, 23, 30, tzinfo=MINUS_2), outcome="client_aborted", host="localhost")
    q4.request.messages = user("operators")
    q4.blocks = [Block(index=0, text='NEAR(x) AND star* "quoted"')]
    q4.violations = [Violation(kind="seq_gap", seq=1), Violation(kind="undeclared_tool")]
    q4.usage = Usage(input_tokens=3, output_tokens=None, reported=True)

    q5 = make("q5", T0 + timedelta(hours=3), model="gpt-4o", request_id="req-5", stop_reason="end_turn")
    q5.request.model = "gpt-4o"
    q5.request.end_user = "carol"
    q5.request.messages = user("jumps over the lazy dog")
    q5.blocks = [Block(index=0, text="the quick brown fox")]
    q5.usage = Usage(input_tokens=1, output_tokens=2, reasoning_output_tokens=9, reported=True)
    return [q1, q2, q3, q4, q5]


@pytest.fixture
def client(store: AuditStore, make_exchange: Callable[..., Exchange]) -> Iterator[TestClient]:
    for record in _records(make_exchange):  # one transaction each: the stored order is q1..q5 on both engines
        store.write_many([record])
    with store.engine.begin() as conn:  # the store's conversation ids (set by its writer), by hand here
        conn.execute(sa.text("UPDATE exchanges SET conversation_id = 'conv-a' WHERE id IN ('q1', 'q2')"))
    with TestClient(create_app(store, TOKEN)) as test_client:
        yield test_client


def _get(client: TestClient, path: str, params: Any = None) -> Any:
    response = client.get(path, params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def _ids(client: TestClient, params: Any) -> list[str]:
    return [item["id"] for item in _get(client, "/v1/exchanges", params)["items"]]


def _error(client: TestClient, path: str, params: Any = None) -> tuple[int, str]:
    response = client.get(path, params=params, headers=AUTH)
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return response.status_code, body["error"]["code"]


FILTERS: list[tuple[dict[str, str], list[str]]] = [
    ({}, ["q4", "q5", "q3", "q2", "q1"]),
    ({"model": "gpt-4o"}, ["q5", "q3", "q1"]),
    ({"model": "GPT-4o"}, []),  # exact, case-sensitive
    ({"model": "gpt"}, []),  # not a prefix
    ({"request_model": "gpt-4o"}, ["q5", "q1"]),
    ({"request_model": "gpt-4o-mini"}, ["q3"]),
    ({"dialect": "anthropic-messages"}, ["q2"]),
    ({"dialect": "openai-chat"}, ["q4", "q5", "q3", "q1"]),
    ({"host": "api.openai.com"}, ["q5", "q3", "q1"]),
    ({"host": "localhost"}, ["q4"]),
    ({"user": "alice"}, ["q3", "q1"]),
    ({"user": "carol"}, ["q5"]),
    ({"user": ""}, []),
    ({"outcome": "completed"}, ["q5", "q2", "q1"]),
    ({"outcome": "error"}, ["q3"]),
    ({"outcome": "client_aborted"}, ["q4"]),
    ({"stop_reason": "end_turn"}, ["q5", "q1"]),
    ({"stop_reason": "tool_use"}, ["q2"]),
    ({"tool": "get_weather"}, ["q2", "q1"]),
    ({"tool": "search"}, ["q2"]),
    ({"tool": "get"}, []),
    ({"violation": "seq_gap"}, ["q4", "q3"]),
    ({"violation": "undeclared_tool"}, ["q4"]),
    ({"violation": "seq_repeat"}, []),
    ({"request_id": "req-1"}, ["q1"]),
    ({"request_id": "req-5"}, ["q5"]),
    ({"conversation_id": "conv-a"}, ["q2", "q1"]),
    ({"conversation_id": "conv-b"}, []),
    # combinations: every filter must hold
    ({"model": "gpt-4o", "user": "alice"}, ["q3", "q1"]),
    ({"model": "gpt-4o", "outcome": "completed", "tool": "get_weather"}, ["q1"]),
    ({"violation": "seq_gap", "model": "gpt-4o"}, ["q3"]),
    ({"tool": "get_weather", "dialect": "anthropic-messages", "stop_reason": "tool_use"}, ["q2"]),
    ({"user": "bob", "host": "api.openai.com"}, []),
    ({"host": "api.openai.com", "q": "cafe"}, ["q3", "q1"]),
    ({"stop_reason": "end_turn", "q": "fox"}, ["q5"]),
    # since inclusive, until exclusive; offsets are honoured
    ({"since": "2025-06-01T10:00:00Z"}, ["q4", "q5", "q3", "q2"]),
    ({"until": "2025-06-01T10:00:00Z"}, ["q1"]),
    ({"since": "2025-06-01T10:00:00Z", "until": "2025-06-01T12:00:00Z"}, ["q3", "q2"]),
    ({"since": "2025-06-01T12:00:00+02:00"}, ["q4", "q5", "q3", "q2"]),
    ({"until": "2025-06-01T09:00:00.000001Z"}, ["q1"]),
    ({"until": "2025-06-01T09:00:00Z"}, []),
    ({"since": "2025-06-03T01:30:00Z"}, ["q4"]),
    ({"since": "2025-06-03T01:30:00.000001Z"}, []),
    ({"since": "2025-06-01T09:30:00Z", "until": "2025-06-01T11:00:00Z", "model": "claude-3"}, ["q2"]),
]


@pytest.mark.parametrize("selective_max", [5000, 0], ids=["as-a-set", "row-by-row"])
def test_filters(client: TestClient, monkeypatch: pytest.MonkeyPatch, selective_max: int) -> None:
    """Each filter and combination of ``FILTERS``: exactly the ids written there (one database
    for all of them: a migrated database per case would take minutes), with the child and
    search filters applied either way (``observer.store.query.SELECTIVE_MAX``)."""
    monkeypatch.setattr("observer.store.query.SELECTIVE_MAX", selective_max)
    monkeypatch.setattr("observer.store.query.SEARCH_SELECTIVE_MAX", selective_max)
    got = {str(params): _ids(client, params) for params, _ in FILTERS}
    assert got == {str(params): expected for params, expected in FILTERS}


def test_filters_page_with_the_cursor(client: TestClient) -> None:
    first = _get(client, "/v1/exchanges", {"model": "gpt-4o", "limit": 2})
    assert [i["id"] for i in first["items"]] == ["q5", "q3"]
    second = _get(client, "/v1/exchanges", {"model": "gpt-4o", "limit": 2, "cursor": first["next_cursor"]})
    assert ([i["id"] for i in second["items"]], second["next_cursor"]) == (["q1"], None)


def _pages(client: TestClient, params: dict[str, Any]) -> list[list[str]]:
    """Every page of ``params`` (its ids), following the cursors (at most 20 pages)."""
    pages, cursor = [], None
    for _ in range(20):
        body = _get(client, "/v1/exchanges", {**params, **({"cursor": cursor} if cursor else {})})
        pages.append([i["id"] for i in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
    pytest.fail("more than 20 pages")


def test_a_child_filter_lists_a_record_once_however_many_children_match(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """``tool`` / ``violation`` walk the child rows into their records: a record calling the tool
    three or five times is one item, on every page size and across cursors."""

    def calls(*names: str) -> list[ToolCall]:
        return [ToolCall(index=i, id=f"c{i}", name=n, arguments="{}") for i, n in enumerate(names)]

    r1 = make_exchange("r1", T0)
    r1.tool_calls = calls("get_weather", "get_weather", "get_weather")
    r1.violations = [Violation(kind="seq_gap", seq=s) for s in (1, 2, 3, 4)]
    r2 = make_exchange("r2", T0 + timedelta(hours=1), model="claude-3")
    r2.tool_calls = calls("get_weather", "search", "get_weather", "get_weather", "get_weather", "get_weather")
    r3 = make_exchange("r3", T0 + timedelta(hours=2), model="claude-3")
    r3.tool_calls = calls("search")
    r3.violations = [Violation(kind="seq_gap", seq=9)]
    r4 = make_exchange("r4", T0 + timedelta(hours=3))
    r4.tool_calls = calls("get_weather")
    r4.violations = [Violation(kind="seq_gap", seq=1), Violation(kind="seq_gap", seq=2)]
    store.write_many([r1, r2, r3, r4])
    with TestClient(create_app(store, TOKEN)) as client:
        weather = {"tool": "get_weather"}
        assert _pages(client, {**weather, "limit": 1}) == [["r4"], ["r2"], ["r1"]]
        assert _pages(client, {**weather, "limit": 2}) == [["r4", "r2"], ["r1"]]
        assert _pages(client, {**weather, "limit": 3}) == [["r4", "r2", "r1"]]
        assert _pages(client, {**weather, "limit": 50}) == [["r4", "r2", "r1"]]
        assert _pages(client, {**weather, "model": "claude-3", "limit": 1}) == [["r2"]]
        assert _pages(client, {**weather, "violation": "seq_gap", "limit": 1}) == [["r4"], ["r1"]]
        assert _pages(client, {"violation": "seq_gap", "limit": 2}) == [["r4", "r3"], ["r1"]]
        assert _pages(client, {"violation": "seq_gap", "until": "2025-06-01T11:30:00Z"}) == [["r3", "r1"]]
        assert _pages(client, {"tool": "search", "since": "2025-06-01T10:00:00Z"}) == [["r3", "r2"]]
        # model=claude-3 has 2 records, get_weather 9 calls: the page follows the model (r3 has no such call)
        assert _pages(client, {**weather, "model": "claude-3"}) == [["r2"]]
        assert _pages(client, {"violation": "seq_gap", "model": "claude-3"}) == [["r3"]]
    # Which side each walks (counted by hand: get_weather 9 calls, search 2, seq_gap 7 violations).
    tc, vt = ToolCallRow.__table__, ViolationRow.__table__
    with store.engine.connect() as conn:

        def walked(**given: str) -> Any:
            filters = query.Filters(**given)
            chosen = query._walked(conn, filters, query._children(filters))
            return None if chosen is None else chosen[1]

        assert walked(tool="get_weather") is tc
        assert walked(tool="get_weather", model="claude-3") is None
        assert walked(tool="search", model="claude-3") is tc  # 2 records are not fewer than 2 calls
        assert walked(tool="get_weather", violation="seq_gap") is vt
        assert walked(tool="search", violation="seq_gap") is tc


SEARCHES: list[tuple[str, list[str]]] = [
    ("zebra", ["q1"]),  # a prompt word
    ("walrus", ["q2"]),  # a completion word
    ("walruses", ["q2"]),  # a prompt word inside a content part
    ("Zebra", ["q1"]),
    ("ZEBRA", ["q1"]),
    ("café", ["q3", "q1"]),  # q1's completion "café", q3's prompt "CAFÉ"
    ("CAFE", ["q3", "q1"]),
    ("cafe", ["q3", "q1"]),
    ("Café", ["q3", "q1"]),
    ("pret", ["q1"]),
    ("cafe lait", ["q3"]),  # every word, in one record
    ("le lait", []),  # "le" in q1, "lait" in q3
    ("quick dog", ["q5"]),  # one word from the completion, one from the prompt
    ("dog quick", ["q5"]),  # any order
    ("zebra walrus", []),
    ("zebr", []),  # no prefixes
    ("fox!", ["q5"]),
    # FTS operators are words (or nothing) here
    ("AND", ["q4"]),
    ("and", ["q4"]),
    ("NEAR(", ["q4"]),
    ("NEAR(x", ["q4"]),
    ("star*", ["q4"]),
    ("zebr*", []),
    ('"quoted"', ["q4"]),
    ('"quoted', ["q4"]),
    ("zebra OR walrus", []),
    ("zebra AND walrus", []),
    ("NOT zebra", []),
    ("-zebra", ["q1"]),
    ("zebra -walrus", []),  # "-" is no negation: walrus must be there too
    ("prompt:zebra", []),  # no column filter: "prompt" is a word
    ("completion : fox", []),
    ("^zebra", ["q1"]),
    ("zebra + ' ( ) { } :", ["q1"]),
    ("x AND y OR z NEAR(a b, 2)", []),
]


@pytest.mark.parametrize("selective_max", [5000, 0], ids=["as-a-set", "row-by-row"])
def test_search(client: TestClient, monkeypatch: pytest.MonkeyPatch, selective_max: int) -> None:
    """q: every word in the prompt or completion, case- and accent-insensitive, no operators
    (FTS5's and tsquery's operator characters are words or nothing, never a 500)."""
    monkeypatch.setattr("observer.store.query.SELECTIVE_MAX", selective_max)
    monkeypatch.setattr("observer.store.query.SEARCH_SELECTIVE_MAX", selective_max)
    got = {q: _ids(client, {"q": q}) for q, _ in SEARCHES}
    assert got == dict(SEARCHES)


NO_WORD = ["", " ", "?!", '"', "*", "()", '""', "-", "^", "*:", "\u3000"]


def test_a_search_without_a_word_or_too_big_is_400(client: TestClient) -> None:
    bad = [*NO_WORD, "x" * 501, " ".join(["w"] * 33), "zebra\x00"]
    got = {q: _error(client, "/v1/exchanges", {"q": q}) for q in bad}
    assert got == dict.fromkeys(bad, (400, "invalid_parameter"))
    assert _ids(client, {"q": " ".join(["zebra"] * 32)}) == ["q1"]  # 32 words: the most


def test_search_filters_stats_too(client: TestClient) -> None:
    groups = _get(client, "/v1/stats", {"group_by": "model", "q": "cafe"})["groups"]
    assert groups == [
        _group("model", "gpt-4o", 2, 1, input=(10, 1), output=(5, 1), cache_read=(4, 1), reasoning=(0, 1))
    ]


BAD_LIST_QUERIES = dict(
    [
        ("format=csv", (400, "unknown_parameter")),
        ("model=gpt-4o&format=csv", (400, "unknown_parameter")),
        ("Model=gpt-4o", (400, "unknown_parameter")),  # names are exact
        ("end_user=alice", (400, "unknown_parameter")),
        ("model=a&model=b", (400, "repeated_parameter")),
        ("model=a&model=a", (400, "repeated_parameter")),
        ("q=a&q=b", (400, "repeated_parameter")),
        ("since=yesterday", (400, "invalid_parameter")),
        ("since=2025-06-01T00:00:00", (400, "invalid_parameter")),  # no offset
        ("since=2025-06-01", (400, "invalid_parameter")),
        ("until=2025-06-01T09:00:00Z&since=2025-06-01T09:00:00Z", (400, "invalid_parameter")),
        ("until=2025-06-01T08:00:00Z&since=2025-06-01T09:00:00Z", (400, "invalid_parameter")),
        ("model=a%00b", (400, "invalid_parameter")),
        ("user=%00", (400, "invalid_parameter")),
        ("tool=a%00", (400, "invalid_parameter")),
        ("host=" + "h" * 501, (400, "invalid_parameter")),
        ("recorded_after=0&cursor=abc", (400, "invalid_parameter")),
    ]
)
BAD_STATS_QUERIES = dict(
    [
        ("group_by=model&format=csv", (400, "unknown_parameter")),
        ("group_by=model&group_by=day", (400, "repeated_parameter")),
        ("group_by=model&limit=5", (400, "unknown_parameter")),  # stats take no paging
        ("group_by=week", (400, "invalid_parameter")),
        ("", (400, "invalid_parameter")),
        ("group_by=model&since=yesterday", (400, "invalid_parameter")),
        ("group_by=model&model=a%00", (400, "invalid_parameter")),
        ("group_by=model&q=%3F", (400, "invalid_parameter")),
    ]
)


def test_bad_parameters_are_400(client: TestClient) -> None:
    """Unknown or repeated names, bad values: 400 with the code, never ignored (never a 500)."""
    got = {q: _error(client, f"/v1/exchanges?{q}") for q in BAD_LIST_QUERIES}
    assert got == BAD_LIST_QUERIES
    got = {q: _error(client, f"/v1/stats?{q}") for q in BAD_STATS_QUERIES}
    assert got == BAD_STATS_QUERIES


def test_a_value_with_a_nul_never_reaches_the_database(client: TestClient) -> None:
    """Trial finding (PostgreSQL refuses NUL in text: a 500): every text filter checks it."""
    for name in ("model", "request_model", "dialect", "host", "user", "outcome", "stop_reason", "tool"):
        assert _error(client, "/v1/exchanges", {name: "a\x00"}) == (400, "invalid_parameter"), name
    for name in ("violation", "request_id", "conversation_id", "q"):
        assert _error(client, "/v1/exchanges", {name: "a\x00"}) == (400, "invalid_parameter"), name


# ----- the stored-order feed -----


def _settle(store: AuditStore) -> None:
    """PostgreSQL: waits until no transaction older than the last record stored is running: the
    feed returns a record only then (``observer.store.stored.horizon``), and other sessions of
    the server (other tests) may hold the horizon back for a while."""
    if store.engine.dialect.name != "postgresql":
        return
    with store.engine.connect() as conn:
        last = conn.scalar(sa.text("SELECT max(stored_seq) FROM exchanges"))
    deadline = time.monotonic() + 60
    while True:
        with store.engine.connect() as conn:
            if horizon(conn) > last:  # type: ignore[operator]
                return
        if time.monotonic() > deadline:
            pytest.fail("a transaction of the server stayed open for a minute: the feed's horizon did not pass")
        time.sleep(0.05)


def _feed(client: TestClient, after: str, **params: Any) -> tuple[list[str], str]:
    page = _get(client, "/v1/exchanges", {"recorded_after": after, **params})
    assert page["next_cursor"] is None
    return [i["id"] for i in page["items"]], page["recorded_position"]


def test_the_feed_is_in_stored_order_and_polls(
    client: TestClient, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    _settle(store)
    ids, position = _feed(client, "0")
    assert ids == ["q1", "q2", "q3", "q4", "q5"]  # stored order, not started_at's (q4 is the newest)
    assert _get(client, "/v1/exchanges")["recorded_position"] is None  # only the feed has one
    again, same = _feed(client, position)
    assert (again, same) == ([], position)  # an empty page keeps the position
    late = make_exchange("q0", T0 - timedelta(days=1), model="gpt-4o")  # stored last, started first
    store.write_many([late])
    _settle(store)
    newer, after_late = _feed(client, position)
    assert newer == ["q0"]
    assert after_late != position
    assert _feed(client, after_late) == ([], after_late)
    assert _feed(client, "0")[0] == ["q1", "q2", "q3", "q4", "q5", "q0"]
    assert _ids(client, {}) == ["q4", "q5", "q3", "q2", "q1", "q0"]  # by time it is last


def test_the_feed_pages_each_record_once(
    client: TestClient, store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    _settle(store)
    pages = []
    position = "0"
    while True:
        ids, next_position = _feed(client, position, limit=2)
        if not ids:
            assert next_position == position
            break
        pages.append(ids)
        position = next_position
    assert pages == [["q1", "q2"], ["q3", "q4"], ["q5"]]
    # Several records of one transaction (one stored_seq on PostgreSQL): ordered by id, each once.
    store.write_many([make_exchange(i, T0 + timedelta(days=9)) for i in ("r3", "r1", "r2")])
    _settle(store)
    assert _feed(client, position, limit=2)[0] in (["r1", "r2"], ["r3", "r1"])
    seen: list[str] = []
    while True:
        ids, position = _feed(client, position, limit=2)
        if not ids:
            break
        seen += ids
    assert sorted(seen) == ["r1", "r2", "r3"] and len(seen) == 3


def test_the_feed_takes_the_filters(client: TestClient, store: AuditStore) -> None:
    _settle(store)
    assert _feed(client, "0", model="gpt-4o")[0] == ["q1", "q3", "q5"]
    ids, position = _feed(client, "0", model="gpt-4o", limit=2)
    assert ids == ["q1", "q3"]
    assert _feed(client, position, model="gpt-4o")[0] == ["q5"]
    assert _feed(client, "0", q="cafe")[0] == ["q1", "q3"]
    assert _feed(client, "0", since="2025-06-01T10:00:00Z", until="2025-06-01T12:00:00Z")[0] == ["q2", "q3"]


FORGED = [
    "bm90LWEtcG9zaXRpb24",  # base64 of "not-a-position"
    "garbage!",
    "WyJ4IiwieCJd",  # ["x","x"]: not [int, str]
    "WzEuNSwieCJd",  # [1.5,"x"]
    "Wy01LCIiXQ",  # [-5,""]
    "WzEsMiwzXQ",  # [1,2,3]
    "WzUsICJcdTAwMDAiXQ",  # [5,"\u0000"]: PostgreSQL refuses NUL in text (trial finding: 500)
    "e30",  # {}
    "-1",
    "",
    "A" * 600,  # too long: refused by the parameter's max_length
]


def test_a_forged_position_is_400(client: TestClient) -> None:
    got = {p: _error(client, "/v1/exchanges", {"recorded_after": p}) for p in FORGED}
    assert got == {**dict.fromkeys(FORGED, (400, "invalid_cursor")), "A" * 600: (400, "invalid_parameter")}


def test_a_cursor_with_a_nul_is_400_on_both_engines(client: TestClient) -> None:
    """``["2026-03-04T00:00:00Z", "\u0000"]`` as a cursor (trial finding: 500 on PostgreSQL,
    which refuses NUL in text), with and without a child filter."""
    cursor = "WyIyMDI2LTAzLTA0VDAwOjAwOjAwWiIsICJcdTAwMDAiXQ"
    for params in ({"cursor": cursor}, {"cursor": cursor, "tool": "get_weather"}):
        assert _error(client, "/v1/exchanges", params) == (400, "invalid_cursor"), params


# ----- stats -----

#: The token classes of a stats group, as the API names them (the record's usage names).
TOKEN_CLASSES = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cache_read_input_tokens",
    "cache_creation": "cache_creation_input_tokens",
    "reasoning": "reasoning_output_tokens",
}


def _group(by: str, key: str | None, exchanges: int, not_reported: int, **tokens: tuple[int, int]) -> dict[str, Any]:
    """A stats group as the API gives it, from hand-written ``(sum, exchanges that reported it)``
    per token class (``TOKEN_CLASSES``' short names); a class not given: ``(0, 0)``."""
    assert set(tokens) <= set(TOKEN_CLASSES), tokens
    group: dict[str, Any] = {by: key, "exchanges": exchanges, "usage_not_reported": not_reported}
    for short, name in TOKEN_CLASSES.items():
        group[name], group[f"{name}_reported"] = tokens.get(short, (0, 0))
    return group


# Per record (by hand from _records): (input, output, cache_read, cache_creation, reasoning),
# None where not reported: q1 (10, 5, 4, -, 0), q2 (20, 7, 0, 12, -), q3 no usage event,
# q4 (3, -, -, -, -), q5 (1, 2, -, -, 9).
Q2 = {"input": (20, 1), "output": (7, 1), "cache_read": (0, 1), "cache_creation": (12, 1)}
Q4 = {"input": (3, 1)}
Q1_Q3_Q5 = {"input": (11, 2), "output": (7, 2), "cache_read": (4, 1), "reasoning": (9, 2)}
STATS: dict[str, list[dict[str, Any]]] = {
    "model": [
        _group("model", "claude-3", 1, 0, **Q2),
        _group("model", "gpt-4o", 3, 1, **Q1_Q3_Q5),
        _group("model", None, 1, 0, **Q4),
    ],
    "day": [
        _group(
            "day",
            "2025-06-01",
            4,
            1,
            input=(31, 3),
            output=(14, 3),
            cache_read=(4, 2),
            cache_creation=(12, 1),
            reasoning=(9, 2),
        ),
        _group("day", "2025-06-03", 1, 0, **Q4),
    ],
    "user": [
        _group("user", "alice", 2, 1, input=(10, 1), output=(5, 1), cache_read=(4, 1), reasoning=(0, 1)),
        _group("user", "bob", 1, 0, **Q2),
        _group("user", "carol", 1, 0, input=(1, 1), output=(2, 1), reasoning=(9, 1)),
        _group("user", None, 1, 0, **Q4),
    ],
    "dialect": [
        _group("dialect", "anthropic-messages", 1, 0, **Q2),
        _group("dialect", "openai-chat", 4, 1, input=(14, 3), output=(7, 2), cache_read=(4, 1), reasoning=(9, 2)),
    ],
    "host": [
        _group("host", "api.anthropic.com", 1, 0, **Q2),
        _group("host", "api.openai.com", 3, 1, **Q1_Q3_Q5),
        _group("host", "localhost", 1, 0, **Q4),
    ],
}


def test_stats_by_hand(client: TestClient) -> None:
    """Counts, per token class the sum of what was reported and how many exchanges reported it
    (a sum of 0 over reports, q2's cache read, is not "none reported", q1's cache creation),
    and usage_not_reported per group, ordered by the key, the group without one (null) last on
    both engines; day: the UTC date."""
    got = {g: _get(client, "/v1/stats", {"group_by": g}) for g in STATS}
    assert got == {g: {"group_by": g, "filters": {}, "groups": groups} for g, groups in STATS.items()}


def test_stats_with_filters(client: TestClient) -> None:
    body = _get(client, "/v1/stats", {"group_by": "day", "user": "alice", "since": "2025-06-01T10:30:00+00:00"})
    assert body == {
        "group_by": "day",
        "filters": {"since": "2025-06-01T10:30:00.000000Z", "user": "alice"},
        "groups": [_group("day", "2025-06-01", 1, 1)],
    }
    assert _get(client, "/v1/stats", {"group_by": "host", "model": "none-such"})["groups"] == []
    assert _get(client, "/v1/stats", {"group_by": "model", "tool": "get_weather"})["groups"] == [
        _group("model", "claude-3", 1, 0, **Q2),
        _group("model", "gpt-4o", 1, 0, input=(10, 1), output=(5, 1), cache_read=(4, 1), reasoning=(0, 1)),
    ]
    assert _get(client, "/v1/stats", {"group_by": "user", "violation": "seq_gap"})["groups"] == [
        _group("user", "alice", 1, 1),
        _group("user", None, 1, 0, **Q4),
    ]


def _sqlite_table_columns_read(conn: sa.Connection, statement: str, parameters: Any) -> set[str]:
    """The ``exchanges`` columns the SQLite program of ``statement`` reads from the table
    itself (``Column`` opcodes on a cursor opened on the table's root page), not from an index."""
    root = conn.exec_driver_sql("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = 'exchanges'")
    table = root.scalar()
    names = [r[1] for r in conn.exec_driver_sql("PRAGMA table_info(exchanges)")]
    program = conn.exec_driver_sql(f"EXPLAIN {statement}", parameters).all()
    cursors = {r[2] for r in program if r[1] == "OpenRead" and r[3] == table}
    return {names[r[3]] for r in program if r[1] == "Column" and r[2] in cursors}


@pytest.mark.parametrize("group_by", list(STATS))
def test_stats_reads_an_index_not_the_table(client: TestClient, store: AuditStore, group_by: str) -> None:
    """Every column stats reads is in the index it scans (a stats call that reads the table
    reads every record: docs/performance.md). SQLite reads no column of the table, but, by
    day, ``started_at`` of each day's first row: ``ix_exchanges_day`` is on an expression, which
    SQLite (3.40) computes again for the group's key from the table row (a deferred seek, one
    row per day), the sums come from the index. PostgreSQL, told to avoid sequential and bitmap
    scans, makes an index only scan of each partition (an Index Scan when a column is missing)."""
    statements: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        statements.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", capture)
    try:
        query.stats(store.engine, group_by, query.Filters())
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", capture)
    (statement, parameters), *_ = [s for s in statements if "GROUP BY" in s[0]]
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            read = _sqlite_table_columns_read(conn, statement, parameters)
            assert read == ({"started_at"} if group_by == "day" else set()), read
        else:
            conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            plan = [r[0] for r in conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)]
            scans = [line for line in plan if "Scan" in line]
            assert scans and all("Index Only Scan" in line for line in scans), plan


def test_stats_day_is_the_utc_date_around_midnight(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """23:59:59.999999 UTC and 00:00 UTC are two days, whatever offset the record was made with."""
    plus_9 = timezone(timedelta(hours=9))
    store.write_many(
        [
            make_exchange("d1", datetime(2025, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)),
            make_exchange("d2", datetime(2026, 1, 1, 9, 0, tzinfo=plus_9)),  # 00:00 UTC
            make_exchange("d3", datetime(2026, 1, 1, 8, 59, tzinfo=plus_9)),  # 23:59 UTC the day before
        ]
    )
    with TestClient(create_app(store, TOKEN)) as c:
        groups = _get(c, "/v1/stats", {"group_by": "day"})["groups"]
    assert [(g["day"], g["exchanges"], g["usage_not_reported"]) for g in groups] == [
        ("2025-12-31", 2, 2),
        ("2026-01-01", 1, 1),
    ]


def test_stats_of_counts_at_the_64_bit_bound(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """Trial finding: two counts of 2^63 - 1 (valid 64-bit integers, draft §8.4) made SQLite's
    SUM fail with "integer overflow" and every stats call over their group answer 503. Now the
    sum is 2^64 - 2 on PostgreSQL (exact) and that number's nearest float on SQLite (TOTAL: exact
    below 2^53); a group of ordinary counts beside them is exact on both."""
    big = 2**63 - 1
    store.write_many(
        [
            make_exchange("b1", T0, model="huge", usage=Usage(big, 1, cache_read_input_tokens=big, reported=True)),
            make_exchange("b2", T0, model="huge", usage=Usage(big, 2, cache_read_input_tokens=big, reported=True)),
            make_exchange("b3", T0, model="small", usage=Usage(2**53 - 2, 3, reported=True)),
            make_exchange("b4", T0, model="small", usage=Usage(1, 4, reported=True)),
        ]
    )
    with TestClient(create_app(store, TOKEN)) as c:
        groups = {g["model"]: g for g in _get(c, "/v1/stats", {"group_by": "model"})["groups"]}
    want = 2**64 - 2 if store.engine.dialect.name == "postgresql" else int(float(2**64 - 2))
    huge = groups["huge"]
    assert (huge["input_tokens"], huge["output_tokens"], huge["cache_read_input_tokens"]) == (want, 3, want)
    assert (huge["input_tokens_reported"], huge["cache_read_input_tokens_reported"]) == (2, 2)
    small = groups["small"]
    assert (small["input_tokens"], small["output_tokens"]) == (2**53 - 1, 7)  # exact below 2^53


def test_search_folds_accents_alike_on_both_engines(store: AuditStore, make_exchange: Callable[..., Exchange]) -> None:
    """What unicode61 folds (a Latin letter with marks, text written decomposed too) PostgreSQL
    folds (``search.fold``); what it keeps (ø, ß) both keep."""
    texts = {"n1": "cafe\u0301 crème", "n2": "Tiếng Việt", "n3": "Søren Straße", "n4": "ÉCOLE Ångström"}
    store.write_many([make_exchange(i, T0, blocks=[Block(index=0, text=t)]) for i, t in texts.items()])
    with TestClient(create_app(store, TOKEN)) as c:
        got = {
            q: _ids(c, {"q": q})
            for q in ("café", "creme", "viet", "tieng", "søren", "soren", "straße", "ecole", "angstrom", "école")
        }
    assert got == {
        "café": ["n1"],
        "creme": ["n1"],
        "viet": ["n2"],
        "tieng": ["n2"],
        "søren": ["n3"],
        "soren": [],
        "straße": ["n3"],
        "ecole": ["n4"],
        "angstrom": ["n4"],
        "école": ["n4"],
    }


def test_a_record_with_more_words_than_a_vector_holds_is_stored_and_found_by_its_first(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """120,000 distinct 8-letter words (1.1 MB of text): PostgreSQL's ``to_tsvector`` refused it
    ("string is too long for tsvector"), failing the batch; the writer's vector stops at
    ``search.VECTOR_MAX_BYTES`` (the first ~83,000 words), SQLite's FTS5 indexes them all."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(letters[(n // 26**k) % 26] for k in range(8)) for n in range(120_000)]
    store.write_many([make_exchange("big", T0, blocks=[Block(index=0, text=" ".join(vocab))])])
    with TestClient(create_app(store, TOKEN)) as c:
        first, last = _ids(c, {"q": vocab[0]}), _ids(c, {"q": vocab[-1]})
    sqlite = store.engine.dialect.name == "sqlite"
    assert (first, last) == (["big"], ["big"] if sqlite else [])
