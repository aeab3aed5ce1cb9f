"""An export's manifest (``manifest.json``), its signature (``manifest.sig``) and the export's
offline check (``verify_export``): no database, no SQLAlchemy (a test checks that).

``manifest.json`` (written by ``observer.store.export``; UTF-8 JSON, two-space indent)::

    {"format": "llm-stream-observer export v3" (v2: before CSV and Parquet had the usage
     details, the response identity and ``reasoning``; v1: before ``provenance``; both still
     verified), "created_at": RFC 3339 UTC, "store_id": ...,
     "file_format": "jsonl" | "csv" | "parquet",
     "filters": {"since", "until" (RFC 3339 or null), "model", "host", "user", "dialect",
                 "outcome", "writer" (lists: empty = any)},
     "order": how the rows are ordered,
     "files": [{"name", "holds", "rows", "bytes", "sha256"}],
     "totals": {"records", "chained_records", "unchained_records", "gaps"},
     "writers": [{"writer_id", "records", "gaps", "first_seq", "last_seq" (of the exported
                  entries, or null), "head": {"seq", "record_hash"} (the chain head when the
                  export began: AuditStore.chain_head), "last_checkpoint": the writer's newest
                  checkpoint row then (its signed note and signature; created_at RFC 3339) or
                  null}] (every writer of the store, by id),
     "signer": {"key_id", "public_key" (PEM)},
     "store_chain": {"events": [the store's events: seq, kind, at, actor, detail, record_hash],
                     "purged_runs": [[writer_id, first_seq, last_seq, last_hash, event_seq]],
                     "last_checkpoint": its newest checkpoint row, or null}}

``manifest.sig``: the base64 Ed25519 signature of the exact bytes of ``manifest.json`` by the
checkpoint key (``observer.store.checkpoint.CheckpointKey``), and a newline.

``verify_export`` checks, and names each failure (file, line, why): the signature (with a
trusted key, or the embedded one with a warning that it proves nothing about who signed); that
the folder holds exactly the listed files, each with its bytes, SHA-256 and rows; each writer's
last checkpoint (signature, the note against its fields and the manifest's store id, not beyond
the head); for ``jsonl``, every line's shape, the seq order per writer, each entry's
``record_hash`` recomputed (``observer.store.chain``) where its predecessor (seq - 1, a record
or a gap; ``GENESIS`` before seq 1) is in the export too, the entries that reach the head or the
checkpoint against their hashes, and the counts per writer and in all. CSV and Parquet cannot
be rebuilt into the exact record (CSV is lossy): their files are checked by SHA-256 only.
"""

from __future__ import annotations

import base64
import codecs
import csv
import hashlib
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from observer.errors import ConfigError
from observer.jsontext import dumps, loads
from observer.shape import parse_rfc3339
from observer.store.chain import (
    GENESIS,
    canonical_gap,
    canonical_record,
    chain_hash,
    event_chain_break,
    purges_not_matching_runs,
)
from observer.store.checkpoint import CheckpointKey, check_checkpoint, key_id, load_public_key
from observer.store.exportfiles import (
    GAP_COLUMNS,
    RECORD_COLUMNS,
    RECORD_COLUMNS_V1,
    RECORD_COLUMNS_V2,
    parquet_available,
)

#: The format of the exports made now: v2 added the ``provenance`` column to CSV and Parquet,
#: v3 the response identity, the usage details and ``reasoning`` (issue 16).
FORMAT = "llm-stream-observer export v3"
#: The formats ``verify_export`` reads, with their record columns (CSV, Parquet).
READABLE = {
    FORMAT: RECORD_COLUMNS,
    "llm-stream-observer export v2": RECORD_COLUMNS_V2,
    "llm-stream-observer export v1": RECORD_COLUMNS_V1,
}
MANIFEST = "manifest.json"
SIGNATURE = "manifest.sig"
#: A listed file this much bigger than the manifest says is refused without reading it.
GROWN_BYTES = 1 << 20
#: Bytes read at a time when hashing and parsing a file.
READ_BYTES = 1 << 20
#: Problems listed per file; more are counted in one line.
MAX_PROBLEMS_PER_FILE = 20
_LINE_KEYS = ("kind", "writer_id", "seq", "record_hash")


def encode(manifest: dict[str, Any]) -> bytes:
    """The bytes of ``manifest.json`` (what is signed)."""
    return json.dumps(manifest, indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def sign(data: bytes, key: CheckpointKey) -> bytes:
    """The content of ``manifest.sig`` for the manifest bytes ``data``."""
    return base64.b64encode(key.private.sign(data)) + b"\n"


@dataclass(slots=True)
class ExportCheck:
    """``verify_export``'s result: the problems (each a line naming the file, line and why:
    any one fails the export), warnings, the signer's key id and whether a trusted key checked
    it, and what was checked."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    key_id: str | None = None
    trusted: bool = False
    store_id: str | None = None
    files: int = 0
    records: int = 0
    gaps: int = 0
    writers: int = 0
    hashes_checked: int = 0
    hashes_unchecked: int = 0
    checkpoints_checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        return (
            f"store {self.store_id}: {self.files} files, {self.records} records and {self.gaps} gaps of"
            f" {self.writers} writers;"
            f" {self.hashes_checked} chain hashes recomputed ({self.hashes_unchecked} without their predecessor"
            f" in the export); {self.checkpoints_checked} checkpoints checked; manifest signed by key {self.key_id}"
        )


class _Malformed(Exception):
    """The manifest lacks a field or has one of the wrong type."""


def verify_export(
    directory: Path,
    trusted: Sequence[Ed25519PublicKey] = (),
    *,
    total: Callable[[int], None] | None = None,
    progress: Callable[[int], None] | None = None,
) -> ExportCheck:
    """Checks the export in ``directory`` (module docstring) without a database. ``trusted``:
    the public keys to trust (the exporter's, and the writers' for their checkpoints; empty:
    the manifest's own key, with a warning). ``total(n)`` is called once with the bytes to
    read, ``progress(n)`` with the bytes read since its last call. Raises ``OSError`` only for a
    folder that cannot be listed."""
    check = ExportCheck()
    names = set(os.listdir(directory))
    if (directory / MANIFEST).exists() and not (directory / MANIFEST).is_file():
        check.problems.append(f"{MANIFEST}: not a regular file")
        return check
    try:
        data = (directory / MANIFEST).read_bytes()
    except FileNotFoundError:
        check.problems.append(f"{MANIFEST}: missing (not an export, or its manifest was removed)")
        return check
    except OSError as exc:
        check.problems.append(f"{MANIFEST}: cannot be read ({exc.strerror})")
        return check
    try:
        manifest = loads(data)
        if not isinstance(manifest, dict) or manifest.get("format") not in READABLE:
            raise ValueError(f"not a manifest of {' or '.join(map(repr, READABLE))}")
    except ValueError as exc:
        check.problems.append(f"{MANIFEST}: unreadable ({exc})")
        return check
    try:
        check.store_id = str(manifest.get("store_id"))
        keys = _check_signature(directory, data, manifest, trusted, check)
        _check_listing(names, manifest, check)
        writers = _check_writers(manifest, keys, bool(trusted), check)
        _check_store_chain(manifest, keys, bool(trusted), writers, check)
        files = manifest["files"]
        if total is not None:
            total(sum(int(f["bytes"]) for f in files))
        counted = {"records": 0, "gaps": 0}
        for entry in files:
            columns = READABLE[manifest["format"]] if entry["holds"] == "exchanges" else GAP_COLUMNS
            _check_file(directory, entry, manifest["file_format"], columns, writers, counted, check, progress)
        _check_counts(manifest, writers, counted, check)
    except (KeyError, TypeError, ValueError, _Malformed) as exc:
        check.problems.append(f"{MANIFEST}: malformed ({type(exc).__name__}: {exc})")
    return check


def _check_signature(
    directory: Path, data: bytes, manifest: dict[str, Any], trusted: Sequence[Ed25519PublicKey], check: ExportCheck
) -> dict[str, Ed25519PublicKey]:
    """Checks ``manifest.sig``; the keys checkpoints are checked with (by key id)."""
    signer = manifest["signer"]
    try:
        embedded = load_public_key(signer["public_key"].encode())
    except ConfigError as exc:
        raise _Malformed(f"signer.public_key: {exc}") from None
    check.key_id = key_id(embedded)
    if check.key_id != signer["key_id"]:
        check.problems.append(f"{MANIFEST}: signer.key_id {signer['key_id']} is not the id of its public key")
    keys = {key_id(k): k for k in trusted}
    if trusted:
        public = keys.get(check.key_id)
        if public is None:
            check.problems.append(
                f"{MANIFEST}: signed by key {check.key_id}, which is not a trusted key ({', '.join(sorted(keys))})"
            )
        check.trusted = public is not None
    else:
        public = embedded
        keys = {check.key_id: embedded}
        check.warnings.append(
            f"no --key given: the signature was checked with the public key the manifest itself carries"
            f" (key id {check.key_id}), which does not show who signed it; give the exporter's public key"
        )
    try:
        signature = base64.b64decode((directory / SIGNATURE).read_bytes().strip(), validate=True)
    except FileNotFoundError:
        check.problems.append(f"{SIGNATURE}: missing (the manifest is not signed)")
        return keys
    except OSError as exc:
        check.problems.append(f"{SIGNATURE}: cannot be read ({exc.strerror})")
        return keys
    except ValueError:
        check.problems.append(f"{SIGNATURE}: not a base64 signature")
        return keys
    if public is not None:
        try:
            public.verify(signature, data)
        except InvalidSignature:
            check.problems.append(
                f"{SIGNATURE}: the signature does not match {MANIFEST} (the manifest was changed, or signed by"
                " another key)"
            )
    return keys


def _check_listing(names: set[str], manifest: dict[str, Any], check: ExportCheck) -> None:
    listed = [f["name"] for f in manifest["files"]]
    for name in listed:
        if not isinstance(name, str) or name in (MANIFEST, SIGNATURE) or os.sep in name or name.startswith("."):
            raise _Malformed(f"file name {name!r}")
    for name in sorted(names - set(listed) - {MANIFEST, SIGNATURE}):
        check.problems.append(f"{name}: not listed in the manifest (added)")


@dataclass(slots=True)
class _Chain:
    """One writer's state while its jsonl lines are read; ``purged``: its runs removed by a
    purge the store chain vouches for (first seq -> (last seq, hash of the last))."""

    head_seq: int
    head_hash: str
    checkpoint_seq: int | None
    checkpoint_hash: str | None
    checkpoint_number: int | None
    records: int = 0
    gaps: int = 0
    last_end: int = 0
    last_hash: bytes = GENESIS
    purged: dict[int, tuple[int, str]] = field(default_factory=dict)


def _check_writers(
    manifest: dict[str, Any], keys: dict[str, Ed25519PublicKey], trusted: bool, check: ExportCheck
) -> dict[str, _Chain]:
    """Checks each writer's last checkpoint; the writers' chain states for the lines."""
    store_id = manifest["store_id"]
    out: dict[str, _Chain] = {}
    for w in manifest["writers"]:
        writer, head, cp = w["writer_id"], w["head"], w["last_checkpoint"]
        chain = _Chain(int(head["seq"]), str(head["record_hash"]), None, None, None)
        out[writer] = chain
        if cp is None:
            if head["seq"]:
                check.warnings.append(f"writer {writer}: no checkpoint at export time")
            continue
        chain.checkpoint_seq, chain.checkpoint_hash, chain.checkpoint_number = cp["seq"], cp["head_hash"], cp["number"]
        where = f"{MANIFEST}: writer {writer}, checkpoint {cp['number']}"
        public = keys.get(cp["key_id"])
        if public is None:
            if trusted:
                check.problems.append(f"{where}: signed by key {cp['key_id']}, which is not a trusted key")
            else:
                check.warnings.append(f"{where}: signed by key {cp['key_id']}: not checked (give it with --key)")
        else:
            problem = check_checkpoint({**cp, "created_at": parse_rfc3339(cp["created_at"])}, public, store_id)
            if problem is not None:
                check.problems.append(f"{where}: {problem}")
            check.checkpoints_checked += 1
        if cp["seq"] > chain.head_seq:
            check.problems.append(f"{where}: covers seq {cp['seq']}, beyond the head (seq {chain.head_seq})")
        elif cp["seq"] == chain.head_seq and cp["head_hash"] != chain.head_hash:
            check.problems.append(f"{where}: names another hash than the head at the same seq")
    check.writers = sum(1 for w in manifest["writers"] if w["records"] or w["gaps"])
    return out


def _check_store_chain(
    manifest: dict[str, Any],
    keys: dict[str, Ed25519PublicKey],
    trusted: bool,
    writers: dict[str, _Chain],
    check: ExportCheck,
) -> None:
    """Checks the store's own chain the manifest carries (``store_chain``: its events
    recomputed, each purge's runs against its digest, the last checkpoint signed by a trusted
    key and naming the last event) and hands each writer its purged runs, so its lines are
    recomputed across them. An export without ``store_chain`` (older) has nothing to check."""
    chain = manifest.get("store_chain")
    if not chain:
        return
    store_id = manifest["store_id"]
    where = f"{MANIFEST}: the store's chain"
    events = chain["events"]
    ok = True
    broken = event_chain_break(events, store_id)
    if broken is not None:
        check.problems.append(f"{where}: event {broken[0]} does not follow the one before (changed, or one missing)")
        ok = False
    for seq in purges_not_matching_runs(events, chain["purged_runs"]):
        check.problems.append(f"{where}: the purged runs of event {seq} differ from those it committed to")
        ok = False
    purges = {e["seq"] for e in events if e["kind"] == "purge"}
    orphans = sorted({int(r[4]) for r in chain["purged_runs"]} - purges)
    if orphans:
        check.problems.append(f"{where}: purged runs name no purge event ({', '.join(map(str, orphans))})")
        ok = False
    cp = chain["last_checkpoint"]
    if events and cp is None:
        check.problems.append(f"{where}: {len(events)} events and no signed checkpoint")
        ok = False
    elif cp is not None:
        public = keys.get(cp["key_id"])
        if public is None:
            (check.problems if trusted else check.warnings).append(
                f"{where}: checkpoint signed by key {cp['key_id']}"
                + (", not a trusted key" if trusted else ": not checked")
            )
            ok = ok and not trusted
        else:
            problem = check_checkpoint({**cp, "created_at": parse_rfc3339(cp["created_at"])}, public, store_id)
            if (
                problem is not None
                or cp["seq"] != len(events)
                or (events and cp["head_hash"] != events[-1]["record_hash"])
            ):
                check.problems.append(f"{where}: its checkpoint {problem or 'does not name its last event'}")
                ok = False
            check.checkpoints_checked += 1
    if ok:
        for writer, first, last, last_hash, _event in chain["purged_runs"]:
            if writer in writers:
                writers[writer].purged[int(first)] = (int(last), last_hash)


def _chunks(f: BinaryIO, sha: Any, progress: Callable[[int], None] | None) -> Iterator[bytes]:
    while chunk := f.read(READ_BYTES):
        sha.update(chunk)
        if progress is not None:
            progress(len(chunk))
        yield chunk


def _check_file(
    directory: Path,
    entry: dict[str, Any],
    file_format: str,
    columns: Sequence[str],
    writers: dict[str, _Chain],
    counted: dict[str, int],
    check: ExportCheck,
    progress: Callable[[int], None] | None,
) -> None:
    name = entry["name"]
    problems: list[str] = []
    sha = hashlib.sha256()
    path = directory / name
    if path.exists() and not path.is_file():  # a FIFO or a folder would hang or fail the read
        check.problems.append(f"{name}: not a regular file")
        return
    if path.is_file() and path.stat().st_size > entry["bytes"] + GROWN_BYTES:
        # Far bigger than signed: said at once, not read through (a huge appended line).
        check.problems.append(f"{name}: {path.stat().st_size} bytes, the manifest says {entry['bytes']} (changed)")
        return
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        check.problems.append(f"{name}: missing (removed)")
        return
    except OSError as exc:
        check.problems.append(f"{name}: cannot be read ({exc.strerror})")
        return
    with f:
        chunks = _chunks(f, sha, progress)
        if file_format == "jsonl":
            rows = _jsonl(name, chunks, writers, counted, check, problems)
        elif file_format == "csv":
            rows = _csv(name, chunks, entry["holds"], columns, problems)
        elif file_format == "parquet":
            for _ in chunks:
                pass
            rows = _parquet_rows(directory / name, entry["holds"], columns, check, problems)
        else:
            raise _Malformed(f"file_format {file_format!r}")
        size = f.tell()
    check.files += 1
    if size != entry["bytes"]:
        problems.insert(0, f"{name}: {size} bytes, the manifest says {entry['bytes']}")
    if sha.hexdigest() != entry["sha256"]:
        problems.insert(0, f"{name}: SHA-256 differs from the manifest (the file was changed)")
    if rows is not None and rows != entry["rows"]:
        problems.append(f"{name}: {rows} rows, the manifest says {entry['rows']}")
    if file_format != "jsonl":  # (rows not counted: the signed manifest's, its file's problem already said)
        counted["records" if entry["holds"] == "exchanges" else "gaps"] += entry["rows"] if rows is None else rows
    if len(problems) > MAX_PROBLEMS_PER_FILE:
        more = len(problems) - MAX_PROBLEMS_PER_FILE
        problems = [*problems[:MAX_PROBLEMS_PER_FILE], f"{name}: {more} more problems not listed"]
    check.problems.extend(problems)


def _lines(chunks: Iterator[bytes], name: str, problems: list[str]) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its ``\\n``); a last line without one is a problem."""
    rest = b""
    number = 0
    for chunk in chunks:
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for line in parts:
            number += 1
            yield number, line
    if rest:
        problems.append(f"{name} line {number + 1}: truncated (no end of line)")


def _jsonl(
    name: str,
    chunks: Iterator[bytes],
    writers: dict[str, _Chain],
    counted: dict[str, int],
    check: ExportCheck,
    problems: list[str],
) -> int:
    rows = 0
    for number, line in _lines(chunks, name, problems):
        rows += 1
        where = f"{name} line {number}"
        try:
            item = loads(line)
            if dumps(item) != line:
                # The exporter writes each line as jsontext.dumps of the item: any other text for
                # the same values (a repeated key: the last one wins in the parser; spacing) is
                # not its line.
                raise ValueError("not the line the exporter writes for its values (a repeated key, or re-encoded)")
            kind = item["kind"]
            if kind == "exchange":
                counted["records"] += 1
            elif kind == "gap":
                counted["gaps"] += 1
            else:
                raise ValueError(f"kind {kind!r}")
            if item["writer_id"] is None and kind == "exchange":
                if item["seq"] is not None or item["record_hash"] is not None:
                    problems.append(f"{where}: a record without a writer has a seq or hash")
                continue
            problem = _link(item, writers, check)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            problem = f"not an export line ({type(exc).__name__}: {exc})"
        if problem is not None:
            problems.append(f"{where}: {problem}")
    return rows


def _link(item: dict[str, Any], writers: dict[str, _Chain], check: ExportCheck) -> str | None:
    """Checks one chained line against its writer's state (and advances it); why not, or ``None``."""
    writer, seq, stored = item["writer_id"], int(item["seq"]), item["record_hash"]
    chain = writers.get(writer)
    if chain is None:
        return f"writer {writer} is not in the manifest"
    is_gap = item["kind"] == "gap"
    what = f"gap {seq}..{item['seq_end']}" if is_gap else f"record {item['id']}"
    where = f"{what} (writer {writer}, seq {seq})"
    end = int(item["seq_end"]) if is_gap else seq
    chain.gaps += is_gap
    chain.records += not is_gap
    if seq <= chain.last_end:
        return f"{where}: not after seq {chain.last_end} (lines out of order or repeated)"
    if end > chain.head_seq:
        return f"{where}: beyond the chain head at export time (seq {chain.head_seq})"
    if not is_gap:
        # text and request_model are derived from the record (not committed by the chain):
        # they must be what the record gives.
        blocks = sorted(item["blocks"], key=lambda b: b["index"])
        if item["text"] != "".join(b["text"] for b in blocks if b["type"] == "text"):
            return f"{where}: text is not its text blocks joined (changed)"
        if item["request_model"] != (item["request"] or {}).get("model"):
            return f"{where}: request_model is not the request's model (changed)"
    while seq > chain.last_end + 1 and chain.last_end + 1 in chain.purged:  # removed by a purge: go on from it
        chain.last_end, last_hash = chain.purged[chain.last_end + 1]
        chain.last_hash = bytes.fromhex(last_hash)
    if seq == chain.last_end + 1:
        if is_gap:
            canonical = canonical_gap(item, writer)
        else:
            canonical = canonical_record({k: v for k, v in item.items() if k not in _LINE_KEYS}, writer, seq)
        if chain_hash(chain.last_hash, canonical).hex() != stored:
            kind = "gap" if is_gap else "record"
            return f"{where}: record_hash does not match the {kind} and its predecessor (changed)"
        check.hashes_checked += 1
    else:
        check.hashes_unchecked += 1
    if end == chain.head_seq and stored != chain.head_hash:
        return f"{where}: record_hash is not the chain head of the manifest"
    if end == chain.checkpoint_seq and stored != chain.checkpoint_hash:
        return f"{where}: record_hash is not the head named by checkpoint {chain.checkpoint_number}"
    chain.last_end, chain.last_hash = end, bytes.fromhex(stored)
    return None


def _csv(name: str, chunks: Iterator[bytes], holds: str, header: Sequence[str], problems: list[str]) -> int | None:
    columns = list(header)
    decoder = codecs.getincrementaldecoder("utf-8")()

    def lines() -> Iterator[str]:
        rest = ""
        for chunk in chunks:
            parts = (rest + decoder.decode(chunk)).split("\n")
            rest = parts.pop()
            for part in parts:
                yield part + "\n"  # (only LF ends a line: text may hold U+2028 and the like)
        rest += decoder.decode(b"", final=True)
        if rest:
            yield rest

    rows = -1
    try:
        for row in csv.reader(lines(), strict=True):
            if rows == -1 and row != columns:
                problems.append(f"{name} line 1: not the header of {holds}")
            elif rows >= 0 and len(row) != len(columns):
                problems.append(f"{name} row {rows + 1}: {len(row)} fields, not {len(columns)}")
            rows += 1
    except (csv.Error, UnicodeDecodeError) as exc:
        problems.append(f"{name} row {rows + 1}: not CSV ({exc})")
        for _ in chunks:  # the rest still counts for the SHA-256
            pass
        return None
    return max(rows, 0)


def _parquet_rows(path: Path, holds: str, header: Sequence[str], check: ExportCheck, problems: list[str]) -> int | None:
    if not parquet_available():
        check.warnings.append(f"{path.name}: rows not counted (pyarrow is not installed); bytes and SHA-256 checked")
        return None
    import pyarrow.parquet as pq

    columns = list(header)
    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        problems.append(f"{path.name}: not a Parquet file ({type(exc).__name__}: {exc})")
        return None
    if meta.schema.names != columns:
        problems.append(f"{path.name}: its columns are not those of {holds}")
    return int(meta.num_rows)


def _check_counts(
    manifest: dict[str, Any], writers: dict[str, _Chain], counted: dict[str, int], check: ExportCheck
) -> None:
    totals = manifest["totals"]
    check.records, check.gaps = counted["records"], counted["gaps"]
    for kind in ("records", "gaps"):
        if counted[kind] != totals[kind]:
            check.problems.append(f"{MANIFEST}: totals.{kind} is {totals[kind]}, the files hold {counted[kind]}")
    if manifest["file_format"] != "jsonl":
        check.warnings.append(
            f"{manifest['file_format']} files are checked by their SHA-256 in the signed manifest; the chain is"
            " recomputed from jsonl exports only"
        )
        return
    for w in manifest["writers"]:
        chain = writers[w["writer_id"]]
        if (chain.records, chain.gaps) != (w["records"], w["gaps"]):
            check.problems.append(
                f"{MANIFEST}: writer {w['writer_id']} has {w['records']} records and {w['gaps']} gaps,"
                f" the files {chain.records} and {chain.gaps}"
            )


__all__ = ["FORMAT", "MANIFEST", "SIGNATURE", "ExportCheck", "encode", "sign", "verify_export"]
