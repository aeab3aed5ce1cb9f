"""The access log: one chained entry per API call (denied ones included), verified, tamper-evident,
checkpointed, fail-closed, and readable through ``GET /v1/access-log``.

Expected entries are written by hand from the calls made (not read back from the code).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from observer.api import create_app
from observer.records import Exchange
from observer.store import access
from observer.store.access import CHECKPOINT_AFTER, CHECKPOINT_EVERY, Entry, access_writer
from observer.store.checkpoint import CheckpointKey
from observer.store.store import AuditStore
from observer.store.tokens import create_token
from observer.store.verify import verify

BOOTSTRAP = "bootstrap-token-for-access-tests"
T0 = datetime(2025, 6, 1, 9, 0, 0, tzinfo=timezone.utc)
R1 = "a0000000-0000-4000-8000-000000000001"
R2 = "a0000000-0000-4000-8000-000000000002"
#: The columns compared (not ``at``, ``record_hash``: made by the clock and the chain).
COMPARED = ("seq", "principal", "role", "client", "method", "endpoint", "path", "params", "status", "rows", "ids")


@dataclass
class Api:
    client: TestClient
    store: AuditStore
    key: CheckpointKey
    tokens: dict[str, str]  # role -> token (named "<role>-1")

    def auth(self, role: str) -> dict[str, str]:
        token = BOOTSTRAP if role == "bootstrap" else self.tokens[role]
        return {"Authorization": f"Bearer {token}"}

    def log(self) -> list[dict[str, Any]]:
        with self.store.engine.connect() as conn:
            return list(access.entries(conn))


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


@pytest.fixture
def api(store: AuditStore, key: CheckpointKey, make_exchange: Callable[..., Exchange]) -> Iterator[Api]:
    store.write_many([make_exchange(R1, T0), make_exchange(R2, T0 + timedelta(seconds=1))])
    tokens = {}
    for role in ("viewer", "auditor", "admin"):
        tokens[role], _ = create_token(
            store.engine, key, store.store_id(), name=f"{role}-1", role=role, actor="test", at=T0
        )
    with TestClient(create_app(store, BOOTSTRAP, key)) as client:
        yield Api(client, store, key, tokens)


def _entry(seq: int, principal: str | None, role: str | None, path: str, status: int, **kw: Any) -> dict[str, Any]:
    out = {
        "seq": seq,
        "principal": principal,
        "role": role,
        "client": "testclient",
        "method": "GET",
        "endpoint": path,
        "path": path,
        "params": {},
        "status": status,
        "rows": None,
        "ids": None,
    }
    out.update(kw)
    return out


def _calls(api: Api) -> list[dict[str, Any]]:
    """Makes the calls of the sequence; returns the entries expected, by hand."""
    c = api.client
    assert c.get(f"/v1/exchanges/{R1}", headers=api.auth("admin")).status_code == 200
    assert c.get("/v1/exchanges").status_code == 401
    assert c.get("/v1/access-log", headers=api.auth("viewer")).status_code == 403
    assert c.get("/healthz").status_code == 200  # not logged
    assert c.get("/v2/nothing", headers=api.auth("viewer")).status_code == 404
    assert c.get("/v1/exchanges?format=csv", headers=api.auth("auditor")).status_code == 400
    assert c.get("/v1/exchanges?limit=5", headers=api.auth("auditor")).status_code == 200
    assert c.get("/v1/stats?group_by=day", headers={"Authorization": "Bearer obs_nope"}).status_code == 401
    assert c.get("/v1/exchanges", headers={"Authorization": f"Basic {BOOTSTRAP}"}).status_code == 401
    assert c.get("/readyz").status_code == 200  # not logged
    assert c.get("/v1/stats?group_by=model", headers=api.auth("bootstrap")).status_code == 200
    assert c.get("/v1/exchanges/nope", headers=api.auth("viewer")).status_code == 404
    assert c.get("/v1/exchanges?user=a&user=b", headers=api.auth("viewer")).status_code == 400
    return [
        _calls_first(),
        _entry(2, None, None, "/v1/exchanges", 401, params={"authorization": "missing"}),
        _entry(3, "viewer-1", "viewer", "/v1/access-log", 403),
        _entry(4, "viewer-1", "viewer", "/v2/nothing", 404),
        _entry(5, "auditor-1", "auditor", "/v1/exchanges", 400, params={"query": {"format": "csv"}}),
        _entry(6, "auditor-1", "auditor", "/v1/exchanges", 200, params={"query": {"limit": "5"}}, rows=2, ids=[R2, R1]),
        _entry(7, None, None, "/v1/stats", 401, params={"query": {"group_by": "day"}, "authorization": "unknown"}),
        _entry(8, None, None, "/v1/exchanges", 401, params={"authorization": "malformed"}),
        _entry(9, "bootstrap", "admin", "/v1/stats", 200, params={"query": {"group_by": "model"}}, rows=1),
        _entry(
            10,
            "viewer-1",
            "viewer",
            "/v1/exchanges/nope",
            404,
            endpoint="/v1/exchanges/{exchange_id}",
            params={"path": {"exchange_id": "nope"}},
        ),
        _entry(11, "viewer-1", "viewer", "/v1/exchanges", 400, params={"query": {"user": ["a", "b"]}}),
    ]


def _compared(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in COMPARED} for r in rows]


def _sql(store: AuditStore, statement: str, **params: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def _refuse_append(*args: Any, **kwargs: Any) -> Any:
    """Stands in for ``observer.store.access.append`` when the database refuses the write."""
    raise sa.exc.OperationalError("INSERT INTO access_log", {}, Exception("disk full"))


def test_every_call_has_one_entry_in_order(api: Api) -> None:
    """Allowed, 401 (missing, unknown, malformed), 403, 404 (unknown route and unknown record),
    400 (unknown and repeated parameter): one entry each, in the order made; probes none."""
    expected = _calls(api)
    assert _compared(api.log()) == expected


def test_the_log_verifies_and_is_checkpointed(api: Api) -> None:
    _calls(api)
    report = verify(api.store, [api.key.public])
    assert report.ok, [b.line() for b in report.breaks]
    assert report.access_entries == 11
    writer = access_writer(api.store.store_id())
    assert [(c["number"], c["seq"]) for c in api.store.checkpoints(writer)] == [(1, 1)]


def test_without_a_key_the_log_is_verified_with_a_warning(store: AuditStore, key: CheckpointKey) -> None:
    with TestClient(create_app(store, BOOTSTRAP)) as c:
        c.get("/v1/exchanges")
    assert store.checkpoints(access_writer(store.store_id())) == []
    report = verify(store, None)
    assert report.ok and report.access_entries == 1
    assert "the access log was not checked against signatures (no key given)" in report.warnings
    keyed = verify(store, [key.public])  # with a key, a log without any checkpoint is a break
    assert [(b.writer_id, b.seq) for b in keyed.breaks] == [(access_writer(store.store_id()), 1)]
    assert "no signed checkpoint" in keyed.breaks[0].reason


TAMPERS = {
    "status-changed": (
        ["UPDATE access_log SET status = 200 WHERE seq = 2"],
        2,
        "hash mismatch: access log entry 2 was changed",
    ),
    "principal-changed": (
        ["UPDATE access_log SET principal = 'someone-else' WHERE seq = 1"],
        1,
        "hash mismatch: access log entry 1 was changed",
    ),
    "ids-changed": (
        ["UPDATE access_log SET rows = 1 WHERE seq = 6"],
        6,
        "hash mismatch: access log entry 6 was changed",
    ),
    "middle-deleted": (["DELETE FROM access_log WHERE seq = 5"], 5, "access log entry 5 missing (deleted)"),
    "first-deleted": (["DELETE FROM access_log WHERE seq = 1"], 1, "access log entry 1 missing (deleted)"),
    "all-deleted": (["DELETE FROM access_log"], 1, "tail deleted: checkpoint 1 covers seq 1, the store ends at seq 0"),
    "checkpoints-deleted": (
        ["DELETE FROM checkpoints WHERE writer_id = :writer"],
        1,
        "the access log has no signed checkpoint (deleted, or written without a key)",
    ),
    "checkpoint-moved": (
        ["UPDATE checkpoints SET seq = 2 WHERE writer_id = :writer"],
        2,
        "checkpoint 1: ",
    ),
}


@pytest.mark.parametrize("tamper", list(TAMPERS))
def test_tampering_is_a_break_of_the_access_log_writer(api: Api, tamper: str) -> None:
    """Each change, deletion or removed checkpoint is one break naming the access log's writer."""
    _calls(api)
    statements, seq, reason = TAMPERS[tamper]
    writer = access_writer(api.store.store_id())
    for statement in statements:
        _sql(api.store, statement, **({"writer": writer} if ":writer" in statement else {}))
    report = verify(api.store, [api.key.public])
    assert [(b.writer_id, b.seq) for b in report.breaks] == [(writer, seq)], [b.line() for b in report.breaks]
    assert report.breaks[0].reason.startswith(reason), report.breaks[0].reason


def _append(
    store: AuditStore, key: CheckpointKey | None, count: int, start: datetime, step: timedelta, hint: bool = False
) -> None:
    """``count`` entries ``step`` apart; ``hint``: passing back the checkpoint each returned."""
    store_id = store.store_id()
    checkpointed = None
    for i in range(count):
        entry = Entry(
            at=start + i * step,
            principal="p",
            role="admin",
            client=None,
            method="GET",
            endpoint="/v1/exchanges",
            path="/v1/exchanges",
            params={"query": {"n": str(i)}},
            status=200,
        )
        done = access.append(store.engine, store_id, entry, key, checkpointed=checkpointed if hint else None)
        checkpointed = done.checkpointed


@contextlib.contextmanager
def _checkpoint_reads(store: AuditStore) -> Iterator[list[str]]:
    """Collects the statements that read the checkpoints table while in the ``with``."""
    reads: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "FROM checkpoints" in statement:
            reads.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        yield reads
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)


@pytest.mark.parametrize("hint", [False, True], ids=["no-hint", "hint"])
def test_checkpoints_every_100_entries(store: AuditStore, key: CheckpointKey, hint: bool) -> None:
    """The first entry gets checkpoint 1, entry 101 checkpoint 2 (entries 1 ms apart: never 30 s);
    the same when the caller passes back the checkpoint it was told of, which reads the newest
    checkpoint only when one may be due (entries 1, 101, 201), not for each of the 205."""
    assert CHECKPOINT_EVERY == 100
    with _checkpoint_reads(store) as reads:
        _append(store, key, 205, T0, timedelta(milliseconds=1), hint=hint)
    assert len(reads) == (3 if hint else 205)
    writer = access_writer(store.store_id())
    assert [(c["number"], c["seq"]) for c in store.checkpoints(writer)] == [(1, 1), (2, 101), (3, 201)]
    assert verify(store, [key.public]).ok
    # The last entry checkpointed deleted: found against checkpoint 3.
    _sql(store, "DELETE FROM access_log WHERE seq >= 201")
    report = verify(store, [key.public])
    assert [(b.writer_id, b.seq, b.reason) for b in report.breaks] == [
        (writer, 201, "tail deleted: checkpoint 3 covers seq 201, the store ends at seq 200")
    ]


def test_a_deleted_tail_beyond_the_last_checkpoint_is_the_documented_limit(
    store: AuditStore, key: CheckpointKey
) -> None:
    """Entries after the last checkpoint (fewer than 100, within 30 s) can go unnoticed: at most
    that much; the report tells when the last checkpoint was made."""
    _append(store, key, 50, T0, timedelta(milliseconds=1))
    _sql(store, "DELETE FROM access_log WHERE seq > 40")
    report = verify(store, [key.public])
    assert report.ok and report.access_entries == 40
    assert report.last_checkpoint[access_writer(store.store_id())] == T0


@pytest.mark.parametrize("hint", [False, True], ids=["no-hint", "hint"])
def test_checkpoints_after_30_seconds(store: AuditStore, key: CheckpointKey, hint: bool) -> None:
    """An entry 30 s or more after the last checkpoint gets one, whatever the count."""
    assert CHECKPOINT_AFTER == timedelta(seconds=30)
    _append(store, key, 5, T0, timedelta(seconds=10), hint=hint)  # at 0, 10, 20, 30, 40 s
    writer = access_writer(store.store_id())
    assert [(c["number"], c["seq"]) for c in store.checkpoints(writer)] == [(1, 1), (2, 4)]
    assert verify(store, [key.public]).ok


def test_no_checkpoint_without_a_key(store: AuditStore) -> None:
    _append(store, None, 3, T0, timedelta(seconds=40))
    assert store.checkpoints(access_writer(store.store_id())) == []


def test_a_log_that_cannot_be_written_refuses_the_answer(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """503 access_log_unavailable instead of the data (and instead of a 401/404 alike)."""

    monkeypatch.setattr("observer.store.access.append", _refuse_append)
    for path, headers in (
        (f"/v1/exchanges/{R1}", api.auth("admin")),
        ("/v1/exchanges", api.auth("auditor")),
        ("/v1/exchanges", {}),
        ("/v1/nothing", api.auth("viewer")),
    ):
        response = api.client.get(path, headers=headers)
        assert response.status_code == 503
        assert response.json() == {
            "error": {"code": "access_log_unavailable", "message": "the access log cannot be written; no answer"}
        }
        assert R1 not in response.text and R2 not in response.text
    assert api.client.get("/healthz").status_code == 200  # probes are not logged
    monkeypatch.undo()
    assert api.log() == []
    assert api.client.get(f"/v1/exchanges/{R1}", headers=api.auth("admin")).status_code == 200


def test_an_exception_is_logged_as_500(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    def bug(id: str) -> Any:  # noqa: A002
        raise RuntimeError("bug")

    monkeypatch.setattr(api.store, "get", bug)
    with TestClient(create_app(api.store, BOOTSTRAP, api.key), raise_server_exceptions=False) as client:
        assert client.get(f"/v1/exchanges/{R1}", headers=api.auth("admin")).status_code == 500
    assert [(e["principal"], e["endpoint"], e["status"]) for e in api.log()] == [
        ("admin-1", "/v1/exchanges/{exchange_id}", 500)
    ]


# ----- GET /v1/access-log -----


def _read(api: Api, query: str = "", role: str = "auditor") -> Any:
    response = api.client.get(f"/v1/access-log{query}", headers=api.auth(role))
    assert response.status_code == 200, response.text
    return response.json()


def _seqs(page: Any) -> list[int]:
    return [e["seq"] for e in page["items"]]


def test_the_access_log_endpoint_filters(api: Api) -> None:
    _calls(api)  # entries 1..11; each read below adds its own entry after answering
    full = _read(api)  # entry 12
    assert _seqs(full) == list(range(11, 0, -1))
    assert full["next_before_seq"] is None
    first = full["items"][-1]
    assert {k: first[k] for k in COMPARED} == _calls_first()
    assert set(first) == {*COMPARED, "at", "record_hash"}
    assert _seqs(_read(api, "?principal=viewer-1")) == [11, 10, 4, 3]
    assert _seqs(_read(api, "?principal=bootstrap")) == [9]
    assert _seqs(_read(api, "?status=401")) == [8, 7, 2]
    assert _seqs(_read(api, "?status=200&principal=auditor-1")) == [15, 14, 13, 12, 6]  # 12..15: the reads above
    assert _seqs(_read(api, "?endpoint=/v1/exchanges/{exchange_id}")) == [10, 1]
    assert _seqs(_read(api, f"?exchange_id={R1}")) == [6, 1]
    assert _seqs(_read(api, f"?exchange_id={R2}")) == [6]
    assert _seqs(_read(api, "?exchange_id=nope")) == []  # a 404's path parameter is no id returned
    assert _read(api, "?status=418")["items"] == []


def _calls_first() -> dict[str, Any]:
    return _entry(
        1,
        "admin-1",
        "admin",
        f"/v1/exchanges/{R1}",
        200,
        endpoint="/v1/exchanges/{exchange_id}",
        params={"path": {"exchange_id": R1}},
        rows=1,
        ids=[R1],
    )


def test_the_access_log_endpoint_pages_by_seq(api: Api) -> None:
    _calls(api)
    seen: list[int] = []
    query = "?limit=4&principal=viewer-1"
    pages = 0
    while True:
        page = _read(api, query)
        pages += 1
        seen += _seqs(page)
        if page["next_before_seq"] is None:
            break
        query = f"?limit=4&principal=viewer-1&before_seq={page['next_before_seq']}"
    assert (seen, pages) == ([11, 10, 4, 3], 1)
    seen, query = [], "?limit=4"
    while True:
        page = _read(api, query)
        seen += _seqs(page)
        if page["next_before_seq"] is None:
            break
        query = f"?limit=4&before_seq={page['next_before_seq']}"
    assert seen == list(range(12, 0, -1))  # 12: the viewer-1 read above; the pages below it


def test_the_access_log_endpoint_filters_by_time(api: Api) -> None:
    _calls(api)
    entries = api.log()
    at = {e["seq"]: e["at"] for e in entries}
    cut = at[5].astimezone(timezone.utc) if at[5].tzinfo else at[5].replace(tzinfo=timezone.utc)
    stamp = cut.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert _seqs(_read(api, f"?until={stamp}")) == [4, 3, 2, 1]  # until exclusive
    assert min(_seqs(_read(api, f"?since={stamp}"))) == 5  # since inclusive
    assert _seqs(_read(api, f"?since={stamp}&until={stamp}")) == []


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("?since=yesterday", "invalid_parameter"),
        ("?status=99", "invalid_parameter"),
        ("?before_seq=0", "invalid_parameter"),
        # found by the API fuzz test: past int64 it reached the database (500 on SQLite)
        (f"?before_seq={2**63}", "invalid_parameter"),
        ("?before_seq=10752101488857893205051943007654248448", "invalid_parameter"),
        ("?principal=a%00b", "invalid_parameter"),
        ("?who=me", "unknown_parameter"),
        ("?status=200&status=401", "repeated_parameter"),
    ],
)
def test_the_access_log_endpoint_refuses_bad_parameters(api: Api, query: str, code: str) -> None:
    response = api.client.get(f"/v1/access-log{query}", headers=api.auth("auditor"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


def test_exchange_id_filter_takes_wildcards_literally(store: AuditStore) -> None:
    """Bug found: the id was a LIKE pattern: "a_1" matched "ab1" entries that then filled the
    page's limit and were dropped, so the page came back short with no next_before_seq."""
    store_id = store.store_id()
    for i, ids in enumerate([["a_1"], ["ab1"], ["ab1"], ["ab1"], ["a%1"]]):
        entry = Entry(
            at=T0 + timedelta(seconds=i),
            principal="p",
            role="auditor",
            client=None,
            method="GET",
            endpoint="/v1/exchanges",
            path="/v1/exchanges",
            params={},
            status=200,
            rows=1,
            ids=ids,
        )
        access.append(store.engine, store_id, entry, None)
    items, next_before = access.page(store.engine, access.LogFilters(exchange_id="a_1"), limit=2)
    assert ([e["seq"] for e in items], next_before) == ([1], None)
    items, _ = access.page(store.engine, access.LogFilters(exchange_id="a%1"), limit=2)
    assert [e["seq"] for e in items] == [5]
    items, _ = access.page(store.engine, access.LogFilters(exchange_id="%"), limit=2)
    assert items == []


def test_a_changing_call_is_logged_before_it_runs(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial finding: a hold was made while the call's one entry, written with the answer,
    failed. A POST is logged twice, first with status 0 before anything runs; when that entry
    cannot be written nothing is done."""
    body = {"reason": "case 4", "user": "alice"}
    made = api.client.post("/v1/holds", headers=api.auth("admin"), json=body)
    assert made.status_code == 201
    last_two = [(e["principal"], e["method"], e["endpoint"], e["status"]) for e in api.log()[-2:]]  # oldest first
    assert last_two == [("admin-1", "POST", "/v1/holds", 0), ("admin-1", "POST", "/v1/holds", 201)]

    monkeypatch.setattr("observer.store.access.append", _refuse_append)
    refused = api.client.post("/v1/holds", headers=api.auth("admin"), json={**body, "reason": "case 5"})
    assert refused.status_code == 503
    assert refused.json()["error"] == {
        "code": "access_log_unavailable",
        "message": "the access log cannot be written; nothing was done",
    }
    monkeypatch.undo()
    reasons = [h["reason"] for h in api.client.get("/v1/holds", headers=api.auth("admin")).json()]
    assert reasons == ["case 4"]  # case 5 was never made


def test_a_deleted_tail_is_recorded_by_the_next_entry(api: Api) -> None:
    """The API process remembers the last seq it wrote: finding the log shorter, it appends an
    ``(access log truncated)`` entry naming both seqs before its own entry."""
    for _ in range(3):
        api.client.get("/v1/exchanges", headers=api.auth("admin"))
    last = api.log()[-1]["seq"]
    _sql(api.store, f"DELETE FROM access_log WHERE seq > {last - 2}")
    api.client.get("/v1/exchanges", headers=api.auth("admin"))
    marker, entry = api.log()[-2:]
    assert [(e["seq"], e["endpoint"], e["status"]) for e in (marker, entry)] == [
        (last - 1, "(access log truncated)", 0),
        (last, "/v1/exchanges", 200),
    ]
    assert marker["params"] == {"last_seq_written": last, "last_seq_found": last - 2}
    assert verify(api.store, [api.key.public]).ok  # the chain holds; the marker tells what happened
    # Later calls follow the new head: no marker of their own (trial finding: one per call).
    for _ in range(3):
        api.client.get("/v1/exchanges", headers=api.auth("admin"))
    assert [e["endpoint"] for e in api.log()[-4:]] == ["/v1/exchanges"] * 4


def test_a_deleted_tail_and_its_checkpoints_get_the_marker_signed_when_due(api: Api) -> None:
    """Entries past seq 230 and checkpoint 3 (seq 201) deleted: the API, which remembers
    checkpoint 3, must not trust it; against checkpoint 2 (seq 101) the truncation marker (seq
    231) is due one, and gets it at once (trial finding: it stayed unsigned while the
    remembered checkpoint seemed recent)."""
    for _ in range(250):
        api.client.get("/v1/exchanges?limit=1", headers=api.auth("admin"))
    writer = access_writer(api.store.store_id())
    assert [(c["number"], c["seq"]) for c in api.store.checkpoints(writer)] == [(1, 1), (2, 101), (3, 201)]
    _sql(api.store, "DELETE FROM access_log WHERE seq > 230")
    _sql(api.store, "DELETE FROM checkpoints WHERE writer_id = :writer AND seq > 101", writer=writer)
    for _ in range(3):
        api.client.get("/v1/exchanges?limit=1", headers=api.auth("admin"))
    assert [(e["seq"], e["endpoint"]) for e in api.log()[-4:]] == [
        (231, "(access log truncated)"),
        (232, "/v1/exchanges"),
        (233, "/v1/exchanges"),
        (234, "/v1/exchanges"),
    ]
    assert [(c["number"], c["seq"]) for c in api.store.checkpoints(writer)] == [(1, 1), (2, 101), (3, 231)]
