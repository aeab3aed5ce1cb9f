"""The conformance report (``GET /v1/conformance``, ``observer conformance``) over stored wire
fixtures, on SQLite and PostgreSQL.

``PLACED`` stores 16 wire fixtures at five endpoints over two days. Every expected count below
was written by hand from the fixtures' ``*.expected.json`` (outcome, ``usage.reported``,
``violations``, ``events``), not from running the report; the first test checks that the
stored records are what those files say, so the counts rest on them. Per fixture (outcome,
usage reported, violations by kind):

- llm-a (https://llm-a.example:443, llm-stream-1.0): complete_example (completed, usage, none),
  violations (completed, usage; request_id_mismatch x2, seq_repeat, seq_gap x2, invalid_json,
  type_mismatch, undeclared_tool, unsupported_version, seq_exhausted, event_after_end),
  truncated_no_start (truncated; missing_stream_start, missing_stream_end), tool_flow
  (completed, usage, none), unterminated_final (completed; unterminated_final_event);
- llm-b (http://llm-b.example:8000, llm-stream-1.0): crlf_comments_bom (completed, none),
  error_mid_stream (error, none), multi_block (completed, none), no_event_field (completed;
  type_mismatch x2);
- openai (https://api.openai.com:443, openai.chat): text_include_usage (completed, usage,
  none), truncated_no_done (truncated; missing_stream_end), unterminated_final_event
  (completed; unterminated_final_event);
- the same host, openai.responses: text_stream (completed, usage, none), error_event (error;
  missing_stream_end);
- anthropic (https://api.anthropic.com, no port, anthropic.messages): truncated (truncated,
  usage; missing_stream_end), text_stream (completed, usage; unterminated_final_event).

Every fixture has events (``events`` > 0), so each llm-stream-1.0 and openai.responses one is
seq-checked; only ``violations`` breaks its seq.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from observer.api import create_app
from observer.cli import app as cli_app
from observer.dialects.registry import default_registry
from observer.records import Exchange, Violation
from observer.store import access, conformance
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore, exchange_from_dict
from observer.store.tokens import create_token, revoke_token
from tests.wirefeed import assert_matches, load, observe_case

TOKEN = "token-for-conformance-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DAY1 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)
DAY2 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
# 23:30 at -02:00 on March 1st is 01:30 UTC on March 2nd: a record of day 2.
LATE_DAY1_AT_MINUS_2 = datetime(2026, 3, 1, 23, 30, tzinfo=timezone(timedelta(hours=-2)))

LLM_A = ("https", "llm-a.example", 443)
LLM_B = ("http", "llm-b.example", 8000)
OPENAI = ("https", "api.openai.com", 443)
ANTHROPIC = ("https", "api.anthropic.com", None)
#: (dialect, fixture, endpoint, started_at), one record each.
PLACED: list[tuple[str, str, tuple[str, str, int | None], datetime]] = [
    ("llm-stream-1.0", "complete_example", LLM_A, DAY1),
    ("llm-stream-1.0", "violations", LLM_A, DAY1 + timedelta(minutes=1)),
    ("llm-stream-1.0", "truncated_no_start", LLM_A, DAY1 + timedelta(minutes=2)),
    ("llm-stream-1.0", "tool_flow", LLM_A, DAY2),
    ("llm-stream-1.0", "unterminated_final", LLM_A, DAY2 + timedelta(minutes=1)),
    ("llm-stream-1.0", "crlf_comments_bom", LLM_B, DAY1 + timedelta(minutes=3)),
    ("llm-stream-1.0", "error_mid_stream", LLM_B, DAY2 + timedelta(minutes=2)),
    ("llm-stream-1.0", "multi_block", LLM_B, DAY2 + timedelta(minutes=3)),
    ("llm-stream-1.0", "no_event_field", LLM_B, DAY2 + timedelta(minutes=4)),
    ("openai.chat", "text_include_usage", OPENAI, DAY1 + timedelta(minutes=4)),
    ("openai.chat", "truncated_no_done", OPENAI, DAY2 + timedelta(minutes=5)),
    ("openai.chat", "unterminated_final_event", OPENAI, DAY2 + timedelta(minutes=6)),
    ("openai.responses", "text_stream", OPENAI, DAY1 + timedelta(minutes=5)),
    ("openai.responses", "error_event", OPENAI, DAY2 + timedelta(minutes=7)),
    ("anthropic.messages", "truncated", ANTHROPIC, DAY1 + timedelta(minutes=6)),
    ("anthropic.messages", "text_stream", ANTHROPIC, LATE_DAY1_AT_MINUS_2),
]


def _v(count: int, exchanges: int) -> dict[str, int]:
    return {"count": count, "exchanges": exchanges}


def _counts(
    exchanges: int,
    completed: tuple[int, float],
    usage: tuple[int, float],
    conformant: tuple[int, float],
    seq: tuple[int, int | None, float | None],
    violations: dict[str, dict[str, int]],
) -> dict[str, Any]:
    """A group's counts, each share written beside its count."""
    return {
        "exchanges": exchanges,
        "completed": completed[0],
        "completed_share": completed[1],
        "usage_reported": usage[0],
        "usage_reported_share": usage[1],
        "conformant": conformant[0],
        "conformant_share": conformant[1],
        "seq_checked": seq[0],
        "seq_monotonic": seq[1],
        "seq_monotonic_share": seq[2],
        "violations": violations,
    }


NO_SEQ = (0, None, None)
LLM_A_VIOLATIONS = {
    "event_after_end": _v(1, 1),
    "invalid_json": _v(1, 1),
    "missing_stream_end": _v(1, 1),
    "missing_stream_start": _v(1, 1),
    "request_id_mismatch": _v(2, 1),
    "seq_exhausted": _v(1, 1),
    "seq_gap": _v(2, 1),
    "seq_repeat": _v(1, 1),
    "type_mismatch": _v(1, 1),
    "undeclared_tool": _v(1, 1),
    "unsupported_version": _v(1, 1),
    "unterminated_final_event": _v(1, 1),
}
GROUP_LLM_A = _counts(5, (4, 4 / 5), (3, 3 / 5), (2, 2 / 5), (5, 4, 4 / 5), LLM_A_VIOLATIONS)
GROUP_LLM_B = _counts(4, (3, 3 / 4), (0, 0.0), (3, 3 / 4), (4, 4, 1.0), {"type_mismatch": _v(2, 1)})
GROUP_OPENAI_CHAT = _counts(
    3,
    (2, 2 / 3),
    (1, 1 / 3),
    (1, 1 / 3),
    NO_SEQ,
    {"missing_stream_end": _v(1, 1), "unterminated_final_event": _v(1, 1)},
)
GROUP_RESPONSES = _counts(2, (1, 1 / 2), (1, 1 / 2), (1, 1 / 2), (2, 2, 1.0), {"missing_stream_end": _v(1, 1)})
GROUP_ANTHROPIC = _counts(
    2, (1, 1 / 2), (2, 1.0), (0, 0.0), NO_SEQ, {"missing_stream_end": _v(1, 1), "unterminated_final_event": _v(1, 1)}
)

SEQ_DIALECTS = ["llm-stream-1.0", "openai.responses"]

BY_HOST = [
    {"scheme": "http", "host": "llm-b.example", "port": 8000, "dialect": "llm-stream-1.0"}
    | {"endpoint": "http://llm-b.example:8000"}
    | GROUP_LLM_B,
    {"scheme": "https", "host": "api.anthropic.com", "port": None, "dialect": "anthropic.messages"}
    | {"endpoint": "https://api.anthropic.com"}
    | GROUP_ANTHROPIC,
    {"scheme": "https", "host": "api.openai.com", "port": 443, "dialect": "openai.chat"}
    | {"endpoint": "https://api.openai.com:443"}
    | GROUP_OPENAI_CHAT,
    {"scheme": "https", "host": "api.openai.com", "port": 443, "dialect": "openai.responses"}
    | {"endpoint": "https://api.openai.com:443"}
    | GROUP_RESPONSES,
    {"scheme": "https", "host": "llm-a.example", "port": 443, "dialect": "llm-stream-1.0"}
    | {"endpoint": "https://llm-a.example:443"}
    | GROUP_LLM_A,
]
BY_DIALECT = [
    {"dialect": "anthropic.messages"} | GROUP_ANTHROPIC,
    {"dialect": "llm-stream-1.0"}
    | _counts(9, (7, 7 / 9), (3, 3 / 9), (5, 5 / 9), (9, 8, 8 / 9), LLM_A_VIOLATIONS | {"type_mismatch": _v(3, 2)}),
    {"dialect": "openai.chat"} | GROUP_OPENAI_CHAT,
    {"dialect": "openai.responses"} | GROUP_RESPONSES,
]
# Day 1: complete_example, violations, truncated_no_start, crlf_comments_bom, text_include_usage,
# text_stream (responses), truncated (anthropic). Day 2: the other nine.
BY_DAY = [
    {"day": "2026-03-01"}
    | _counts(
        7,
        (5, 5 / 7),
        (5, 5 / 7),
        (4, 4 / 7),
        (5, 4, 4 / 5),
        {
            "event_after_end": _v(1, 1),
            "invalid_json": _v(1, 1),
            "missing_stream_end": _v(2, 2),
            "missing_stream_start": _v(1, 1),
            "request_id_mismatch": _v(2, 1),
            "seq_exhausted": _v(1, 1),
            "seq_gap": _v(2, 1),
            "seq_repeat": _v(1, 1),
            "type_mismatch": _v(1, 1),
            "undeclared_tool": _v(1, 1),
            "unsupported_version": _v(1, 1),
        },
    ),
    {"day": "2026-03-02"}
    | _counts(
        9,
        (6, 6 / 9),
        (2, 2 / 9),
        (3, 3 / 9),
        (6, 6, 1.0),
        {"missing_stream_end": _v(2, 2), "type_mismatch": _v(2, 1), "unterminated_final_event": _v(3, 3)},
    ),
]


def _record(dialect: str, name: str) -> dict[str, Any]:
    case = load(dialect, name)
    record: dict[str, Any] = observe_case(case, [case.body])
    return record


def _placed() -> list[Exchange]:
    records = []
    for number, (dialect, name, (scheme, host, port), at) in enumerate(PLACED):
        record = exchange_from_dict(_record(dialect, name))
        shift = at - record.started_at
        record.id = f"c{number:02d}-{name}"[:36]
        record.scheme, record.host, record.port = scheme, host, port
        record.started_at = at
        record.ended_at = None if record.ended_at is None else record.ended_at + shift
        records.append(record)
    return records


@pytest.fixture
def filled(store: AuditStore) -> AuditStore:
    store.write_many(_placed())
    return store


@pytest.fixture
def client(filled: AuditStore) -> Iterator[TestClient]:
    with TestClient(create_app(filled, TOKEN)) as test_client:
        yield test_client


def _get(client: TestClient, params: dict[str, str]) -> Any:
    response = client.get("/v1/conformance", params=params, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def test_the_fixtures_give_the_records_their_expected_files_say() -> None:
    """The premise of the hand counts: what the report reads of each placed fixture's record
    (outcome, usage reported, violations, events) is what its expected file says."""
    for dialect, name, _endpoint, _at in PLACED:
        expected = load(dialect, name).expected
        record = _record(dialect, name)
        assert_matches(record, {key: expected[key] for key in ("outcome", "violations", "events")})
        assert record["usage"]["reported"] is expected["usage"]["reported"], name


@pytest.mark.parametrize(("group_by", "expected"), [("host", BY_HOST), ("dialect", BY_DIALECT), ("day", BY_DAY)])
def test_the_report_over_the_fixtures_is_the_hand_count(
    client: TestClient, group_by: str, expected: list[dict[str, Any]]
) -> None:
    """Each grouping of the 16 stored fixtures gives the counts and shares written by hand."""
    body = _get(client, {"group_by": group_by})
    assert body == {"group_by": group_by, "filters": {}, "seq_dialects": SEQ_DIALECTS, "groups": expected}


def test_the_filters_select_the_records(client: TestClient) -> None:
    """since (inclusive) and until (exclusive) on started_at, host and dialect exactly."""
    day2 = _get(client, {"group_by": "day", "since": "2026-03-02T00:00:00Z"})
    assert day2["filters"] == {"since": "2026-03-02T00:00:00.000000Z"}
    assert day2["groups"] == BY_DAY[1:]
    # until is exclusive: the record started at exactly DAY2 (tool_flow) is left out; the
    # anthropic record of 01:30 UTC is in.
    before = _get(client, {"group_by": "dialect", "since": "2026-03-02T00:00:00Z", "until": "2026-03-02T10:00:00Z"})
    assert [(g["dialect"], g["exchanges"]) for g in before["groups"]] == [("anthropic.messages", 1)]
    at_openai = _get(client, {"group_by": "host", "host": "api.openai.com"})
    assert at_openai["groups"] == BY_HOST[2:4]
    responses = _get(client, {"group_by": "host", "host": "api.openai.com", "dialect": "openai.responses"})
    assert responses["groups"] == BY_HOST[3:4]
    assert _get(client, {"group_by": "dialect", "host": "API.openai.com"})["groups"] == []


def test_an_empty_store_has_no_groups(store: AuditStore) -> None:
    with TestClient(create_app(store, TOKEN)) as c:
        for group_by in ("host", "dialect", "day"):
            body = _get(c, {"group_by": group_by})
            assert body == {"group_by": group_by, "filters": {}, "seq_dialects": SEQ_DIALECTS, "groups": []}


def test_seq_gap_or_repeat_breaks_the_sequence_and_a_record_without_events_has_none(
    store: AuditStore, make_exchange: Callable[..., Exchange]
) -> None:
    """Each of seq_gap and seq_repeat alone breaks a sequence, another kind does not; an
    http_error of the draft's dialect had no sequence to check: counted, not seq-checked."""
    draft = {"dialect": "llm-stream-1.0", "events": 3}
    repeat = make_exchange("s1", DAY1, **draft, violations=[Violation(kind="seq_repeat", seq=2)])
    gap = make_exchange("s2", DAY1, **draft, violations=[Violation(kind="seq_gap", seq=5)])
    other = make_exchange("s3", DAY1, **draft, violations=[Violation(kind="type_mismatch", seq=1)])
    no_events = make_exchange("s4", DAY1, dialect="llm-stream-1.0", outcome="http_error", status_code=503)
    store.write_many([repeat, gap, other, no_events])
    with TestClient(create_app(store, TOKEN)) as c:
        (group,) = _get(c, {"group_by": "dialect"})["groups"]
    violations = {"seq_gap": _v(1, 1), "seq_repeat": _v(1, 1), "type_mismatch": _v(1, 1)}
    assert group == {"dialect": "llm-stream-1.0"} | _counts(
        4, (3, 3 / 4), (0, 0.0), (1, 1 / 4), (3, 1, 1 / 3), violations
    )


BAD = [
    ({"group_by": "model"}, "invalid_parameter"),
    ({}, "invalid_parameter"),  # group_by is required, as for /v1/stats
    ({"group_by": "host\x00"}, "invalid_parameter"),
    ({"group_by": "host", "since": "2026-03-02T00:00:00Z", "until": "2026-03-01T00:00:00Z"}, "invalid_parameter"),
    ({"group_by": "host", "since": "2026-03-02T00:00:00Z", "until": "2026-03-02T00:00:00Z"}, "invalid_parameter"),
    ({"group_by": "host", "since": "2026-03-02T00:00:00"}, "invalid_parameter"),  # no offset
    ({"group_by": "host", "since": "2026-03-02T00:00\x00:00Z"}, "invalid_parameter"),
    ({"group_by": "host", "host": "api.openai.com\x00"}, "invalid_parameter"),
    ({"group_by": "host", "dialect": "x" * 501}, "invalid_parameter"),
    ({"group_by": "host", "model": "gpt-4o"}, "unknown_parameter"),
]


@pytest.mark.parametrize(("params", "code"), BAD)
def test_bad_parameters_are_400(client: TestClient, params: dict[str, str], code: str) -> None:
    response = client.get("/v1/conformance", params=params, headers=AUTH)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == code


def test_a_repeated_parameter_is_400(client: TestClient) -> None:
    response = client.get("/v1/conformance?group_by=host&group_by=day", headers=AUTH)
    assert (response.status_code, response.json()["error"]["code"]) == (400, "repeated_parameter")


def test_every_role_may_read_it_and_the_call_is_logged(filled: AuditStore, tmp_path: Path) -> None:
    """As /v1/stats: every role reads it (counts, no content); no valid token is 401; each call
    is in the access log with its route, parameters, status and the groups returned."""
    key = CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")
    store_id = filled.store_id()
    headers = {"none": {}, "unknown": {"Authorization": "Bearer obs_" + "x" * 43}}
    for role in ("viewer", "auditor", "responder", "admin"):
        token, _ = create_token(filled.engine, key, store_id, name=f"{role}-c", role=role, actor="test", at=DAY1)
        headers[role] = {"Authorization": f"Bearer {token}"}
    token, _ = create_token(filled.engine, key, store_id, name="gone", role="viewer", actor="test", at=DAY1)
    revoke_token(filled.engine, key, store_id, ref="gone", actor="test", at=DAY1)
    headers["revoked"] = {"Authorization": f"Bearer {token}"}
    with TestClient(create_app(filled, TOKEN, key)) as c:
        status = {who: c.get("/v1/conformance?group_by=dialect", headers=h).status_code for who, h in headers.items()}
        viewer = c.get("/v1/conformance?group_by=dialect", headers=headers["viewer"]).json()
    assert status == {
        "none": 401,
        "unknown": 401,
        "viewer": 200,
        "auditor": 200,
        "responder": 200,
        "admin": 200,
        "revoked": 401,
    }
    assert viewer["groups"] == BY_DIALECT
    with filled.engine.connect() as conn:
        logged = [e for e in access.entries(conn) if e["endpoint"] == "/v1/conformance"]
    want = {"query": {"group_by": "dialect"}}
    assert [(e["principal"], e["role"], e["status"], e["rows"], e["params"]) for e in logged] == [
        (None, None, 401, None, want | {"authorization": "missing"}),
        (None, None, 401, None, want | {"authorization": "unknown"}),
        ("viewer-c", "viewer", 200, 4, want),
        ("auditor-c", "auditor", 200, 4, want),
        ("responder-c", "responder", 200, 4, want),
        ("admin-c", "admin", 200, 4, want),
        ("gone", None, 401, None, want | {"authorization": "revoked"}),
        ("viewer-c", "viewer", 200, 4, want),
    ]


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli_app, ["conformance", *args], catch_exceptions=False)


def test_the_command_prints_the_report_as_a_table(filled: AuditStore, migrated_url: str) -> None:
    """The table: key, counts with their shares, seq as monotonic/checked, violations as
    kind count/exchanges; written by hand from BY_DIALECT."""
    done = _cli("--group-by", "dialect", "--db", migrated_url)
    assert done.exit_code == 0, done.output
    header = "dialect  exchanges  completed  usage  conformant  seq monotonic  violations (count/exchanges)"
    rows = done.stdout.splitlines()
    assert [" ".join(r.split()) for r in rows] == [
        " ".join(header.split()),
        "anthropic.messages 2 1 (50.0%) 2 (100.0%) 0 (0.0%) - missing_stream_end 1/1, unterminated_final_event 1/1",
        "llm-stream-1.0 9 7 (77.8%) 3 (33.3%) 5 (55.6%) 8/9 (88.9%) event_after_end 1/1, invalid_json 1/1,"
        " missing_stream_end 1/1, missing_stream_start 1/1, request_id_mismatch 2/1, seq_exhausted 1/1,"
        " seq_gap 2/1, seq_repeat 1/1, type_mismatch 3/2, undeclared_tool 1/1, unsupported_version 1/1,"
        " unterminated_final_event 1/1",
        "openai.chat 3 2 (66.7%) 1 (33.3%) 1 (33.3%) - missing_stream_end 1/1, unterminated_final_event 1/1",
        "openai.responses 2 1 (50.0%) 1 (50.0%) 1 (50.0%) 2/2 (100.0%) missing_stream_end 1/1",
    ]
    # Columns line up: the second starts two spaces after the widest key, anthropic.messages.
    assert {r[18:21] for r in rows} == {"  e", "  2", "  9", "  3"}


def test_the_command_by_endpoint_and_as_json(client: TestClient, migrated_url: str) -> None:
    """--json prints exactly what GET /v1/conformance returns; the endpoint table names each
    origin."""
    params = {"group_by": "host", "since": "2026-03-01T00:00:00+01:00"}
    done = _cli("--since", params["since"], "--json", "--db", migrated_url)
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == _get(client, params)
    assert json.loads(done.stdout)["groups"] == BY_HOST
    table = _cli("--db", migrated_url).stdout.splitlines()
    assert [r.split()[:3] for r in table[1:]] == [
        ["http://llm-b.example:8000", "llm-stream-1.0", "4"],
        ["https://api.anthropic.com", "anthropic.messages", "2"],
        ["https://api.openai.com:443", "openai.chat", "3"],
        ["https://api.openai.com:443", "openai.responses", "2"],
        ["https://llm-a.example:443", "llm-stream-1.0", "5"],
    ]


def test_the_command_on_an_empty_store(migrated_url: str) -> None:
    done = _cli("--group-by", "day", "--db", migrated_url)
    assert done.exit_code == 0
    assert (
        done.stdout.split()
        == "day exchanges completed usage conformant seq monotonic violations (count/exchanges)".split()
    )
    assert done.stderr.strip() == "observer: no exchanges"
    as_json = _cli("--json", "--db", migrated_url)
    assert json.loads(as_json.stdout) == {"group_by": "host", "filters": {}, "seq_dialects": SEQ_DIALECTS, "groups": []}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--group-by", "model"], "observer: --group-by must be one of host, dialect, day, got 'model'"),
        (["--since", "2026-03-02"], "observer: --since must be an RFC 3339 time with an offset"),
        (["--since", "2026-03-02T00:00:00Z", "--until", "2026-03-01T00:00:00Z"], "observer: --since is not before"),
        (["--host", "a\x00b"], "observer: --host must not hold a NUL"),
    ],
)
def test_the_command_refuses_bad_arguments(migrated_url: str, args: list[str], message: str) -> None:
    done = _cli(*args, "--db", migrated_url)
    assert done.exit_code == 2
    assert done.stderr.startswith(message), done.stderr


def test_the_command_needs_an_existing_store(tmp_path: Path) -> None:
    done = _cli("--db", f"sqlite:///{tmp_path / 'none.db'}")
    assert done.exit_code == 2
    assert "no such file" in done.stderr


def test_origin_brackets_an_ipv6_address() -> None:
    assert conformance.origin("http", "fd00::5", 8000) == "http://[fd00::5]:8000"
    assert conformance.origin("https", "api.example.com", None) == "https://api.example.com"


def test_lines_show_null_parts_as_a_dash() -> None:
    body = {
        "group_by": "host",
        "groups": [
            {"scheme": "http", "host": "h", "port": None, "dialect": "ollama", "endpoint": "http://h"}
            | _counts(1, (1, 1.0), (0, 0.0), (1, 1.0), NO_SEQ, {})
        ],
    }
    assert [" ".join(line.split()) for line in conformance.lines(body)[1:]] == [
        "http://h ollama 1 1 (100.0%) 0 (0.0%) 1 (100.0%) - -"
    ]


def test_the_seq_dialects_are_registered_dialects() -> None:
    """SEQ_DIALECTS names dialects of the registry (a renamed dialect would silently lose its
    seq check in the report)."""
    assert conformance.SEQ_DIALECTS <= set(default_registry().names)
    assert sorted(conformance.SEQ_DIALECTS) == SEQ_DIALECTS
