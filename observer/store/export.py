"""``export``: the records of an ``AuditStore`` that a ``RecordFilter`` takes, streamed in
constant memory into the files of one format (``observer.store.exportfiles``), with a manifest
signed by the checkpoint key (``observer.store.manifest``): ``observer export``.

**What is taken.** Each writer's records that the filter takes, up to the writer's chain head
when the export began (records stored meanwhile wait for the next export, so the manifest's
heads and the files agree), and the writer's gaps up to that head that lie within the seq span
of its records started in the time range, or whose loss times (when known) overlap it. Gaps are
chosen by time alone, never by the other filters (what a gap lost, model or host, is unknown),
because an authority must see what is missing. With no ``writers`` filter, the records stored
before the journal (no writer, not chained) come last.

**Order** (``ORDER``): writers by id; within a writer, its records and gaps by ``seq``, the
order of its hash chain, so that one pass recomputes every link whose predecessor is exported
too (a filter leaves holes: the entry after a hole cannot be recomputed from the export); then
the rows without a writer by ``(started_at, id)``. Both are keyset orders on an index
(``ux_exchanges_writer_id_seq``, ``ix_exchanges_started_at_id``): pages of ``PAGE_ROWS``, one
statement per table and page, nothing kept between pages but the last key and the counts.

**Parts.** With ``jobs`` > 1 the order is cut into that many parts of about as many records,
each written by its own process into its own files (``exchanges-001.jsonl``, ...), listed in
order by the manifest: read in that order they are the one-job export
(``observer.store.exportjobs``).

**Files.** ``directory`` must not exist (it is made, mode 0700) or be an empty folder (its mode
becomes 0700); every file is new, mode 0600. The manifest is written last: a folder without one
is no export. On any failure the files made so far (and the folder, if made here) are removed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import select

from observer.errors import ObserverError
from observer.shape import rfc3339
from observer.store.access import access_writer
from observer.store.checkpoint import CheckpointKey, public_pem
from observer.store.exportfiles import FORMATS, FileEntry, parquet_available
from observer.store.exportjobs import JobError, plan, run
from observer.store.manifest import FORMAT, MANIFEST, SIGNATURE, encode, sign
from observer.store.reader import PAGE_ROWS, RecordFilter, RecordReader
from observer.store.store import AuditStore

ORDER = (
    "writers by writer_id; a writer's records and gaps by seq (its hash chain's order);"
    " then the records without a writer (stored before the journal) by started_at, id"
)

Item = dict[str, Any]


class ExportRefused(ObserverError):
    """The chain does not verify over the exported range: a signed export would vouch for
    tampered records."""

    code = "export_refused"


class ExportError(ObserverError):
    """An export that cannot be made as asked (its folder is not empty, an unknown writer or
    format, ``pyarrow`` missing for Parquet)."""

    code = "export_error"


def check_directory(directory: Path) -> None:
    """Raises ``ExportError`` unless ``directory`` is absent or an empty folder (nothing made)."""
    if directory.exists() or directory.is_symlink():
        if not directory.is_dir():
            raise ExportError(f"{directory} is not a folder")
        if any(directory.iterdir()):
            raise ExportError(f"{directory} is not empty: an export goes into a new or empty folder")


def prepare_directory(directory: Path) -> bool:
    """Makes ``directory`` (mode 0700) or takes it if it is an empty folder (made 0700);
    whether it was made here. Raises ``ExportError`` otherwise."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        check_directory(directory)
        os.chmod(directory, 0o700)
        return False
    except OSError as exc:
        raise ExportError(f"cannot make {directory}: {exc.strerror}") from exc
    os.chmod(directory, 0o700)  # whatever the umask
    return True


def export(
    store: AuditStore,
    f: RecordFilter,
    file_format: str,
    directory: Path,
    key: CheckpointKey,
    *,
    page_rows: int = PAGE_ROWS,
    jobs: int = 1,
    now: datetime | None = None,
    total: Callable[[int], None] | None = None,
    progress: Callable[[int], None] | None = None,
    check: bool = True,
) -> dict[str, Any]:
    """Exports what ``f`` takes from ``store`` into ``directory`` as ``file_format``
    (``jsonl``, ``csv``, ``parquet``) and signs the manifest with ``key``; returns the manifest.

    ``jobs``: processes writing parts of the export in parallel (``observer.store.exportjobs``:
    files ``exchanges-001.jsonl``, ...; one: this process, plain names). ``total(n)`` is called
    once with the number of records to export, ``progress(n)`` with the records written since
    its last call. ``now``: the manifest's ``created_at`` (default: the
    clock). ``check``: recompute the chain over the range first (``observer.store.verify``,
    hashes only) and refuse with ``ExportRefused`` on a break. Raises ``ExportError`` (module docstring), ``OSError`` (writing),
    ``sqlalchemy.exc.SQLAlchemyError`` (reading); nothing is left in ``directory`` then."""
    if file_format not in FORMATS:
        raise ExportError(f"unknown format {file_format!r} (jsonl, csv, parquet)")
    if file_format == "parquet" and not parquet_available():
        raise ExportError("the parquet format needs pyarrow: pip install 'llm-stream-observer[parquet]'")
    if check:  # the chain over the range first: never sign tampered records (csv and parquet cannot show it)
        from observer.store.verify import verify

        report = verify(store, None, since=f.since, until=f.until)
        if not report.ok:
            raise ExportRefused(
                "the chain does not verify over the exported range, so nothing was exported (a signed export would"
                " vouch for the changed records): " + "; ".join(b.line() for b in report.breaks)
            )
    store_id = store.store_id()
    # (the store's own chain and the access log hold no records)
    all_writers = [w for w in store.writers() if w not in (store_id, access_writer(store_id))]
    unknown = sorted(set(f.writers) - set(all_writers))
    if unknown:
        raise ExportError(f"no writer {', '.join(unknown)} in this store")
    chains: dict[str, Item] = {}
    for writer in all_writers:
        checkpoint = store.last_checkpoint(writer)  # before the head: the head is then at or after it
        head_seq, head_hash = store.chain_head(writer)
        chains[writer] = {
            "writer_id": writer,
            "records": 0,
            "gaps": 0,
            "first_seq": None,
            "last_seq": None,
            "head": {"seq": head_seq, "record_hash": head_hash.hex()},
            "last_checkpoint": None
            if checkpoint is None
            else {**checkpoint, "created_at": rfc3339(checkpoint["created_at"])},
        }
    store_chain = _store_chain(store, store_id)  # with the heads: what explains a purged record's absence
    selected = [w for w in all_writers if not f.writers or w in f.writers]
    made = prepare_directory(directory)
    try:
        with store.engine.connect() as conn:
            reader = RecordReader(conn, page_rows)
            heads = {w: chains[w]["head"]["seq"] for w in selected}
            parts = plan(reader, f, heads, jobs)
            if total is not None:
                counts = [reader.count(f, w, heads[w]) for w in selected]
                total(sum(counts) + (0 if f.writers else reader.count(f, None)))
        try:
            results = run(store, f, file_format, directory, parts, page_rows, progress)
        except JobError as exc:
            raise ExportError(str(exc)) from None
        files = [entry for result in results for entry in result.files]
        for result in results:
            for writer, counts in result.writers.items():
                _add(chains[writer], counts)
        unchained = sum(result.unchained for result in results)
        manifest = _manifest(store_id, f, file_format, files, list(chains.values()), unchained, key, now)
        manifest["store_chain"] = store_chain
        data = encode(manifest)
        _write_new(directory / MANIFEST, data)
        _write_new(directory / SIGNATURE, sign(data, key))
        _fsync_dir(directory)
    except BaseException:
        _remove(directory, made)
        raise
    return manifest


def _add(chain: Item, counts: Item) -> None:
    """Adds a job's counts of a writer to its manifest entry (jobs come in order)."""
    chain["records"] += counts["records"]
    chain["gaps"] += counts["gaps"]
    if chain["first_seq"] is None:
        chain["first_seq"] = counts["first_seq"]
    if counts["last_seq"] is not None:
        chain["last_seq"] = counts["last_seq"]


def _store_chain(store: AuditStore, store_id: str) -> dict[str, Any]:
    """The store's own chain as the manifest carries it: every event (holds made and released,
    purges), every purged run (``[writer_id, first_seq, last_seq, last_hash, event_seq]``) and
    the chain's last signed checkpoint, so that ``export verify`` can check the purges that
    explain records missing from a writer's seqs, and recompute across them."""
    from observer.store.events import events as store_events
    from observer.store.models import PurgedRunRow

    runs = PurgedRunRow.__table__
    with store.engine.connect() as conn:
        events = store_events(conn)
        purged = conn.execute(
            select(runs.c.writer_id, runs.c.first_seq, runs.c.last_seq, runs.c.last_hash, runs.c.event_seq).order_by(
                runs.c.writer_id, runs.c.first_seq
            )
        ).all()
    checkpoint = store.last_checkpoint(store_id)
    return {
        "events": [{k: (rfc3339(v) if k == "at" else v) for k, v in e.items() if k != "created_at"} for e in events],
        "purged_runs": [list(r) for r in purged],
        "last_checkpoint": None
        if checkpoint is None
        else {**checkpoint, "created_at": rfc3339(checkpoint["created_at"])},
    }


def _manifest(
    store_id: str,
    f: RecordFilter,
    file_format: str,
    files: list[FileEntry],
    writers: list[Item],
    unchained: int,
    key: CheckpointKey,
    now: datetime | None,
) -> dict[str, Any]:
    chained = sum(w["records"] for w in writers)
    return {
        "format": FORMAT,
        "created_at": rfc3339(now or datetime.now(timezone.utc)),
        "store_id": store_id,
        "file_format": file_format,
        "filters": f.as_dict(),
        "order": ORDER,
        "files": [e.as_dict() for e in files],
        "totals": {
            "records": chained + unchained,
            "chained_records": chained,
            "unchained_records": unchained,
            "gaps": sum(w["gaps"] for w in writers),
        },
        "writers": writers,
        "signer": {"key_id": key.key_id, "public_key": public_pem(key.public)},
    }


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(directory: Path, made: bool) -> None:
    """Removes what an export that failed left: its files, and the folder if it made it."""
    for path in directory.iterdir():
        path.unlink(missing_ok=True)
    if made:
        directory.rmdir()


__all__ = ["ORDER", "ExportError", "RecordFilter", "check_directory", "export", "prepare_directory"]
