"""The files of an export: one writer per format, each file hashed (SHA-256) as it is written.

No SQLAlchemy here (``observer export verify`` reads the column lists without a database).
Every writer takes pages of entries as ``observer.store.reader.RecordReader`` makes them
(records: ``"kind": "exchange"``; gaps: ``"kind": "gap"``) and returns, on ``close``, one
``FileEntry`` per file it made. Files are created new (``O_EXCL``), mode 0600 (they hold prompts
and completions), written by a background thread that also hashes them (``os.write`` and
``hashlib`` release the GIL, so the main thread reads and encodes the next page meanwhile), and
fsynced on ``close``. At most ``QUEUE_CHUNKS`` chunks of about a page each wait for that thread:
memory stays flat whatever the size of the export.

Formats (``FORMATS``):

- ``jsonl``: ``exchanges.jsonl``, one JSON object per line (UTF-8, ``\\n``): each record's
  ``Exchange.to_dict()`` preceded by ``kind``, ``writer_id``, ``seq`` and ``record_hash``, and the
  writer's gaps as lines of their own (``"kind": "gap"``) at their place in ``seq`` order. Gaps
  share the file because they are links of the chain: the record after a gap hashes over the
  gap's hash, so one pass over one file recomputes the chain, and a reader sees what is missing
  where it is missing. The exact record: ``json.loads`` of a line gives what ``GET
  /v1/exchanges/{id}`` gives, plus those four keys.
- ``csv``: ``exchanges.csv`` (``RECORD_COLUMNS``) and ``gaps.csv`` (``GAP_COLUMNS``), RFC 4180
  (a header row, CRLF, fields quoted where needed: what the ``csv`` module writes and reads,
  ``csv_line``), UTF-8. One flat row per
  record: the summary's scalars, the text, and the nested parts (``request``, ``blocks``,
  ``tool_calls``, ``violations``, ``error``, ``provenance``: where an offline-ingested record
  came from, ``null`` for one observed live; ``usage_details``, ``choices``) as JSON text; since
  format v3 also the response identity, the cache / reasoning / total token counts, the
  joined ``reasoning`` text, who sent it (``client_address``, ``proxy_user``,
  ``key_fingerprint``) and the resumption ids. An empty cell is ``null`` (or an empty
  string: CSV cannot tell them apart; the JSON cells can), booleans ``true``/``false``. Tabular
  formats get one schema per file, hence the separate gaps file.
- ``parquet`` (needs ``pyarrow``: the ``parquet`` extra): ``exchanges.parquet`` and
  ``gaps.parquet``, the same columns typed (``int64``, ``double``, ``bool``, times
  ``timestamp[us, UTC]``, the nested parts JSON text), zstd, a row group per ~64 MiB.

A string that cannot be UTF-8 (a lone surrogate, possible inside request JSON) is written
``\\uXXXX``-escaped in JSON text and as U+FFFD in a CSV or Parquet cell.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from observer.jsontext import dumps, dumps_line

#: Chunks waiting for a file's writer thread (each about a page: ~1,000 records).
QUEUE_CHUNKS = 4
#: Small writes (Parquet's) are gathered up to this before they go to the thread.
CHUNK_BYTES = 1 << 20

#: ``exchanges.csv`` / ``exchanges.parquet`` columns, in order.
RECORD_COLUMNS = (
    "writer_id",
    "seq",
    "record_hash",
    "id",
    "dialect",
    "scheme",
    "host",
    "port",
    "path",
    "method",
    "http_version",
    "status_code",
    "started_at",
    "ended_at",
    "ttft_s",
    "request_id",
    "request_model",
    "end_user",
    "model",
    "input_tokens",
    "output_tokens",
    "usage_reported",
    "stop_reason",
    "stop_reason_raw",
    "outcome",
    "response_bytes",
    "events",
    "text",
    "response_body",
    "transport_error",
    "error",
    "request",
    "blocks",
    "tool_calls",
    "violations",
    "provenance",
    "response_id",
    "system_fingerprint",
    "service_tier",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_output_tokens",
    "total_tokens",
    "usage_details",
    "choices",
    "reasoning",
    "client_address",
    "proxy_user",
    "key_fingerprint",
    "request_last_event_id",
    "last_event_id",
)
#: The record columns of exports in format v2 (before the usage details and response identity).
RECORD_COLUMNS_V2 = RECORD_COLUMNS[: RECORD_COLUMNS.index("provenance") + 1]
#: The record columns of exports in format v1 (before ``provenance``), still verifiable.
RECORD_COLUMNS_V1 = RECORD_COLUMNS_V2[:-1]
#: The record columns holding JSON text (``provenance``: ``null`` for a record observed live).
JSON_COLUMNS = ("error", "request", "blocks", "tool_calls", "violations", "provenance", "usage_details", "choices")
#: Parquet columns written without min/max statistics (long text).
UNSTATED_COLUMNS = ("text", "response_body", "transport_error", "reasoning", *JSON_COLUMNS)
#: Arrow bytes of pages gathered into one Parquet row group.
ROW_GROUP_BYTES = 64 << 20
#: ``gaps.csv`` / ``gaps.parquet`` columns, in order.
GAP_COLUMNS = ("writer_id", "seq", "seq_end", "first_at", "last_at", "dropped", "reason", "detail", "record_hash")


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of an export as the manifest lists it: ``name`` (in the export's folder),
    what it ``holds`` (``exchanges``, ``gaps`` or ``exchanges and gaps``), ``rows`` (lines, or
    data rows without a header), ``bytes``, ``sha256`` (hex)."""

    name: str
    holds: str
    rows: int
    bytes: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "holds": self.holds, "rows": self.rows, "bytes": self.bytes, "sha256": self.sha256}


class HashedFile:
    """A new file (``O_EXCL``, mode 0600) written and hashed by a background thread.

    ``write`` hands bytes over (blocking while ``QUEUE_CHUNKS`` chunks wait); ``close`` waits for
    them, fsyncs and returns ``(bytes, sha256 hex)``. An ``OSError`` of the thread (``ENOSPC``)
    is raised by the next ``write`` or by ``close``; ``abort`` stops without raising (the caller
    removes the file). ``tell`` gives the bytes handed over so far (Parquet's writer asks)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.fchmod(self._fd, 0o600)  # whatever the umask
        self._sha = hashlib.sha256()
        self._size = 0
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(QUEUE_CHUNKS)
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name=f"export-{path.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is not None:
                continue  # drain: the main thread raises it
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(self._fd, view) :]
                self._sha.update(chunk)  # one call per chunk: each call takes the GIL back
            except OSError as exc:
                self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Hands ``data`` to the thread (small writes gathered); returns its length. Raises
        ``ValueError`` once closed, as a closed file does."""
        if self._fd < 0:
            raise ValueError(f"{self.path.name} is closed")
        self._raise()
        n = len(data)
        self._size += n
        if n >= CHUNK_BYTES and not self._pending:
            self._queue.put(bytes(data))
            return n
        self._pending.append(bytes(data))
        self._pending_bytes += n
        if self._pending_bytes >= CHUNK_BYTES:
            self._flush()
        return n

    def _flush(self) -> None:
        if self._pending:
            self._queue.put(b"".join(self._pending))
            self._pending, self._pending_bytes = [], 0

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        """(For file-like use: the bytes go to the thread on ``close`` at the latest.)"""

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> tuple[int, str]:
        """Waits for the thread, fsyncs, closes; ``(bytes, sha256 hex)``. Raises its ``OSError``."""
        if self._fd < 0:
            return self._size, self._sha.hexdigest()
        self._flush()
        self._queue.put(None)
        self._thread.join()
        try:
            self._raise()
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1
        return self._size, self._sha.hexdigest()

    def abort(self) -> None:
        """Stops the thread and closes the file, raising nothing."""
        if self._fd < 0:
            return
        self._pending = []
        self._queue.put(None)
        self._thread.join()
        os.close(self._fd)
        self._fd = -1


class _Writer:
    """What every format writer shares: its files, their row counts, abort."""

    def __init__(self, directory: Path, names: Sequence[tuple[str, str]]) -> None:
        self._files: list[tuple[str, HashedFile]] = []
        self._rows: dict[str, int] = {}
        try:
            for name, holds in names:
                self._files.append((holds, HashedFile(directory / name)))
                self._rows[name] = 0
        except BaseException:
            self.abort()
            raise

    def write(self, page: list[dict[str, Any]]) -> None:  # pragma: no cover - every format has its own
        raise NotImplementedError

    def names(self) -> list[str]:
        """The names of its files."""
        return [f.path.name for _holds, f in self._files]

    def close(self) -> list[FileEntry]:
        """Closes every file (raises an ``OSError`` of writing); their manifest entries."""
        self._finish()
        out = []
        for holds, f in self._files:
            size, sha = f.close()
            out.append(FileEntry(f.path.name, holds, self._rows[f.path.name], size, sha))
        return out

    def _finish(self) -> None:
        """Writes what the format keeps until the end (Parquet's footers)."""

    def abort(self) -> None:
        for _holds, f in self._files:
            f.abort()


class JsonlWriter(_Writer):
    """``exchanges<suffix>.jsonl``: records and gaps, one JSON line each, in the order given."""

    def __init__(self, directory: Path, suffix: str = "") -> None:
        super().__init__(directory, [(f"exchanges{suffix}.jsonl", "exchanges and gaps")])

    def write(self, page: list[dict[str, Any]]) -> None:
        f = self._files[0][1]
        f.write(b"".join(map(dumps_line, page)))
        self._rows[f.path.name] += len(page)


def record_row(item: dict[str, Any]) -> list[Any]:
    """A record entry as the values of ``RECORD_COLUMNS`` (JSON columns as JSON text; for CSV
    and Parquet, before their own conversions)."""
    usage, request = item["usage"], item["request"]
    return [
        item["writer_id"],
        item["seq"],
        item["record_hash"],
        item["id"],
        item["dialect"],
        item["scheme"],
        item["host"],
        item["port"],
        item["path"],
        item["method"],
        item["http_version"],
        item["status_code"],
        item["started_at"],
        item["ended_at"],
        item["ttft_s"],
        item["request_id"],
        item["request_model"],
        request["end_user"],
        item["model"],
        usage["input_tokens"],
        usage["output_tokens"],
        usage["reported"],
        item["stop_reason"],
        item["stop_reason_raw"],
        item["outcome"],
        item["response_bytes"],
        item["events"],
        item["text"],
        item["response_body"],
        item["transport_error"],
        dumps(item["error"]).decode(),
        dumps(request).decode(),
        dumps(item["blocks"]).decode(),
        dumps(item["tool_calls"]).decode(),
        dumps(item["violations"]).decode(),
        dumps(item.get("provenance")).decode(),
        item["response_id"],
        item["system_fingerprint"],
        item["service_tier"],
        usage["cache_read_input_tokens"],
        usage["cache_creation_input_tokens"],
        usage["reasoning_output_tokens"],
        usage["total_tokens"],
        dumps(usage["details"]).decode(),
        dumps(item["choices"]).decode(),
        item["reasoning"],
        item["client_address"],
        item["proxy_user"],
        item["key_fingerprint"],
        item["request_last_event_id"],
        item["last_event_id"],
    ]


def gap_row(item: dict[str, Any]) -> list[Any]:
    """A gap entry as the values of ``GAP_COLUMNS``."""
    return [item[c] for c in GAP_COLUMNS]


def _utf8(text: str) -> bytes:
    """UTF-8 of ``text``, a lone surrogate as U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def csv_field(value: Any) -> str:
    """One CSV field as ``csv.writer`` (``QUOTE_MINIMAL``) writes it, booleans as
    ``true``/``false``: quoted when it holds ``,``, ``"``, CR or LF, inner quotes doubled;
    ``None`` empty; floats as ``repr``. (The ``csv`` module's C writer looks at every character
    one by one: ~90 µs for a 12 KB record; ``str.replace`` and ``in`` are memchr-fast.)"""
    if isinstance(value, str):
        if '"' in value:
            return '"' + value.replace('"', '""') + '"'
        if "," in value or "\n" in value or "\r" in value:
            return '"' + value + '"'
        return value
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    return repr(value) if isinstance(value, float) else str(value)


def csv_line(values: Sequence[Any]) -> str:
    """One CSV row of two or more fields, CRLF-terminated (RFC 4180): byte for byte what
    ``csv.writer(f, lineterminator="\\r\\n").writerow`` writes (a test compares them)."""
    return ",".join(map(csv_field, values)) + "\r\n"


class CsvWriter(_Writer):
    """``exchanges<suffix>.csv`` and ``gaps<suffix>.csv`` (RFC 4180, a header row each)."""

    def __init__(self, directory: Path, suffix: str = "") -> None:
        super().__init__(directory, [(f"exchanges{suffix}.csv", "exchanges"), (f"gaps{suffix}.csv", "gaps")])
        for (_holds, f), columns in zip(self._files, (RECORD_COLUMNS, GAP_COLUMNS), strict=True):
            f.write(csv_line(columns).encode("ascii"))

    def write(self, page: list[dict[str, Any]]) -> None:
        records = [item for item in page if item["kind"] == "exchange"]
        gaps = [item for item in page if item["kind"] == "gap"]
        for (_holds, f), items, row in zip(self._files, (records, gaps), (record_row, gap_row), strict=True):
            if items:
                f.write(_utf8("".join([csv_line(row(item)) for item in items])))
                self._rows[f.path.name] += len(items)


def parquet_available() -> bool:
    """Whether ``pyarrow`` can be imported (the ``parquet`` format and its row counts need it)."""
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def _schemas() -> tuple[Any, Any]:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    types: dict[str, Any] = {
        "seq": pa.int64(),
        "port": pa.int64(),
        "status_code": pa.int64(),
        "started_at": ts,
        "ended_at": ts,
        "ttft_s": pa.float64(),
        "input_tokens": pa.int64(),
        "output_tokens": pa.int64(),
        "usage_reported": pa.bool_(),
        "cache_read_input_tokens": pa.int64(),
        "cache_creation_input_tokens": pa.int64(),
        "reasoning_output_tokens": pa.int64(),
        "total_tokens": pa.int64(),
        "response_bytes": pa.int64(),
        "events": pa.int64(),
        "seq_end": pa.int64(),
        "first_at": ts,
        "last_at": ts,
        "dropped": pa.int64(),
    }
    record = pa.schema([(c, types.get(c, pa.string())) for c in RECORD_COLUMNS])
    gap = pa.schema([(c, types.get(c, pa.string())) for c in GAP_COLUMNS])
    return record, gap


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


class ParquetWriter(_Writer):
    """``exchanges<suffix>.parquet`` and ``gaps<suffix>.parquet``. Pages are converted to Arrow
    at once and written as one row group per ``ROW_GROUP_BYTES`` of them: memory stays flat (the footer
    keeps ~30 KB of metadata per row group until the end, so one per 1,000-record page would
    grow ~30 MB per million records; this is ~5 MB). No min/max statistics for the text and
    JSON columns (``UNSTATED_COLUMNS``): large, and of no use to a reader's filters."""

    def __init__(self, directory: Path, suffix: str = "") -> None:
        import pyarrow.parquet as pq

        names = [(f"exchanges{suffix}.parquet", "exchanges"), (f"gaps{suffix}.parquet", "gaps")]
        super().__init__(directory, names)
        self._schemas = _schemas()
        stated = [c for c in RECORD_COLUMNS if c not in UNSTATED_COLUMNS]
        self._pq = [
            pq.ParquetWriter(f, schema, compression="zstd", write_statistics=stats)
            for (_holds, f), schema, stats in zip(self._files, self._schemas, (stated, True), strict=True)
        ]
        self._pending: list[list[Any]] = [[], []]
        self._pending_bytes = [0, 0]

    def write(self, page: list[dict[str, Any]]) -> None:
        records = [item for item in page if item["kind"] == "exchange"]
        gaps = [item for item in page if item["kind"] == "gap"]
        for i, (items, row) in enumerate(((records, record_row), (gaps, gap_row))):
            if items:
                table = self._table(self._schemas[i], [row(item) for item in items])
                self._pending[i].append(table)
                self._pending_bytes[i] += table.nbytes
                self._rows[self._files[i][1].path.name] += len(items)
                if self._pending_bytes[i] >= ROW_GROUP_BYTES:
                    self._flush_group(i)

    def _flush_group(self, i: int) -> None:
        import pyarrow as pa

        if self._pending[i]:
            table = pa.concat_tables(self._pending[i])
            self._pq[i].write_table(table, row_group_size=table.num_rows)
            self._pending[i], self._pending_bytes[i] = [], 0

    @staticmethod
    def _table(schema: Any, rows: list[list[Any]]) -> Any:
        import pyarrow as pa

        columns: list[list[Any]] = [list(c) for c in zip(*rows, strict=True)]
        for i, field in enumerate(schema):
            if pa.types.is_timestamp(field.type):
                columns[i] = [_time(v) for v in columns[i]]
        try:
            return pa.Table.from_arrays(
                [pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
            )
        except UnicodeEncodeError:
            fixed: Callable[[Any], Any] = lambda v: _utf8(v).decode() if isinstance(v, str) else v  # noqa: E731
            return pa.Table.from_arrays(
                [pa.array([fixed(v) for v in c], f.type) for c, f in zip(columns, schema, strict=True)], schema=schema
            )

    def _finish(self) -> None:
        for i, writer in enumerate(self._pq):
            self._flush_group(i)
            writer.close()

    def abort(self) -> None:
        """Closes the Parquet writers first (their footers go to files about to be removed),
        so that none writes into a closed file later."""
        for writer in self._pq:
            with contextlib.suppress(Exception):
                writer.close()
        super().abort()


#: Format name -> writer class.
FORMATS: dict[str, type[_Writer]] = {"jsonl": JsonlWriter, "csv": CsvWriter, "parquet": ParquetWriter}

__all__ = [
    "FORMATS",
    "GAP_COLUMNS",
    "JSON_COLUMNS",
    "RECORD_COLUMNS",
    "RECORD_COLUMNS_V1",
    "RECORD_COLUMNS_V2",
    "CsvWriter",
    "FileEntry",
    "csv_field",
    "csv_line",
    "HashedFile",
    "JsonlWriter",
    "ParquetWriter",
    "gap_row",
    "parquet_available",
    "record_row",
]
