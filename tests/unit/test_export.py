"""Exports (``observer export``) and their offline check (``observer export verify``), on SQLite
and PostgreSQL: the fast reader against ``AuditStore.get`` for every fixture record, each format
written and read back, filters, expected rows and manifest fields written by hand, and one
rejection per kind of change to an export."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from observer import jsontext
from observer.cli import app
from observer.errors import ConfigError
from observer.records import Block, Exchange
from observer.store import exportfiles, reader
from observer.store.chain import canonical_record, chain_hash
from observer.store.checkpoint import ZERO_HASH, CheckpointKey, make_checkpoint, public_pem
from observer.store.export import ExportError, export
from observer.store.exportfiles import GAP_COLUMNS, RECORD_COLUMNS, csv_line
from observer.store.manifest import encode, sign, verify_export
from observer.store.reader import JOURNAL_KEYS, RecordFilter, RecordReader
from observer.store.store import AuditStore
from tests.conftest import minimal_exchange
from tests.unit.test_store import ALL_RECORDS, http_error_record

UTC = timezone.utc
ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 6, 1, 8, 0, 0, tzinfo=UTC)
WA, WB = "writer-a", "writer-b"
#: The record ids of writer-a, by seq (seq 5 is a gap).
A_SEQS = {
    1: "a-00",
    2: "a-01",
    3: "a-02",
    4: "a-03",
    6: "a-04",
    7: "a-05",
    8: "a-06",
    9: "a-07",
    10: "a-08",
    11: "a-09",
}


def _a_record(i: int) -> Exchange:
    """writer-a's records: a minute apart from T0; models, hosts, users and one error varied."""
    record = minimal_exchange(
        f"a-{i:02d}",
        T0 + timedelta(minutes=i),
        model="gpt-4o-2024-08-06" if i % 2 == 0 else "claude-x",
        host="api.openai.com" if i < 7 else "api.anthropic.com",
        dialect="openai.chat" if i < 7 else "anthropic.messages",
        outcome="error" if i == 8 else "completed",
        blocks=[Block(index=0, text=f'answer {i}, with "quotes", commas\nand a newline — ünïcode')],
    )
    record.request.model = "gpt-4o" if i % 2 == 0 else "claude-x"
    record.request.end_user = {1: "alice", 2: "alice", 3: "bob"}.get(i)
    record.request.parameters = {"big": 2**70 + 1, "neg": -(2**63) - 1} if i == 4 else {"temperature": 0.5}
    return record


def _gap(seq: int, seq_end: int, first_at: datetime | None, last_at: datetime | None) -> dict[str, Any]:
    return {
        "seq": seq,
        "seq_end": seq_end,
        "first_at": first_at,
        "last_at": last_at,
        "dropped": seq_end - seq + 1,
        "reason": "queue_full",
        "detail": None,
    }


def _checkpoint(store: AuditStore, key: CheckpointKey, writer: str, number: int, at: datetime) -> None:
    seq, head = store.chain_head(writer)
    store.add_checkpoint(make_checkpoint(key, store.store_id(), writer, number, seq, head.hex(), at, ZERO_HASH))


@pytest.fixture
def key(tmp_path: Path) -> CheckpointKey:
    return CheckpointKey.load_or_create(tmp_path / "keys" / "checkpoint-key.pem")


@pytest.fixture
def filled(store: AuditStore, key: CheckpointKey) -> AuditStore:
    """writer-a: ``A_SEQS`` and a queue_full gap at seq 5 (lost at T0+3:30..3:40), checkpoint 1
    at its head (seq 11); writer-b: the store tests' varied records (2025) at seq 1..4 and a gap
    at seq 5..6 of unknown times, checkpoint 1 at seq 3; two rows stored before the journal."""
    records = {seq: _a_record(int(rid[2:])) for seq, rid in A_SEQS.items()}
    gap = _gap(5, 5, T0 + timedelta(minutes=3, seconds=30), T0 + timedelta(minutes=3, seconds=40))
    store.write_many(list(records.values()), writer_id=WA, seqs=list(records), gaps=[gap])
    _checkpoint(store, key, WA, 1, T0 + timedelta(hours=1))
    varied = [make() for make in ALL_RECORDS]
    store.write_many(varied[:3], writer_id=WB, seqs=[1, 2, 3])
    _checkpoint(store, key, WB, 1, T0 + timedelta(hours=1))
    store.write_many(varied[3:], writer_id=WB, seqs=[4], gaps=[_gap(5, 6, None, None)])
    # (before every chained record, 2025-06-01: rows from before the journal)
    store.write_many([minimal_exchange(f"u-{i}", datetime(2025, 5, 31, 0, i, tzinfo=UTC)) for i in (1, 2)])
    return store


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "exchanges.jsonl").read_bytes().splitlines()]


def _ids(directory: Path) -> list[str]:
    return [x["id"] if x["kind"] == "exchange" else f"gap {x['writer_id']} {x['seq']}" for x in _lines(directory)]


def _export(store: AuditStore, key: CheckpointKey, out: Path, file_format: str = "jsonl", **filters: Any) -> dict:
    return export(store, RecordFilter(**filters), file_format, out, key, now=T0 + timedelta(days=1))


# ----- the fast reader is AuditStore.get -----


def _mismatches(store: AuditStore) -> list[str]:
    """Ids of the records whose exported form (without the journal keys) is not ``get``'s, as
    JSON bytes: types (``1`` is not ``true``, though ``1 == True``) and key order at every depth."""
    out = []
    with store.engine.connect() as conn:
        rd = RecordReader(conn, page_rows=3)
        pages = [p for w in store.writers() for p in rd.chained(RecordFilter(), w, 1, 100)]
        for page in [*pages, *rd.unchained(RecordFilter())]:
            for item in page:
                mine = {k: v for k, v in item.items() if k not in JOURNAL_KEYS}
                theirs = store.get(item["id"])
                if jsontext.dumps(mine) != jsontext.dumps(theirs):
                    out.append(item["id"])
    return out


def test_the_fast_reader_gives_exactly_what_get_gives(filled: AuditStore) -> None:
    """Every record (tool calls, violations beyond 2^53, blocks out of order, an error without
    code, nulls, unicode, integers beyond 64 bits, times given at +02:00, rows without a
    writer), read through the driver's SQL, equals ``AuditStore.get`` key for key, in order."""
    assert _mismatches(filled) == []
    with filled.engine.connect() as conn:
        (page,) = RecordReader(conn).chained(RecordFilter(), WA, 6, 6)
    assert page[0]["request"]["parameters"] == {"big": 2**70 + 1, "neg": -(2**63) - 1}  # not floats


@pytest.mark.mutation
def test_a_wrong_fast_reader_fails_the_comparison(filled: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above fails when the fast path is wrong: ``text`` joining every block
    (the reasoning block too); on SQLite, booleans left as its 0/1 (``bool`` made a no-op)."""
    with monkeypatch.context() as m:
        right = reader._text
        m.setattr(
            reader,
            "_text",
            lambda blocks, kind="text": "".join(b["text"] for b in blocks) if kind == "text" else right(blocks, kind),
        )
        assert _mismatches(filled) == ["0b5e3c1e-6a4e-4b7a-9f1e-2d3c4b5a6f70"]  # the one with a reasoning block
    if filled.engine.dialect.name == "sqlite":
        monkeypatch.setattr(reader, "bool", lambda value: value, raising=False)
        assert len(_mismatches(filled)) == 16


def test_pages_are_bounded_and_the_files_do_not_depend_on_them(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path
) -> None:
    """Pages hold at most ``page_rows`` records (nothing more is read ahead), and an export in
    pages of 2 is byte for byte the export in pages of 1,000."""
    with filled.engine.connect() as conn:
        pages = RecordReader(conn, page_rows=2).chained(RecordFilter(), WA, 1, 11)
        assert [len(p) for p in pages] == [2, 2, 2, 2, 2]
    export(filled, RecordFilter(), "jsonl", tmp_path / "small", key, page_rows=2, now=T0)
    export(filled, RecordFilter(), "jsonl", tmp_path / "big", key, now=T0)
    small, big = (tmp_path / d / "exchanges.jsonl" for d in ("small", "big"))
    assert small.read_bytes() == big.read_bytes()


# ----- what an export holds -----


def test_a_whole_export_in_chain_order(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    _export(filled, key, tmp_path / "x")
    b = [r().id for r in ALL_RECORDS]
    expected = [
        *("a-00", "a-01", "a-02", "a-03", f"gap {WA} 5", "a-04", "a-05", "a-06", "a-07", "a-08", "a-09"),
        *(b[0], b[1], b[2], b[3], f"gap {WB} 5"),
        *("u-1", "u-2"),
    ]
    assert _ids(tmp_path / "x") == expected
    lines = _lines(tmp_path / "x")
    assert lines[4] == {
        "kind": "gap",
        "writer_id": WA,
        "seq": 5,
        "seq_end": 5,
        "first_at": "2026-06-01T08:03:30.000000Z",
        "last_at": "2026-06-01T08:03:40.000000Z",
        "dropped": 1,
        "reason": "queue_full",
        "detail": None,
        "record_hash": lines[4]["record_hash"],
    }
    assert [lines[-1][k] for k in JOURNAL_KEYS] == ["exchange", None, None, None]
    assert list(lines[0])[:5] == ["kind", "writer_id", "seq", "record_hash", "id"]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        # [since, until): a-06 starts at exactly T0+6 min; the gap lies between a-03 and a-04
        ({"since": T0 + timedelta(minutes=2), "until": T0 + timedelta(minutes=6)}, "a-02 a-03 gap5 a-04 a-05"),
        # no record in the range, but the gap's loss times overlap it
        ({"since": T0 + timedelta(minutes=3, seconds=35), "until": T0 + timedelta(minutes=3, seconds=50)}, "gap5"),
        # model: the response's or the request's; the gaps of every writer come along (what they lost is unknown)
        ({"models": ("claude-x",)}, "a-01 a-03 gap5 a-05 a-07 a-09 gapB"),
        ({"models": ("gpt-4o",), "since": T0}, "a-00 a-02 gap5 a-04 a-06 a-08"),
        ({"users": ("alice", "bob"), "since": T0, "until": T0 + timedelta(hours=1)}, "a-01 a-02 a-03 gap5"),
        ({"hosts": ("api.anthropic.com",), "since": T0}, "gap5 a-07 a-08 a-09"),
        ({"dialects": ("anthropic.messages",), "outcomes": ("error",)}, "gap5 a-08 gapB"),
        ({"writers": (WB,), "outcomes": ("error", "http_error")}, "B0 B2 gapB"),
        ({"since": datetime(2025, 5, 30, tzinfo=UTC), "until": datetime(2025, 6, 1, tzinfo=UTC)}, "u-1 u-2"),
        ({"since": T0 + timedelta(days=30)}, ""),
    ],
)
def test_filters(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path, filters: dict[str, Any], expected: str
) -> None:
    manifest = _export(filled, key, tmp_path / "x", **filters)
    b = [r().id for r in ALL_RECORDS]
    names = {f"gap {WA} 5": "gap5", f"gap {WB} 5": "gapB", b[0]: "B0", b[2]: "B2"}
    assert " ".join(names.get(i, i) for i in _ids(tmp_path / "x")) == expected
    assert verify_export(tmp_path / "x", [key.public]).ok
    assert manifest["totals"]["records"] + manifest["totals"]["gaps"] == len(expected.split())


def test_the_manifest_by_hand(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    manifest = _export(filled, key, tmp_path / "x", writers=(WB,), outcomes=("http_error",))
    data = (tmp_path / "x" / "manifest.json").read_bytes()
    assert json.loads(data) == manifest and data == encode(manifest)
    ((_, a_head), (_, b_head)) = filled.chain_head(WA), filled.chain_head(WB)
    b_checkpoint = filled.last_checkpoint(WB)
    lines = (tmp_path / "x" / "exchanges.jsonl").read_bytes()
    assert {k: v for k, v in manifest.items() if k not in ("files", "writers")} == {
        "format": "llm-stream-observer export v3",
        "created_at": "2026-06-02T08:00:00.000000Z",
        "store_id": filled.store_id(),
        "file_format": "jsonl",
        "filters": {
            "since": None,
            "until": None,
            "model": [],
            "host": [],
            "user": [],
            "dialect": [],
            "outcome": ["http_error"],
            "writer": [WB],
        },
        "order": "writers by writer_id; a writer's records and gaps by seq (its hash chain's order);"
        " then the records without a writer (stored before the journal) by started_at, id",
        "totals": {"records": 1, "chained_records": 1, "unchained_records": 0, "gaps": 1},
        "signer": {"key_id": key.key_id, "public_key": public_pem(key.public)},
        "store_chain": {"events": [], "purged_runs": [], "last_checkpoint": None},  # no hold, no purge
    }
    import hashlib

    assert manifest["files"] == [
        {
            "name": "exchanges.jsonl",
            "holds": "exchanges and gaps",
            "rows": 2,
            "bytes": len(lines),
            "sha256": hashlib.sha256(lines).hexdigest(),
        }
    ]
    assert manifest["writers"][0] == {
        "writer_id": WA,
        "records": 0,
        "gaps": 0,
        "first_seq": None,
        "last_seq": None,
        "head": {"seq": 11, "record_hash": a_head.hex()},
        "last_checkpoint": manifest["writers"][0]["last_checkpoint"],
    }
    assert manifest["writers"][1] == {
        "writer_id": WB,
        "records": 1,
        "gaps": 1,
        "first_seq": 3,
        "last_seq": 6,
        "head": {"seq": 6, "record_hash": b_head.hex()},
        "last_checkpoint": {**b_checkpoint, "created_at": "2026-06-01T09:00:00.000000Z"},
    }
    assert manifest["writers"][1]["last_checkpoint"]["seq"] == 3
    assert (tmp_path / "x" / "manifest.sig").read_bytes() == sign(data, key)


def test_an_empty_export(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """Nothing taken: empty files, the heads still stated, and it verifies."""
    for file_format in ("jsonl", "csv", "parquet"):
        out = tmp_path / file_format
        manifest = _export(filled, key, out, file_format, since=T0 + timedelta(days=30))
        assert manifest["totals"] == {"records": 0, "chained_records": 0, "unchained_records": 0, "gaps": 0}
        assert [f["rows"] for f in manifest["files"]] == [0] * len(manifest["files"])
        assert [w["head"]["seq"] for w in manifest["writers"]] == [11, 6]
        assert verify_export(out, [key.public]).ok


# ----- formats, read back -----


def _record_hash(store: AuditStore, record_id: str) -> str:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql(f"SELECT record_hash FROM exchanges WHERE id = '{record_id}'").scalar_one()


def test_jsonl_read_back_is_get(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    _export(filled, key, tmp_path / "x")
    for line in _lines(tmp_path / "x"):
        if line["kind"] == "exchange":
            assert {k: v for k, v in line.items() if k not in JOURNAL_KEYS} == filled.get(line["id"])
            if line["writer_id"] is not None:
                assert line["record_hash"] == _record_hash(filled, line["id"])


def test_a_csv_row_by_hand(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    _export(filled, key, tmp_path / "x", "csv", outcomes=("http_error",))
    h = _record_hash(filled, http_error_record().id)
    request = (
        '"{""version"":null,""stream"":null,""model"":null,""messages"":[],""tools"":[],""parameters"":{},'
        '""metadata"":{},""extensions"":[],""body_bytes"":0,""tool_names"":[],""end_user"":null,""request_id"":null}"'
    )
    body = '"{""error"":{""type"":""rate_limit_error"",""message"":""Rate limit reached""}}"'
    expected = (
        f"writer-b,3,{h},9a7d1e44-8b2f-4c3a-a1d0-000000000003,openai-chat,http,api.openai.com,,"
        "/v1/chat/completions,POST,HTTP/1.1,429,2025-06-01T12:00:02.000000Z,2025-06-01T12:00:02.090000Z,"
        f",,,,,,,false,,,http_error,68,0,,{body},,null,{request},[],[],[],null,"
        # v3: response_id, system_fingerprint, service_tier, the four counts, usage_details, choices, reasoning,
        # client_address, proxy_user, key_fingerprint, request_last_event_id, last_event_id
        ",,,,,,,null,null,,,,,,\r\n"
    )
    rows = (tmp_path / "x" / "exchanges.csv").read_bytes().decode().split("\r\n", 1)
    assert rows[0] == ",".join(RECORD_COLUMNS)
    assert rows[1] == expected
    gaps = (tmp_path / "x" / "gaps.csv").read_bytes().decode()
    assert gaps.startswith(",".join(GAP_COLUMNS) + "\r\n")
    assert gaps.count("\r\n") == 3  # the header, writer-a's gap and writer-b's


def test_csv_read_back(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """Every row parses back (``csv`` module) to the record's values; its JSON cells to the
    nested parts exactly."""
    _export(filled, key, tmp_path / "x", "csv")
    with open(tmp_path / "x" / "exchanges.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 16
    for row in rows:
        record = filled.get(row["id"])
        assert record is not None
        assert row["text"] == record["text"] and row["started_at"] == record["started_at"]
        assert row["input_tokens"] == (
            "" if record["usage"]["input_tokens"] is None else str(record["usage"]["input_tokens"])
        )
        assert row["end_user"] == (record["request"]["end_user"] or "")
        for column in ("request", "blocks", "tool_calls", "violations", "error", "provenance", "choices"):
            assert jsontext.loads(row[column]) == record[column]
        assert jsontext.loads(row["usage_details"]) == record["usage"]["details"]
        assert row["reasoning"] == record["reasoning"] and row["response_id"] == (record["response_id"] or "")
        for column in ("client_address", "proxy_user", "key_fingerprint", "request_last_event_id", "last_event_id"):
            assert row[column] == (record[column] or ""), column


def test_csv_and_parquet_say_where_an_ingested_record_came_from(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path
) -> None:
    """Trial finding: only JSON lines kept an ingested record's provenance. The ``provenance``
    column holds it as JSON text (``null`` for a record observed live)."""
    from observer.records import Provenance

    ingested = minimal_exchange("ingested-1", datetime(2025, 5, 31, 1, 0, tzinfo=UTC))
    ingested.provenance = Provenance(
        source="offline_ingest",
        file="/captures/flows.mitm",
        file_sha256="ab" * 32,
        file_format="mitmproxy",
        flow_id="f-1",
        ingested_at=T0,
    )
    filled.write_many([ingested])
    _export(filled, key, tmp_path / "c", "csv")
    with open(tmp_path / "c" / "exchanges.csv", newline="", encoding="utf-8") as f:
        rows = {r["id"]: r for r in csv.DictReader(f)}
    assert jsontext.loads(rows[ingested.id]["provenance"]) == {
        "source": "offline_ingest",
        "file": "/captures/flows.mitm",
        "file_sha256": "ab" * 32,
        "file_format": "mitmproxy",
        "flow_id": "f-1",
        "ingested_at": "2026-06-01T08:00:00.000000Z",
    }
    assert rows[http_error_record().id]["provenance"] == "null"
    assert verify_export(tmp_path / "c", [key.public]).ok
    pq = pytest.importorskip("pyarrow.parquet")
    _export(filled, key, tmp_path / "p", "parquet")
    table = {r["id"]: r for r in pq.read_table(tmp_path / "p" / "exchanges.parquet").to_pylist()}
    assert jsontext.loads(table[ingested.id]["provenance"])["flow_id"] == "f-1"


def test_an_export_of_format_v1_still_verifies(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """Exports made before the ``provenance`` column (format v1) and before the usage-detail
    columns (v2: CSV header up to ``provenance``) verify with today's ``export verify``; a v1
    manifest over a v3 file does not."""
    import hashlib

    _export(filled, key, tmp_path / "x", "csv")
    folder = tmp_path / "x"
    path = folder / "exchanges.csv"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0][34:37] == ["violations", "provenance", "response_id"]
    v1 = "".join(csv_line(row[:35]) for row in rows).encode()  # up to violations
    v2 = "".join(csv_line(row[:36]) for row in rows).encode()  # up to provenance
    manifest = json.loads((folder / "manifest.json").read_bytes())

    def resign(content: bytes, version: str = "v1") -> None:
        path.write_bytes(content)
        entry = next(e for e in manifest["files"] if e["name"] == "exchanges.csv")
        entry["bytes"], entry["sha256"] = len(content), hashlib.sha256(content).hexdigest()
        manifest["format"] = f"llm-stream-observer export {version}"
        data = encode(manifest)
        (folder / "manifest.json").write_bytes(data)
        (folder / "manifest.sig").write_bytes(sign(data, key))

    original = path.read_bytes()
    resign(v1)
    check = verify_export(folder, [key.public])
    assert check.ok, check.problems
    resign(v2, "v2")
    check = verify_export(folder, [key.public])
    assert check.ok, check.problems
    resign(original)
    problems = verify_export(folder, [key.public]).problems
    assert problems[:2] == [
        "exchanges.csv line 1: not the header of exchanges",
        "exchanges.csv row 1: 51 fields, not 35",
    ]


@pytest.mark.parametrize(
    "values",
    [
        ["plain", "with,comma", 'with "quotes"', "line\nfeed", "carriage\rreturn", "crlf\r\n", "", None],
        [1, -2, 0.1, 1e300, 2**70, True, False, "ünïcode — 🗼", " lead", "tab\tin", "\u2028"],
    ],
)
def test_csv_line_is_what_the_csv_module_writes(values: list[Any]) -> None:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(
        ["true" if v is True else "false" if v is False else v for v in values]
    )
    assert csv_line(values) == buf.getvalue()


def test_parquet_read_back(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    _export(filled, key, tmp_path / "x", "parquet")
    table = pq.read_table(tmp_path / "x" / "exchanges.parquet")
    assert table.column_names == list(RECORD_COLUMNS)
    rows = {r["id"]: r for r in table.to_pylist()}
    assert len(rows) == 16
    row = rows[http_error_record().id]
    assert (row["status_code"], row["port"], row["usage_reported"], row["ttft_s"]) == (429, None, False, None)
    assert row["started_at"] == datetime(2025, 6, 1, 12, 0, 2, tzinfo=UTC)
    for rid, row in rows.items():
        record = filled.get(rid)
        assert jsontext.loads(row["request"]) == record["request"] and row["text"] == record["text"]
    gaps = pq.read_table(tmp_path / "x" / "gaps.parquet").to_pylist()
    assert [(g["writer_id"], g["seq"], g["seq_end"], g["first_at"]) for g in gaps] == [
        (WA, 5, 5, T0 + timedelta(minutes=3, seconds=30)),
        (WB, 5, 6, None),
    ]


# ----- the folder -----


def test_permissions_and_the_folder_rules(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    _export(filled, key, tmp_path / "new", "csv")
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "new").iterdir()} == {
        "exchanges.csv": 0o600,
        "gaps.csv": 0o600,
        "manifest.json": 0o600,
        "manifest.sig": 0o600,
    }
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    _export(filled, key, empty)
    assert empty.stat().st_mode & 0o777 == 0o700
    with pytest.raises(ExportError, match="is not empty"):
        _export(filled, key, empty)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ExportError, match="is not a folder"):
        _export(filled, key, tmp_path / "file")
    with pytest.raises(ExportError, match="cannot make"):
        _export(filled, key, tmp_path / "no" / "such" / "parent")
    with pytest.raises(ExportError, match="no writer nobody"):
        _export(filled, key, tmp_path / "w", writers=("nobody",))
    with pytest.raises(ExportError, match="unknown format"):
        _export(filled, key, tmp_path / "w", "xml")
    assert not (tmp_path / "w").exists()


def test_a_failed_export_leaves_nothing(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[int] = []

    def full_disk(self: Any, page: list[dict[str, Any]]) -> None:
        written.append(len(page))
        if len(written) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(exportfiles.JsonlWriter, "write", full_disk)
    with pytest.raises(OSError, match="No space"):
        export(filled, RecordFilter(), "jsonl", tmp_path / "x", key, page_rows=3)
    assert not (tmp_path / "x").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(OSError):
        written.clear()
        export(filled, RecordFilter(), "jsonl", tmp_path / "kept", key, page_rows=3)
    assert list((tmp_path / "kept").iterdir()) == []


def test_a_write_error_of_the_file_thread_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ENOSPC`` in the writer thread comes out of the next ``write`` (or ``close``)."""
    f = exportfiles.HashedFile(tmp_path / "f")

    def fail(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(exportfiles.os, "write", fail)
    f.write(b"x" * exportfiles.CHUNK_BYTES)
    with pytest.raises(OSError, match="No space"):
        for _ in range(100):
            f.write(b"x" * exportfiles.CHUNK_BYTES)
    monkeypatch.undo()
    with pytest.raises(OSError, match="No space"):
        f.close()
    f.abort()


# ----- offline verification -----


@pytest.fixture
def exported(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> Path:
    _export(filled, key, tmp_path / "x")
    return tmp_path / "x"


def _problems(directory: Path, key: CheckpointKey) -> list[str]:
    check = verify_export(directory, [key.public])
    assert not check.ok
    return check.problems


@pytest.mark.parametrize("file_format", ["jsonl", "csv", "parquet"])
def test_an_export_verifies_offline(filled: AuditStore, key: CheckpointKey, tmp_path: Path, file_format: str) -> None:
    if file_format == "parquet":
        pytest.importorskip("pyarrow")
    _export(filled, key, tmp_path / "x", file_format)
    check = verify_export(tmp_path / "x", [key.public])
    assert check.ok, check.problems
    assert (check.records, check.gaps, check.writers, check.trusted) == (16, 2, 2, True)
    assert check.checkpoints_checked == 2
    if file_format == "jsonl":
        # every chained entry but the first of writer-b after... none: both chains are whole
        assert (check.hashes_checked, check.hashes_unchecked) == (16, 0)
    else:
        assert check.hashes_checked == 0 and any("SHA-256" in w for w in check.warnings)


def test_a_filtered_export_recomputes_what_it_can(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """With holes (filtered out), an entry whose predecessor is missing is not recomputed."""
    _export(filled, key, tmp_path / "x", models=("claude-x",))  # a-01 a-03 gap5 a-05 a-07 a-09 gapB
    check = verify_export(tmp_path / "x", [key.public])
    assert check.ok, check.problems
    assert (check.hashes_checked, check.hashes_unchecked) == (1, 6)  # gap5 follows a-03 (seq 4)


def test_without_a_key_the_embedded_one_is_used_with_a_warning(exported: Path, key: CheckpointKey) -> None:
    check = verify_export(exported)
    assert check.ok and not check.trusted
    assert any(f"(key id {key.key_id}), which does not show who signed it" in w for w in check.warnings)


def test_a_changed_byte_is_found(exported: Path, key: CheckpointKey) -> None:
    path = exported / "exchanges.jsonl"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"Rate limit reached", b"Rate limit reaches"))
    problems = _problems(exported, key)
    assert problems[0] == "exchanges.jsonl: SHA-256 differs from the manifest (the file was changed)"
    assert any(
        "line 14: record 9a7d1e44-8b2f-4c3a-a1d0-000000000003 (writer writer-b, seq 3): record_hash does not match" in p
        for p in problems
    )


def test_a_changed_manifest_field_is_found(exported: Path, key: CheckpointKey) -> None:
    path = exported / "manifest.json"
    path.write_bytes(path.read_bytes().replace(b'"unchained_records": 2', b'"unchained_records": 1'))
    assert _problems(exported, key) == [
        "manifest.sig: the signature does not match manifest.json (the manifest was changed, or signed by another key)"
    ]


def test_a_removed_and_an_added_file_are_found(exported: Path, key: CheckpointKey) -> None:
    (exported / "exchanges.jsonl").rename(exported / "renamed.jsonl")
    problems = _problems(exported, key)
    assert "renamed.jsonl: not listed in the manifest (added)" in problems
    assert "exchanges.jsonl: missing (removed)" in problems


def test_a_wrong_key_is_refused(exported: Path, tmp_path: Path) -> None:
    other = CheckpointKey.load_or_create(tmp_path / "other.pem")
    (problem, *_rest) = _problems(exported, other)
    assert problem.startswith("manifest.json: signed by key ") and f"not a trusted key ({other.key_id})" in problem


def test_a_truncated_line_is_found(exported: Path, key: CheckpointKey) -> None:
    path = exported / "exchanges.jsonl"
    path.write_bytes(path.read_bytes()[:-20])
    problems = _problems(exported, key)
    assert "exchanges.jsonl line 18: truncated (no end of line)" in problems
    assert "exchanges.jsonl: 17 rows, the manifest says 18" in problems


def test_reordered_lines_and_a_foreign_line_are_found(exported: Path, key: CheckpointKey) -> None:
    path = exported / "exchanges.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[1], lines[2] = lines[2], lines[1]
    lines[3] = b'{"kind":"note"}\n'
    path.write_bytes(b"".join(lines))
    problems = _problems(exported, key)
    assert (
        "exchanges.jsonl line 3: record a-01 (writer writer-a, seq 2): not after seq 3 (lines out of order or repeated)"
        in problems
    )
    assert "exchanges.jsonl line 4: not an export line (ValueError: kind 'note')" in problems


def _resign_lines(exported: Path, key: CheckpointKey, lines: list[bytes]) -> None:
    """Writes ``lines`` as exchanges.jsonl and fixes the manifest's size and SHA-256 and its
    signature, as someone holding the export's key would."""
    import hashlib

    from observer.store.manifest import encode, sign

    data = b"".join(lines)
    (exported / "exchanges.jsonl").write_bytes(data)
    manifest = json.loads((exported / "manifest.json").read_bytes())
    (entry,) = [f for f in manifest["files"] if f["name"] == "exchanges.jsonl"]
    entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    raw = encode(manifest)
    (exported / "manifest.json").write_bytes(raw)
    (exported / "manifest.sig").write_bytes(sign(raw, key))


def test_derived_keys_and_repeated_keys_are_found(exported: Path, key: CheckpointKey) -> None:
    """Trial finding: text and request_model, left out of the chain hash, could be changed (or
    given twice, the parser keeping the last) in a re-signed export that then verified."""
    lines = (exported / "exchanges.jsonl").read_bytes().splitlines(keepends=True)
    item = json.loads(lines[1])
    lines[1] = jsontext.dumps({**item, "text": "I never said that"}) + b"\n"
    lines[2] = lines[2].replace(b'{"kind":"exchange",', b'{"kind":"exchange","text":"FORGED",', 1)
    item3 = json.loads(lines[3])
    lines[3] = jsontext.dumps({**item3, "request_model": "evil-model"}) + b"\n"
    _resign_lines(exported, key, lines)
    problems = _problems(exported, key)
    assert any("line 2: " in p and "text is not its text blocks joined (changed)" in p for p in problems), problems
    assert any("line 3: not an export line" in p and "a repeated key" in p for p in problems), problems
    assert any("line 4: " in p and "request_model is not the request's model (changed)" in p for p in problems)


def test_a_rewritten_export_is_caught_by_the_writers_checkpoint(exported: Path, key: CheckpointKey) -> None:
    """Someone with the export's key (not the writer's) changes the newest record of writer-a,
    recomputes its hash, the head and the manifest's signature: the writer's own signed
    checkpoint names the old head."""
    other = CheckpointKey.load_or_create(exported.parent / "export-key.pem")
    path = exported / "exchanges.jsonl"
    lines = _lines(exported)
    last = lines[10]
    assert last["id"] == "a-09"
    last["model"] = "forged"
    prev = bytes.fromhex(lines[9]["record_hash"])
    record = {k: v for k, v in last.items() if k not in JOURNAL_KEYS}
    last["record_hash"] = chain_hash(prev, canonical_record(record, WA, 11)).hex()
    path.write_bytes(b"".join(jsontext.dumps_line(x) for x in lines))
    manifest = json.loads((exported / "manifest.json").read_bytes())
    manifest["writers"][0]["head"]["record_hash"] = last["record_hash"]
    data = (exported / "exchanges.jsonl").read_bytes()
    import hashlib

    manifest["files"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest["signer"] = {"key_id": other.key_id, "public_key": public_pem(other.public)}
    (exported / "manifest.json").write_bytes(encode(manifest))
    (exported / "manifest.sig").write_bytes(sign(encode(manifest), other))
    problems = _problems(exported, key)  # the authority trusts the writer's key, not this one
    assert problems[0].startswith(f"manifest.json: signed by key {other.key_id}, which is not a trusted key")
    both = verify_export(exported, [key.public, other.public]).problems  # even trusting the forger's key
    assert both == [
        "manifest.json: writer writer-a, checkpoint 1: names another hash than the head at the same seq",
        "exchanges.jsonl line 11: record a-09 (writer writer-a, seq 11): record_hash is not the head named by"
        " checkpoint 1",
    ]


def test_a_changed_checkpoint_is_found(exported: Path, key: CheckpointKey) -> None:
    """The embedded checkpoint's fields against its signed note, even with the manifest re-signed."""
    manifest = json.loads((exported / "manifest.json").read_bytes())
    manifest["writers"][1]["last_checkpoint"]["seq"] = 4
    (exported / "manifest.json").write_bytes(encode(manifest))
    (exported / "manifest.sig").write_bytes(sign(encode(manifest), key))
    assert "manifest.json: writer writer-b, checkpoint 1: its columns differ from its signed note" in _problems(
        exported, key
    )
    manifest["writers"][1]["last_checkpoint"]["signature"] = manifest["writers"][0]["last_checkpoint"]["signature"]
    (exported / "manifest.json").write_bytes(encode(manifest))
    (exported / "manifest.sig").write_bytes(sign(encode(manifest), key))
    assert "manifest.json: writer writer-b, checkpoint 1: bad signature" in _problems(exported, key)


def test_damaged_csv_and_parquet_files_are_found(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    _export(filled, key, tmp_path / "c", "csv")
    path = tmp_path / "c" / "exchanges.csv"
    path.write_bytes(path.read_bytes()[:-2] + b',"abc')  # a quoted field never closed
    problems = _problems(tmp_path / "c", key)
    assert problems[0] == "exchanges.csv: SHA-256 differs from the manifest (the file was changed)"
    assert any("exchanges.csv row 16: not CSV" in p for p in problems)
    (tmp_path / "c" / "gaps.csv").write_text("writer_id\r\n")
    assert any(p == "gaps.csv line 1: not the header of gaps" for p in _problems(tmp_path / "c", key))
    pytest.importorskip("pyarrow")
    _export(filled, key, tmp_path / "p", "parquet")
    (tmp_path / "p" / "gaps.parquet").write_bytes(b"not parquet")
    assert any(p.startswith("gaps.parquet: not a Parquet file") for p in _problems(tmp_path / "p", key))


def test_unreadable_manifests(exported: Path, key: CheckpointKey) -> None:
    (exported / "manifest.sig").write_text("%%%")
    assert _problems(exported, key) == ["manifest.sig: not a base64 signature"]
    (exported / "manifest.sig").unlink()
    assert _problems(exported, key) == ["manifest.sig: missing (the manifest is not signed)"]
    manifest = json.loads((exported / "manifest.json").read_bytes())
    for change, problem in (
        ({"format": "something else"}, "manifest.json: unreadable (not a manifest of"),
        ({"files": [{"name": "../escape"}]}, "manifest.json: malformed (_Malformed: file name '../escape')"),
        ({"signer": {"key_id": "x", "public_key": "junk"}}, "manifest.json: malformed (_Malformed: signer.public_key"),
        ({"totals": None}, "manifest.json: malformed (TypeError"),
    ):
        (exported / "manifest.json").write_bytes(encode({**manifest, **change}))
        assert _problems(exported, key)[-1].startswith(problem)
    (exported / "manifest.json").write_bytes(b"{not json")
    assert _problems(exported, key)[0].startswith("manifest.json: unreadable")
    (exported / "manifest.json").unlink()
    assert _problems(exported, key) == ["manifest.json: missing (not an export, or its manifest was removed)"]


def test_parquet_without_pyarrow(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyarrow")
    _export(filled, key, tmp_path / "p", "parquet")
    from observer.store import export as export_module
    from observer.store import manifest as manifest_module

    monkeypatch.setattr(manifest_module, "parquet_available", lambda: False)
    monkeypatch.setattr(export_module, "parquet_available", lambda: False)
    check = verify_export(tmp_path / "p", [key.public])
    assert check.ok and any("rows not counted (pyarrow is not installed)" in w for w in check.warnings)
    with pytest.raises(ExportError, match="needs pyarrow"):
        _export(filled, key, tmp_path / "q", "parquet")


def test_verify_imports_no_sqlalchemy(exported: Path) -> None:
    """``observer export verify`` runs where there is no database: SQLAlchemy is never imported."""
    code = (
        "import sys\nfrom observer.cli import app\n"
        f"try:\n    app(['export', 'verify', {str(exported)!r}])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] == 'sqlalchemy'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "0 []", out.stdout + out.stderr


# ----- the command line -----


def test_export_and_verify_on_the_command_line(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path
) -> None:
    runner = CliRunner()
    out = tmp_path / "x"
    args = ["export", "--db", migrated_url, "--key", str(key.path), "--out", str(out)]
    done = runner.invoke(app, [*args, "--since", "2026-06-01T08:00:00Z", "--model", "claude-x", "--format", "csv"])
    assert done.exit_code == 0, done.output
    assert f"observer: exported 5 records and 1 gaps to {out} (2 files," in done.stdout
    assert f"manifest signed by key {key.key_id}" in done.stdout
    public = tmp_path / "public.pem"
    public.write_text(public_pem(key.public))
    ok = runner.invoke(app, ["export", "verify", str(out), "--key", str(public)])
    assert ok.exit_code == 0, ok.output
    assert "2 files, 5 records and 1 gaps of 1 writers;" in ok.stdout
    untrusted = runner.invoke(app, ["export", "verify", str(out)])
    assert untrusted.exit_code == 0 and "observer: warning: no --key given" in untrusted.stderr
    (out / "exchanges.csv").write_bytes((out / "exchanges.csv").read_bytes() + b"\r\n")
    bad = runner.invoke(app, ["export", "verify", str(out), "--key", str(public)])
    assert bad.exit_code == 1
    assert "observer: FAILED: exchanges.csv: SHA-256 differs from the manifest" in bad.stderr
    assert "observer: the export does not verify: " in bad.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--out DIR is required"),
        (["--out", "{tmp}/x", "--format", "xml"], "--format must be one of jsonl, csv, parquet, got 'xml'"),
        (["--out", "{tmp}/x", "--since", "yesterday"], "--since must be an RFC 3339 time"),
        (
            ["--out", "{tmp}/x", "--since", "2026-06-02T00:00:00Z", "--until", "2026-06-01T00:00:00Z"],
            "--since is not before --until",
        ),
        (["--out", "{tmp}/x", "--outcome", "eror"], "--outcome must be one of completed, error,"),
        (["--out", "{tmp}/x", "--dialect", "openai_chat"], "got 'openai_chat' (did you mean openai.chat?)"),
        (["--out", "{tmp}/x", "--model", " "], "--model needs a value"),
        (["--out", "{tmp}/x", "--key", "{tmp}/none.pem"], "cannot sign the export: no checkpoint key"),
        (["--out", "{tmp}"], "is not empty: an export goes into a new or empty folder"),
        (["--out", "{tmp}/x", "--writer", "nobody"], "no writer nobody in this store"),
        (["--out", "{tmp}/x", "--db", "sqlite:///{tmp}/missing.db"], "no such file"),
        (["--since", "2026-06-01T00:00:00Z", "verify", "{tmp}"], "--since: options of the export itself, not of"),
    ],
)
def test_bad_export_arguments_are_one_line(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "keep").write_text("x")
    given = [a.replace("{tmp}", str(tmp_path)) for a in args]
    defaults = [] if "--db" in given else ["--db", migrated_url]
    defaults += [] if "--key" in given or "verify" in given else ["--key", str(key.path)]
    result = CliRunner().invoke(app, ["export", *given, *defaults] if "verify" not in given else ["export", *given])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_bad_verify_arguments(exported: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["export", "verify", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no export folder" in missing.output
    nokey = runner.invoke(app, ["export", "verify", str(exported), "--key", str(tmp_path / "none.pem")])
    assert nokey.exit_code == 2 and "cannot read the key" in nokey.output
    (tmp_path / "junk.pem").write_text("junk")
    junk = runner.invoke(app, ["export", "verify", str(exported), "--key", str(tmp_path / "junk.pem")])
    assert junk.exit_code == 2 and "cannot use the key" in junk.output


def test_the_export_key_is_never_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint key"):
        CheckpointKey.load(tmp_path / "none.pem")
    assert not (tmp_path / "none.pem").exists()
    (tmp_path / "bad.pem").write_text("junk")
    with pytest.raises(ConfigError, match="is not a checkpoint key"):
        CheckpointKey.load(tmp_path / "bad.pem")
    (tmp_path / "dir.pem").mkdir()
    with pytest.raises(ConfigError, match="cannot read the checkpoint key"):
        CheckpointKey.load(tmp_path / "dir.pem")


# ----- exact JSON -----


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 18446744073709551616, "b": -9223372036854775809, "c": 1180591620717411303425}',
        '{"lone": "\\ud800", "n": NaN, "big": 1e400}',
        '{"digits in a string": "12345678901234567890", "f": 0.1, "i": 9223372036854775807}',
        '{"plain": [1, 2.5, "x", null, true]}',
    ],
)
def test_loads_is_exactly_json_loads(text: str) -> None:
    expected = json.loads(text)
    for given in (text, text.encode()):
        got = jsontext.loads(given)
        assert repr(got) == repr(expected)  # NaN != NaN: compare the representations


def test_dumps_takes_what_orjson_refuses() -> None:
    value = {"big": 2**70, "lone": "\ud800"}
    assert jsontext.dumps(value) == b'{"big":1180591620717411303424,"lone":"\\ud800"}'
    assert jsontext.dumps_line(value) == jsontext.dumps(value) + b"\n"
    assert repr(jsontext.loads(jsontext.dumps(value))) == repr(value)


# ----- the less travelled paths -----


def _resign(directory: Path, key: CheckpointKey, change: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((directory / "manifest.json").read_bytes())
    change(manifest)
    (directory / "manifest.json").write_bytes(encode(manifest))
    (directory / "manifest.sig").write_bytes(sign(encode(manifest), key))


def test_forged_manifest_details_are_found(exported: Path, key: CheckpointKey, tmp_path: Path) -> None:
    """Each statement of a (re-signed) manifest against the files and the checkpoints."""
    other = CheckpointKey.load_or_create(tmp_path / "other.pem")

    def forge(m: dict[str, Any]) -> None:
        m["signer"]["key_id"] = "0" * 16
        m["writers"][0]["head"]["seq"] = 10  # writer-a's checkpoint covers 11, its last line is seq 11
        m["writers"][1]["last_checkpoint"]["key_id"] = other.key_id

    _resign(exported, key, forge)
    problems = _problems(exported, key)
    assert f"manifest.json: signer.key_id {'0' * 16} is not the id of its public key" in problems
    assert "manifest.json: writer writer-a, checkpoint 1: covers seq 11, beyond the head (seq 10)" in problems
    assert (
        f"manifest.json: writer writer-b, checkpoint 1: signed by key {other.key_id}, which is not a trusted key"
        in problems
    )
    assert (
        "exchanges.jsonl line 11: record a-09 (writer writer-a, seq 11): beyond the chain head at export time (seq 10)"
        in problems
    )
    untrusted = verify_export(exported)
    assert any(f"signed by key {other.key_id}: not checked (give it with --key)" in w for w in untrusted.warnings)


def test_lines_that_do_not_fit_the_manifest(exported: Path, key: CheckpointKey) -> None:
    path = exported / "exchanges.jsonl"
    lines = _lines(exported)
    lines[-1]["seq"] = 3  # a row without a writer, numbered
    lines[0]["writer_id"] = "stranger"
    lines[9]["record_hash"] = "ab" * 32  # a-08: no longer its hash, nor a-09's predecessor
    path.write_bytes(b"".join(jsontext.dumps_line(x) for x in lines))
    _resign(exported, key, lambda m: m["writers"][0]["head"].update(seq=10, record_hash="ab" * 32))
    problems = _problems(exported, key)
    assert "exchanges.jsonl line 18: a record without a writer has a seq or hash" in problems
    assert "exchanges.jsonl line 1: writer stranger is not in the manifest" in problems
    assert any(
        p.startswith("exchanges.jsonl line 10: record a-08 (writer writer-a, seq 10): record_hash does not")
        for p in problems
    )


def test_many_problems_are_cut_short(exported: Path, key: CheckpointKey) -> None:
    path = exported / "exchanges.jsonl"
    path.write_bytes(b"{}\n" * 30)
    problems = [p for p in _problems(exported, key) if p.startswith("exchanges.jsonl")]
    assert len(problems) == 21 and problems[-1] == "exchanges.jsonl: 13 more problems not listed"


def test_other_formats_and_columns_are_found(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _export(filled, key, tmp_path / "p", "parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "p" / "gaps.parquet")
    assert "gaps.parquet: its columns are not those of gaps" in _problems(tmp_path / "p", key)
    _resign(tmp_path / "p", key, lambda m: m.update(file_format="xml"))
    assert _problems(tmp_path / "p", key)[-1] == "manifest.json: malformed (_Malformed: file_format 'xml')"


def test_gaps_in_pages_and_after_the_last_record(store: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """A writer whose newest entries are gaps: they come after its records, a page at a time,
    and only up to ``until`` when that alone is given."""
    store.write_many([minimal_exchange("t-1", T0)], writer_id="w-tail", seqs=[1])
    store.write_many(
        [],
        writer_id="w-tail",
        seqs=[],
        gaps=[_gap(s, s, T0 + timedelta(minutes=s), T0 + timedelta(minutes=s)) for s in (2, 3, 4)],
    )
    export(store, RecordFilter(), "jsonl", tmp_path / "all", key, page_rows=2)
    assert [x["seq"] for x in _lines(tmp_path / "all")] == [1, 2, 3, 4]
    assert verify_export(tmp_path / "all", [key.public]).ok
    export(store, RecordFilter(until=T0 + timedelta(minutes=2, seconds=30)), "jsonl", tmp_path / "until", key)
    assert [x["seq"] for x in _lines(tmp_path / "until")] == [1, 2]


def test_a_database_error_is_sqlalchemys(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    import sqlalchemy as sa

    with filled.engine.connect() as conn:
        with pytest.raises(sa.exc.DBAPIError):
            RecordReader(conn)._run("SELECT nothing FROM nowhere", [])


def test_times_not_in_sqlalchemys_sqlite_text(store: AuditStore) -> None:
    """A time stored as other text (another tool wrote it) is read as UTC all the same."""
    with store.engine.connect() as conn:
        rd = RecordReader(conn)
        assert rd._time("2026-06-01T08:00:00") == "2026-06-01T08:00:00.000000Z"
        assert rd._time("2026-06-01T10:00:00+02:00") == "2026-06-01T08:00:00.000000Z"


def test_lone_surrogates_become_replacement_characters_in_cells(tmp_path: Path) -> None:
    """A lone surrogate (possible inside request JSON) cannot be UTF-8: JSON text escapes it,
    a CSV or Parquet cell holds U+FFFD."""
    record = {**_line_of(http_error_record()), "request_id": "id-\ud800", "request": {"end_user": "\udfff"}}
    for key in ("blocks", "tool_calls", "violations"):
        record[key] = []
    writer = exportfiles.CsvWriter(tmp_path)
    writer.write([record])
    writer.close()
    text = (tmp_path / "exchanges.csv").read_bytes().decode()
    assert "id-\ufffd" in text and '""end_user"":""\\udfff""' in text
    pytest.importorskip("pyarrow")
    (tmp_path / "p").mkdir()
    writer = exportfiles.ParquetWriter(tmp_path / "p")
    writer.write([record])
    writer.close()
    import pyarrow.parquet as pq

    assert pq.read_table(tmp_path / "p" / "exchanges.parquet").to_pylist()[0]["request_id"] == "id-\ufffd"


def _line_of(record: Exchange) -> dict[str, Any]:
    return {"kind": "exchange", "writer_id": None, "seq": None, "record_hash": None, **record.to_dict()}


def test_hashed_file_writes_big_and_small_pieces(tmp_path: Path) -> None:
    import hashlib

    f = exportfiles.HashedFile(tmp_path / "f")
    pieces = [b"a" * 10, b"b" * exportfiles.CHUNK_BYTES, b"c" * 5]
    for piece in pieces:
        f.write(piece)
    assert f.tell() == sum(map(len, pieces)) and not f.closed
    f.flush()
    assert f.close() == (f.tell(), hashlib.sha256(b"".join(pieces)).hexdigest())
    assert f.closed and f.close()[0] == f.tell()
    assert (tmp_path / "f").read_bytes() == b"".join(pieces)


def test_without_pyarrow_parquet_is_refused(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    assert not exportfiles.parquet_available()
    result = CliRunner().invoke(
        app,
        ["export", "--db", migrated_url, "--key", str(key.path), "--out", str(tmp_path / "x"), "--format", "parquet"],
    )
    assert result.exit_code == 2 and "--format parquet needs pyarrow" in result.output


def test_store_and_write_errors_on_the_command_line(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlalchemy as sa

    from observer.store import export as export_module

    args = ["export", "--db", migrated_url, "--key", str(key.path), "--out", str(tmp_path / "x")]

    def failing(error: BaseException) -> Callable[..., Any]:
        def run(*a: Any, **k: Any) -> Any:
            raise error

        return run

    monkeypatch.setattr(export_module, "export", failing(OSError(28, "No space left on device")))
    result = CliRunner().invoke(app, args)
    assert (
        result.exit_code == 2
        and f"cannot write the export into {tmp_path / 'x'}: No space left on device" in result.output
    )
    monkeypatch.setattr(export_module, "export", failing(sa.exc.OperationalError("SELECT", {}, Exception("gone"))))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "cannot read the audit store" in result.output and "gone" in result.output
    monkeypatch.setattr(export_module, "export", failing(ExportError("no writer x in this store")))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "observer: no writer x in this store" in result.output


def test_an_aborted_parquet_export_and_a_folder_in_place_of_a_file(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path
) -> None:
    pytest.importorskip("pyarrow")
    (tmp_path / "p").mkdir()
    writer = exportfiles.ParquetWriter(tmp_path / "p")
    writer.abort()
    with pytest.raises(ValueError, match="is closed"):
        writer._files[0][1].write(b"late")
    _export(filled, key, tmp_path / "x")
    (tmp_path / "x" / "exchanges.jsonl").unlink()
    (tmp_path / "x" / "exchanges.jsonl").mkdir()
    assert "exchanges.jsonl: not a regular file" in _problems(tmp_path / "x", key)


def test_parquet_row_groups_gather_pages(filled: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """Pages are gathered into row groups of ``ROW_GROUP_BYTES`` (one per page would grow the
    footer kept in memory with every page); the long text columns carry no statistics."""
    pq = pytest.importorskip("pyarrow.parquet")
    export(filled, RecordFilter(), "parquet", tmp_path / "x", key, page_rows=2)
    meta = pq.ParquetFile(tmp_path / "x" / "exchanges.parquet").metadata
    assert (meta.num_row_groups, meta.num_rows) == (1, 16)
    group = meta.row_group(0)
    stated = {group.column(i).path_in_schema: group.column(i).is_stats_set for i in range(group.num_columns)}
    assert stated["id"] and stated["started_at"] and not stated["text"] and not stated["request"]


# ----- several processes -----


@pytest.mark.parametrize("file_format", ["jsonl", "csv"])
def test_parts_in_parallel_are_the_one_job_export(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path, file_format: str
) -> None:
    """Three processes write three parts; read in the manifest's order they are, line for line,
    the export of one process, and they verify, the chain recomputed across the parts."""
    one = _export(filled, key, tmp_path / "one", file_format)
    three = export(filled, RecordFilter(), file_format, tmp_path / "three", key, jobs=3, now=T0 + timedelta(days=1))
    names = [f["name"] for f in three["files"]]
    suffix = "jsonl" if file_format == "jsonl" else "csv"
    expected = [f"exchanges-00{k}.jsonl" for k in (1, 2, 3)] if file_format == "jsonl" else None
    if expected is not None:
        assert names == expected
    else:
        assert names == [f"{kind}-00{k}.{suffix}" for k in (1, 2, 3) for kind in ("exchanges", "gaps")]
    assert three["totals"] == one["totals"] and three["writers"] == one["writers"]

    def body(manifest: dict[str, Any], directory: Path, holds: str) -> bytes:
        parts = [(directory / f["name"]).read_bytes() for f in manifest["files"] if f["holds"] == holds]
        return b"".join(parts if file_format == "jsonl" else [part.split(b"\r\n", 1)[1] for part in parts])

    for holds in {f["holds"] for f in one["files"]}:
        assert body(three, tmp_path / "three", holds) == body(one, tmp_path / "one", holds)
    check = verify_export(tmp_path / "three", [key.public])
    assert check.ok, check.problems
    if file_format == "jsonl":
        assert (check.hashes_checked, check.hashes_unchecked) == (16, 0)


def test_the_plan_cuts_at_record_boundaries(filled: AuditStore) -> None:
    from observer.store.exportjobs import Segment, plan

    with filled.engine.connect() as conn:
        rd = RecordReader(conn)
        heads = {WA: 11, WB: 6, "idle": 0}
        jobs = plan(rd, RecordFilter(), heads, 4)  # 16 records: 4 a part
        assert [j.segments for j in jobs] == [
            (Segment(WA, 1, 4, (1, 11)),),  # a-00..a-03
            (Segment(WA, 5, 9, (1, 11)),),  # the gap, a-04..a-07
            (Segment(WA, 10, 11, (1, 11)), Segment(WB, 1, 2, (1, 6))),
            (Segment(WB, 3, 6, (1, 6)),),  # and the two rows without a writer
        ]
        assert [j.unchained for j in jobs] == [False, False, False, True]
        assert len(plan(rd, RecordFilter(), heads, 1)) == 1
        assert [len(j.segments) for j in plan(rd, RecordFilter(writers=(WB,)), {WB: 6}, 8)] == [1, 1, 1, 1]


def test_a_failed_part_fails_the_export(
    filled: AuditStore, key: CheckpointKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's error comes back (an OSError as one), the other parts stop, nothing is left."""
    from observer.store import exportjobs

    parts = [exportjobs.Job(0, (), False), exportjobs.Job(1, (), True)]
    messages: list[tuple] = [("error", 1, "OSError", 28, "No space left on device")]

    class FakeQueue:
        def get(self, timeout: float) -> tuple:
            if not messages:
                raise exportjobs.queue.Empty
            return messages.pop(0)

        def empty(self) -> bool:
            return not messages

        def close(self) -> None:
            pass

    class FakeProcess:
        exitcode = 1

        def __init__(self, **kwargs: Any) -> None:
            pass

        def start(self) -> None:
            pass

        def is_alive(self) -> bool:
            return False

        def terminate(self) -> None:
            pass

        def join(self) -> None:
            pass

    class FakeContext:
        Queue = FakeQueue
        Process = FakeProcess

    monkeypatch.setattr(exportjobs.multiprocessing, "get_context", lambda method: FakeContext())
    with pytest.raises(OSError, match="No space left"):
        exportjobs.run(filled, RecordFilter(), "jsonl", tmp_path, parts, 10, None)
    messages[:] = [("progress", 3), ("error", 0, "OperationalError", None, "database is locked")]
    with pytest.raises(exportjobs.JobError, match="export job 1: OperationalError: database is locked"):
        exportjobs.run(filled, RecordFilter(), "jsonl", tmp_path, parts, 10, lambda n: None)
    with pytest.raises(exportjobs.JobError, match="export job 1 ended without a result"):
        exportjobs.run(filled, RecordFilter(), "jsonl", tmp_path, parts, 10, None)
    from observer.store import export as export_module

    def boom(*args: Any) -> None:
        raise exportjobs.JobError("export job 2: boom")

    monkeypatch.setattr(export_module, "run", boom)
    with pytest.raises(ExportError, match="export job 2: boom"):
        export(filled, RecordFilter(), "jsonl", tmp_path / "x", key, jobs=2)
    assert not (tmp_path / "x").exists()


def test_a_childs_error_is_sent_back(filled: AuditStore, tmp_path: Path) -> None:
    """What a job's process puts on its queue when it fails, and when it is done."""
    from observer.store import exportjobs

    sent: list[tuple] = []

    class Box:
        put = sent.append

    job = exportjobs.Job(0, (exportjobs.Segment(WA, 1, 11, (1, 11)),), False)
    url = filled.engine.url.render_as_string(hide_password=False)
    exportjobs._child(Box(), url, RecordFilter(), "jsonl", str(tmp_path / "missing"), job, "-001", 100)
    assert sent[-1][:4] == ("error", 0, "FileNotFoundError", 2)
    sent.clear()
    (tmp_path / "out").mkdir()
    exportjobs._child(Box(), url, RecordFilter(), "jsonl", str(tmp_path / "out"), job, "-001", 100)
    assert sent[0] == ("progress", 10) and sent[-1][:2] == ("done", 0)
    assert sent[-1][2].writers[WA]["records"] == 10
    sent.clear()
    exportjobs._child(Box(), "nosuch://x", RecordFilter(), "jsonl", str(tmp_path / "out"), job, "-001", 100)
    assert sent[-1][0] == "error" and sent[-1][3] is None


def test_jobs_on_the_command_line(filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path) -> None:
    args = ["export", "--db", migrated_url, "--key", str(key.path)]
    done = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "x"), "--jobs", "2"])
    assert done.exit_code == 0, done.output
    assert "observer: exported 16 records and 2 gaps" in done.stdout and "(2 files," in done.stdout
    bad = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "y"), "--jobs", "0"])
    assert bad.exit_code == 2 and "--jobs must be 1-64, got 0" in bad.output
    misplaced = CliRunner().invoke(app, ["export", "--jobs", "2", "verify", str(tmp_path / "x")])
    assert misplaced.exit_code == 2 and "--jobs: options of the export itself" in misplaced.output


def test_an_export_of_a_tampered_store_is_refused(
    filled: AuditStore, key: CheckpointKey, migrated_url: str, tmp_path: Path
) -> None:
    """Trial finding: a record changed in the database was exported and signed (its CSV then
    verified)."""
    from observer.store.export import ExportRefused

    with filled.engine.begin() as conn:
        conn.execute(sa.text("UPDATE exchange_blocks SET text = 'TAMPERED' WHERE exchange_id = 'a-03'"))
    with pytest.raises(ExportRefused, match=r"seq \d+, record a-03: hash mismatch"):
        _export(filled, key, tmp_path / "x", "csv")
    assert not (tmp_path / "x").exists()
    base = ["export", "--out", str(tmp_path / "y"), "--format", "csv", "--db", migrated_url, "--key", str(key.path)]
    refused = CliRunner().invoke(app, base)
    assert refused.exit_code == 1 and "nothing was exported" in refused.stderr
    unchecked = CliRunner().invoke(app, [*base, "--no-verify"])
    assert unchecked.exit_code == 0, unchecked.output


def test_an_export_after_a_purge_carries_the_store_chain(store: AuditStore, key: CheckpointKey, tmp_path: Path) -> None:
    """Trial finding: an export after a purge carried nothing of the purge, so an authority saw
    records without their predecessors and could not tell a lawful purge from a deletion. The
    manifest now carries the store's chain (events, purged runs, its checkpoint) and verify
    recomputes each record across the runs."""
    from observer.store.holds import Scope, create_hold
    from observer.store.purge import purge

    now = T0 + timedelta(days=400)
    records = [_a_record(i) for i in range(8)]
    for r in records[6:]:
        r.started_at = now - timedelta(days=1)
    store.write_many(records, writer_id=WA, seqs=list(range(1, 9)))
    create_hold(store.engine, key, store.store_id(), Scope(exchange_ids=("a-02",)), "case", "legal", now)
    result = purge(store, key, now=now, retention_days=183, retention_override=False, actor="ops")
    assert [(a, b) for _w, a, b, _h in result.runs] == [(1, 2), (4, 6)]
    _export(store, key, tmp_path / "x")
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_bytes())
    chain = manifest["store_chain"]
    assert [e["kind"] for e in chain["events"]] == ["hold_created", "purge"]
    assert [r[:3] for r in chain["purged_runs"]] == [[WA, 1, 2], [WA, 4, 6]]
    assert chain["last_checkpoint"]["seq"] == 2
    check = verify_export(tmp_path / "x", [key.public])
    assert check.ok, check.problems
    assert (check.hashes_checked, check.hashes_unchecked) == (3, 0)  # a-02 after run 1..2, a-06 after 4..6, a-07

    def forge(m: dict[str, Any]) -> None:
        m["store_chain"]["purged_runs"][1][2] = 5  # a run shortened: seq 6 deleted unexplained
        m["store_chain"]["events"][0]["actor"] = "someone else"

    _resign(tmp_path / "x", key, forge)
    problems = _problems(tmp_path / "x", key)
    assert any("the store's chain: event 1 does not follow the one before" in p for p in problems), problems
    assert any("the purged runs of event 2 differ from those it committed to" in p for p in problems), problems


def test_a_job_error_is_one_line() -> None:
    """Trial finding: a PostgreSQL connection killed under --jobs 2 printed the statement, its
    1,000 parameters and a link as the error."""
    from sqlalchemy.exc import OperationalError

    from observer.store.exportjobs import error_text

    driver = Exception("terminating connection due to administrator command\nSSL connection has been closed")
    exc = OperationalError("SELECT " + "?, " * 1000, ["x"] * 1000, driver)
    assert error_text(exc) == "terminating connection due to administrator command"
    assert error_text(OSError(28, "No space left on device")) == "No space left on device"
    assert error_text(KeyboardInterrupt()) == "KeyboardInterrupt"
