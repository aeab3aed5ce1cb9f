"""``observer ingest``: flow dumps and HAR files, made here, through the addon's hooks into the
store. Expected records are the hand-written ones of the wire fixtures plus what the flows
say (their times, host, path), written here by hand; a second run stores nothing twice; bad
files get one line and an exit code, never a traceback; the provenance is chained."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from mitmproxy import http
from mitmproxy.flow import Error
from mitmproxy.io import FlowWriter
from mitmproxy.test import tflow
from sqlalchemy import exc as sa_exc
from typer.testing import CliRunner

from observer.cli import app
from observer.config import Settings
from observer.ingest.captures import HAR, NotACapture, open_capture, read_flows
from observer.ingest.replay import Fate, Replay
from observer.ingest.writer import IngestWriter
from observer.records import Provenance, Usage
from observer.store.chain import canonical_record
from observer.store.checkpoint import CheckpointKey
from observer.store.reader import RecordFilter, RecordReader
from observer.store.store import AuditStore
from observer.store.verify import verify
from tests.wirefeed import assert_matches, load_case

BODY, REQUEST, EXPECTED = load_case("llm-stream-1.0", "complete_example")
T0 = 1767225600.25  # 2026-01-01T00:00:00.250000Z
MEDIA_TYPE = "application/llm-request+json"
#: The record fields the flows below decide (the rest: the fixture's expected record).
FLOW_FIELDS = {
    "dialect": "llm-stream-1.0",
    "scheme": "https",
    "host": "llm.example",
    "port": 443,
    "path": "/v1/stream?key=REDACTED&x=1",
    "method": "POST",
    "http_version": "HTTP/1.1",
    "status_code": 200,
    "started_at": "2026-01-01T00:00:00.250000Z",
    "ended_at": "2026-01-01T00:00:01.250000Z",
    "ttft_s": None,  # the chunks' arrival times are not in a file
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("OBSERVER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


# ----- captures made here -----


def llm_flow(body: bytes | None = BODY, *, upload_length: bool = True, encoding: str | None = None) -> http.HTTPFlow:
    """A streamed draft-standard exchange as mitmproxy keeps it: the request buffered (or, with
    ``upload_length`` false, sent without a Content-Length), the response body as its
    content-encoded bytes (``None``: streamed, not kept)."""
    f = tflow.tflow(resp=True)
    f.request.scheme, f.request.host, f.request.port = "https", "llm.example", 443
    f.request.method, f.request.path = "POST", "/v1/stream?key=sk-secret&x=1"
    f.request.headers["content-type"] = MEDIA_TYPE
    f.request.content = REQUEST
    if not upload_length:
        del f.request.headers["content-length"]
    f.request.timestamp_start, f.request.timestamp_end = T0, T0 + 0.01
    headers = {"content-type": "text/event-stream"}
    if encoding is not None:
        headers["content-encoding"] = encoding
    f.response = http.Response.make(200, b"", headers)
    del f.response.headers["content-length"]
    f.response.raw_content = body
    f.response.timestamp_start, f.response.timestamp_end = T0 + 0.2, T0 + 1.0
    return f


def other_flow() -> http.HTTPFlow:
    """A request that is not LLM traffic."""
    f = tflow.tflow(resp=True)
    f.request.host, f.request.path, f.request.method = "example.com", "/index.html", "GET"
    f.request.timestamp_start = T0
    return f


def write_dump(path: Path, flows: list[http.HTTPFlow], mode: str = "wb") -> Path:
    with open(path, mode) as fo:
        writer = FlowWriter(fo)
        for f in flows:
            writer.add(f)
    return path


def har_entry(
    *, response_text: str | None, encoding: str | None = None, post: dict | None = None, status: int = 200
) -> dict[str, Any]:
    content: dict[str, Any] = {"size": 997, "mimeType": "text/event-stream"}
    if response_text is not None:
        content["text"] = response_text
    if encoding is not None:
        content["encoding"] = encoding
    return {
        "startedDateTime": "2026-01-01T00:00:00.250Z",
        "time": 1000,
        "request": {
            "method": "POST",
            "url": "https://llm.example/v1/stream?key=sk-secret&x=1",
            "httpVersion": "HTTP/1.1",
            "headers": [{"name": "Content-Type", "value": MEDIA_TYPE}],
            "postData": post or {"mimeType": MEDIA_TYPE, "text": REQUEST.decode()},
        },
        "response": {
            "status": status,
            "httpVersion": "HTTP/1.1",
            "headers": [{"name": "Content-Type", "value": "text/event-stream"}],
            "content": content,
        },
    }


def write_har(path: Path, entries: list[Any]) -> Path:
    path.write_text(json.dumps({"log": {"version": "1.2", "creator": {"name": "test"}, "entries": entries}}))
    return path


# ----- running it -----


def ingest(*args: str | Path, db: str = "sqlite:///ingest.db") -> Any:
    return CliRunner().invoke(app, ["ingest", "--db", db, "--key", "key.pem", *map(str, args)])


def records(db: str = "sqlite:///ingest.db") -> list[dict[str, Any]]:
    store = AuditStore(db)
    try:
        with store.engine.connect() as conn:
            ids = conn.scalars(sa.text("SELECT id FROM exchanges ORDER BY seq")).all()
        return [store.get(i) for i in ids]  # type: ignore[misc]
    finally:
        store.dispose()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def without_times(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in ("id", "provenance")}


# ----- flow dumps -----


def test_a_flow_dump_is_recorded_as_the_live_hooks_record_it(tmp_path: Path) -> None:
    """A dump's LLM exchange gets the fixture's record, the flow's own times and a provenance
    naming the file, its SHA-256 and the flow; an upload without a Content-Length and a gzip
    body take the addon's other paths to the same record; other traffic is not recorded; an
    exchange whose body the proxy streamed (not in the dump) is named in a warning, not recorded."""
    plain, chunked, streamed = llm_flow(), llm_flow(upload_length=False, encoding="gzip"), llm_flow(None)
    chunked.response.raw_content = gzip.compress(BODY)
    dump = write_dump(tmp_path / "flows.mitm", [plain, other_flow(), chunked, streamed])
    result = ingest(dump)
    assert result.exit_code == 0, result.output
    assert f"observer: {dump}: 4 flows read: 2 records stored, 0 already stored, 1 not LLM traffic," in result.output
    assert "1 without a response body in the file" in result.output
    assert f"flow {streamed.id} (POST https://llm.example:443/v1/stream): an LLM exchange, but the file holds no" in (
        result.output
    )
    assert "sk-secret" not in result.output
    first, second = records()
    for rec in (first, second):
        assert_matches(rec, EXPECTED)
        assert_matches(rec, FLOW_FIELDS)
    assert first["response_bytes"] == 997
    assert second["response_bytes"] == len(chunked.response.raw_content)  # bytes on the wire: gzip
    assert first["provenance"] == {
        "source": "offline_ingest",
        "file": str(dump),
        "file_sha256": sha256(dump),
        "file_format": "mitmproxy",
        "flow_id": plain.id,
        "ingested_at": first["provenance"]["ingested_at"],
    }
    assert second["provenance"]["flow_id"] == chunked.id
    ingested_at = datetime.fromisoformat(first["provenance"]["ingested_at"])
    assert abs((datetime.now(timezone.utc) - ingested_at).total_seconds()) < 60


def test_the_same_file_twice_stores_nothing_twice_and_the_chain_verifies(tmp_path: Path) -> None:
    """A second run finds every record stored (same ids) and stores none; the run's chain and
    its checkpoint verify."""
    dump = write_dump(tmp_path / "flows.mitm", [llm_flow(), other_flow(), llm_flow()])
    assert ingest(dump).exit_code == 0
    again = ingest(dump)
    assert again.exit_code == 0, again.output
    assert f"observer: {dump}: 3 flows read: 0 records stored, 2 already stored, 1 not LLM traffic" in again.output
    ids = _flow_ids(dump)
    assert [r["provenance"]["flow_id"] for r in records()] == [ids[0], ids[2]]
    check = CliRunner().invoke(app, ["verify", "--db", "sqlite:///ingest.db", "--key", "key.pem"])
    assert check.exit_code == 0, check.output
    assert "observer: verified: 2 entries of 1 writers, 1 checkpoints checked" in check.output


def _flow_ids(dump: Path) -> list[str]:
    return [saved.flow_id for saved in read_flows(open_capture(dump))]


def test_a_dump_appended_to_later_stores_only_its_new_flows(tmp_path: Path) -> None:
    """``mitmdump -w +FILE`` appends: the flows ingested before keep their ids (named by their
    flow id, not the file's hash), so only the new one is stored."""
    dump = write_dump(tmp_path / "flows.mitm", [llm_flow()])
    assert ingest(dump).exit_code == 0
    write_dump(dump, [llm_flow()], mode="ab")
    again = ingest(dump)
    assert "2 flows read: 1 records stored, 1 already stored, 0 not LLM traffic" in again.output
    assert len(records()) == 2


def test_a_client_abort_and_an_unreachable_upstream_end_at_their_errors(tmp_path: Path) -> None:
    """A flow that ended in an error is finished by the ``error`` hook: a client that went away
    mid-stream gives ``client_aborted`` with the text so far, an upstream that never answered
    ``error``/``no_response``; both end at the error's time, not the replay's."""
    cut = BODY.index(b"event: content.delta", BODY.index(b'" weather"'))  # after "The", " weather"
    aborted = llm_flow(BODY[:cut])
    aborted.error = Error("Client disconnected.", timestamp=T0 + 0.5)
    refused = llm_flow()
    refused.response = None
    refused.error = Error("Connection refused", timestamp=T0 + 0.05)
    dump = write_dump(tmp_path / "flows.mitm", [aborted, refused])
    result = ingest(dump)
    assert result.exit_code == 0, result.output
    first, second = records()
    assert_matches(
        first, {"outcome": "client_aborted", "text": "The weather", "transport_error": "Client disconnected."}
    )
    assert first["ended_at"] == "2026-01-01T00:00:00.750000Z"
    assert_matches(
        second,
        {
            "outcome": "error",
            "status_code": None,
            "error": {"code": "no_response", "message": "Connection refused"},
            "ended_at": "2026-01-01T00:00:00.300000Z",
            "started_at": "2026-01-01T00:00:00.250000Z",
        },
    )


def test_a_request_body_the_dump_lacks_is_said_and_not_recorded(tmp_path: Path) -> None:
    """An upload the proxy streamed (no Content-Length, not kept) cannot give the request's
    facts: the flow is counted and named, not recorded with a made-up request."""
    f, buffered = llm_flow(upload_length=False), llm_flow()
    f.request.raw_content = buffered.request.raw_content = None  # (the second with its Content-Length)
    dump = write_dump(tmp_path / "flows.mitm", [f, buffered])
    result = ingest(dump)
    assert "2 flows read: 0 records stored, 0 already stored, 0 not LLM traffic, 2 without a request body" in (
        result.output
    )
    assert f"flow {f.id} (POST https://llm.example:443/v1/stream): an LLM exchange, but the file holds no request" in (
        result.output
    )


def test_quiet_leaves_out_the_progress_bar_and_the_warnings(tmp_path: Path) -> None:
    dump = write_dump(tmp_path / "flows.mitm", [llm_flow(None)])
    result = CliRunner().invoke(app, ["ingest", "--db", "sqlite:///ingest.db", "--key", "key.pem", "-q", str(dump)])
    assert result.exit_code == 0
    assert "warning" not in result.output and "ingesting" not in result.output
    assert "1 without a response body in the file" in result.output


# ----- HAR files -----


def test_a_har_file_is_recorded_entry_by_entry(tmp_path: Path) -> None:
    """HAR entries become flows: a base64 response body is decoded, a base64 upload too; an
    entry without a response body is named and not recorded, one without a response (status
    0) is an error record, a malformed entry is said (exit 1) and the others are read on."""
    entries = [
        har_entry(response_text=base64.b64encode(BODY).decode(), encoding="base64"),
        har_entry(response_text=None),
        {"startedDateTime": "2026-01-01T00:00:00Z"},
        har_entry(
            response_text=BODY.decode(),
            post={"mimeType": MEDIA_TYPE, "text": base64.b64encode(REQUEST).decode(), "encoding": "base64"},
        ),
        har_entry(response_text=None, status=0),
    ]
    entries[4]["response"]["_error"] = "net::ERR_CONNECTION_REFUSED"  # (where Chrome says why)
    har = write_har(tmp_path / "session.har", entries)
    result = ingest(har)
    assert result.exit_code == 1, result.output
    assert (
        f"observer: {har}: 5 flows read: 3 records stored, 0 already stored, 0 not LLM traffic,"
        " 1 without a response body in the file, 1 unreadable"
    ) in result.output
    assert f"{har}: flow entry-2: cannot be read (KeyError: 'time'); skipped" in result.output
    first, second, third = records()
    for rec in (first, second):
        assert_matches(rec, EXPECTED)
        assert_matches(rec, FLOW_FIELDS)
    assert [r["provenance"]["flow_id"] for r in (first, second, third)] == ["entry-0", "entry-3", "entry-4"]
    assert first["provenance"]["file_format"] == "har" and first["provenance"]["file_sha256"] == sha256(har)
    assert_matches(
        third,
        {
            "outcome": "error",
            "error": {"code": "no_response", "message": "net::ERR_CONNECTION_REFUSED"},
            "ended_at": "2026-01-01T00:00:01.250000Z",
        },
    )
    again = ingest(har)
    assert "5 flows read: 0 records stored, 3 already stored" in again.output


# ----- bad files -----


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not a mitmproxy flow dump or HAR file (it begins b'\\x89PNG"),
        (b"12:not a flow dump at all", "not a mitmproxy flow dump or HAR file ("),
        (b'{"log": {"pages": []}}', "JSON, but not a HAR file (no log.entries list)"),
        (b"{not json", "not a mitmproxy flow dump or HAR file (not JSON:"),
    ],
    ids=["binary", "digits_then_garbage", "json_not_har", "broken_json"],
)
def test_a_file_that_is_no_capture_is_one_line_and_exit_2(tmp_path: Path, content: bytes, said: str) -> None:
    bad = tmp_path / "capture"
    bad.write_bytes(content)
    result = ingest(bad)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit)
    assert not (tmp_path / "ingest.db").exists()  # trial finding: the store was made (and migrated) first


def test_every_file_is_checked_before_anything_is_stored(tmp_path: Path) -> None:
    """A good dump and a missing file: exit 2, nothing stored (the store not even made)."""
    dump = write_dump(tmp_path / "flows.mitm", [llm_flow()])
    result = ingest(dump, tmp_path / "missing.mitm")
    assert result.exit_code == 2
    assert f"observer: cannot read {tmp_path / 'missing.mitm'}: No such file or directory" in result.output
    assert not (tmp_path / "ingest.db").exists()


def test_a_dump_damaged_part_way_keeps_what_came_before(tmp_path: Path) -> None:
    """A dump cut in the middle of its second flow (a killed mitmdump): the first is stored, the
    damage is said, exit 1."""
    dump = write_dump(tmp_path / "flows.mitm", [llm_flow(), llm_flow()])
    raw = dump.read_bytes()
    dump.write_bytes(raw[: len(raw) - 200])
    result = ingest(dump)
    assert result.exit_code == 1, result.output
    assert f"observer: {dump}: damaged after flow 1, the rest is not read" in result.output
    assert f"observer: {dump}: 1 flows read: 1 records stored" in result.output
    assert len(records()) == 1


def test_an_empty_file_is_an_empty_dump(tmp_path: Path) -> None:
    """``mitmdump -w`` with no traffic leaves an empty file: 0 flows, exit 0."""
    empty = tmp_path / "empty.mitm"
    empty.write_bytes(b"")
    result = ingest(empty)
    assert result.exit_code == 0, result.output
    assert f"observer: {empty}: 0 flows read: 0 records stored" in result.output


def test_captures_are_told_apart_by_their_bytes(tmp_path: Path) -> None:
    """A HAR behind a BOM and whitespace (Fiddler writes one) is a HAR; a dump starts with a
    tnetstring's digits; text is neither."""
    har = write_har(tmp_path / "x.json", [])
    har.write_bytes(b"\xef\xbb\xbf \n" + har.read_bytes())
    assert open_capture(har).file_format == HAR
    assert open_capture(write_dump(tmp_path / "d", [llm_flow()])).file_format == "mitmproxy"
    text = tmp_path / "t.txt"
    text.write_bytes(b"hello")
    with pytest.raises(NotACapture):
        open_capture(text)


# ----- the replay, the writer, the chain -----


def test_a_replay_refuses_a_running_event_loop() -> None:
    """On a running loop the addon defers finishing (``LLMAudit.response``): no record would come."""

    async def inside() -> None:
        Replay(Settings.model_construct())

    with pytest.raises(RuntimeError, match="outside an event loop"):
        asyncio.run(inside())


def test_a_replay_says_what_became_of_each_flow() -> None:
    with Replay(Settings.model_construct()) as replay:
        assert replay.run(other_flow()).fate is Fate.NOT_LLM
        assert replay.run(llm_flow(None)).fate is Fate.NO_RESPONSE_BODY
        no_response = llm_flow()
        no_response.response = None
        assert replay.run(no_response).fate is Fate.NO_RESPONSE
        done = replay.run(llm_flow())
        assert done.fate is Fate.RECORDED and done.record is not None and done.record.text == EXPECTED["text"]
        unended = llm_flow()
        unended.response.timestamp_end = None
        record = replay.run(unended).record
        assert record is not None and record.ended_at is None  # not known: not the replay's clock


def _ingested(make_exchange, n: int, **fields: Any) -> Any:
    at = datetime(2026, 1, 1, 0, 0, n, tzinfo=timezone.utc)
    provenance = Provenance("offline_ingest", "/data/f.mitm", "ab" * 32, "mitmproxy", f"flow-{n}", at)
    return make_exchange(f"00000000-0000-5000-8000-{n:012d}", at, provenance=provenance, **fields)


def test_provenance_is_committed_by_the_chain_and_null_is_not(make_exchange) -> None:
    """A live record (provenance null) hashes as before the field existed; an ingested one
    commits to its provenance."""
    live = make_exchange("r1", datetime(2026, 1, 1, tzinfo=timezone.utc)).to_dict()
    before = {k: v for k, v in live.items() if k != "provenance"}
    assert canonical_record(live, "w", 1) == canonical_record(before, "w", 1)
    ingested = _ingested(make_exchange, 1).to_dict()
    canonical = canonical_record(ingested, "w", 1)
    assert b'"provenance":{"file":"/data/f.mitm","file_format":"mitmproxy","file_sha256":"abab' in canonical
    assert canonical != canonical_record({**ingested, "provenance": None}, "w", 1)


def test_a_changed_provenance_breaks_the_chain(store: AuditStore, make_exchange, tmp_path: Path) -> None:
    key = CheckpointKey.load_or_create(tmp_path / "key.pem")
    writer = IngestWriter(store, key)
    for n in range(3):
        writer.add(_ingested(make_exchange, n))
    writer.close()
    assert verify(store, key.public).ok
    with store.engine.begin() as conn:
        row = conn.execute(sa.text("SELECT id, provenance FROM exchanges WHERE seq = 2")).one()
        changed = json.loads(row.provenance) if isinstance(row.provenance, str) else dict(row.provenance)
        changed["file"] = "/elsewhere.har"
        value = "CAST(:p AS JSONB)" if conn.dialect.name == "postgresql" else ":p"
        conn.execute(
            sa.text(f"UPDATE exchanges SET provenance = {value} WHERE id = :i"), {"p": json.dumps(changed), "i": row.id}
        )
    report = verify(store, key.public)
    assert [(b.seq, b.reason.split(":")[0]) for b in report.breaks] == [(2, "hash mismatch")]


def test_the_export_reader_gives_an_ingested_record_as_the_store_does(store: AuditStore, make_exchange) -> None:
    """``RecordReader`` (exports, verify) reads ``provenance`` back key for key as ``get``
    does (PostgreSQL's jsonb reorders keys)."""
    writer = IngestWriter(store, None)
    writer.add(_ingested(make_exchange, 1))
    writer.add(make_exchange("live-1", datetime(2026, 1, 1, 0, 1, tzinfo=timezone.utc)))
    writer.close()
    with store.engine.connect() as conn:
        (page,) = RecordReader(conn).chained(RecordFilter(), writer.writer_id, 1, 2)
    for item in page:
        got = {k: v for k, v in item.items() if k not in ("kind", "writer_id", "seq", "record_hash")}
        assert json.dumps(got) == json.dumps(store.get(item["id"]))
    assert page[0]["provenance"]["flow_id"] == "flow-1" and page[1]["provenance"] is None


def test_a_record_the_database_refuses_is_counted_and_leaves_no_hole(
    store: AuditStore, make_exchange, tmp_path: Path
) -> None:
    """One record of a batch cannot be stored (an integer beyond 64 bits): it is counted as
    refused, the others are stored and numbered without a gap, and the chain verifies."""
    key = CheckpointKey.load_or_create(tmp_path / "key.pem")
    writer = IngestWriter(store, key)
    writer.add(_ingested(make_exchange, 1))
    writer.add(_ingested(make_exchange, 2, usage=Usage(input_tokens=2**70, reported=True)))
    writer.add(_ingested(make_exchange, 3))
    writer.close()
    assert (writer.stored, writer.duplicates, [r for r, _ in writer.refused]) == (
        2,
        0,
        [_ingested(make_exchange, 2).id],
    )
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT seq FROM exchanges ORDER BY seq")).scalars().all() == [1, 2]
    assert verify(store, key.public).ok


def test_an_id_stored_meanwhile_by_another_writer_is_skipped(
    store: AuditStore, make_exchange, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of the same file at once: the other stores an id between this batch's check and
    its insert (``IntegrityError``); the batch is written again and the id skipped."""
    first = _ingested(make_exchange, 1)
    real = store.write_many
    calls = []

    def racing(records, **kwargs):
        calls.append(len(records))
        if len(calls) == 1:
            real([_ingested(make_exchange, 1)], writer_id="other-run", seqs=[1])
            raise sa_exc.IntegrityError("INSERT", {}, Exception("duplicate key"))
        return real(records, **kwargs)

    monkeypatch.setattr(store, "write_many", racing)
    writer = IngestWriter(store, None)
    writer.add(first)
    writer.add(_ingested(make_exchange, 2))
    writer.close()
    assert calls == [2, 2] and (writer.stored, writer.duplicates, writer.refused) == (1, 1, [])
