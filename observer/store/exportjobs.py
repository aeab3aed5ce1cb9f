"""The work of an export as jobs: contiguous parts of its order (``observer.store.export``),
each written into its own files, in this process (one job) or in one process per job.

An export is bound by one core (reading rows and encoding records is Python work under one
GIL), so ``jobs`` > 1 runs parts in parallel processes (``multiprocessing``, spawned: nothing
of this process is inherited). ``plan`` cuts the export's order (writers by id, each writer's
seqs, then the rows without a writer) into ``jobs`` parts of about as many records each, at
record boundaries (``RecordReader.seq_at``); part ``k`` of ``n`` writes ``exchanges-00k.jsonl``
(and so on), one job alone the plain names. Concatenated in order, the parts are exactly the
export of one job: the manifest lists them in that order and ``observer export verify`` reads
them as one stream (a chain that crosses a part boundary is recomputed across it). Each part
keeps its own memory flat, so the whole export takes ``jobs`` times one's.

A failed job stops the others; the export then fails as a whole (its folder is emptied by
``export``). A child's error comes back as ``ExportError`` (an ``OSError`` as one with its
errno: a full disk is a full disk).
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from observer.store.exportfiles import FORMATS, FileEntry
from observer.store.reader import RecordFilter, RecordReader
from observer.store.store import AuditStore

Item = dict[str, Any]
#: Seconds between looks at the children while none reports.
POLL_S = 1.0


class JobError(Exception):
    """A job in another process failed (``export`` turns it into an ``ExportError``)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """A writer's seqs ``first_seq``..``last_seq`` in one job; ``span``: the seq span of its
    records in the time range (``RecordReader.seq_span``), ``None`` when it has none."""

    writer_id: str
    first_seq: int
    last_seq: int
    span: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class Job:
    """Part ``index`` (from 0): its segments in order, and whether the rows without a writer
    (always the last part's) are in it."""

    index: int
    segments: tuple[Segment, ...]
    unchained: bool


@dataclass(slots=True)
class JobResult:
    """What a job wrote: its files, per writer ``{records, gaps, first_seq, last_seq}``, and
    how many rows without a writer."""

    files: list[FileEntry]
    writers: dict[str, Item] = field(default_factory=dict)
    unchained: int = 0


def plan(reader: RecordReader, f: RecordFilter, heads: dict[str, int], jobs: int) -> list[Job]:
    """The export of ``f`` up to each writer's head seq (``heads``, in the export's order) as at
    most ``jobs`` parts of about as many records each (one part: no counting)."""
    spans = {w: reader.seq_span(f, w, head) for w, head in heads.items()}
    writers = [w for w, head in heads.items() if head > 0]
    if jobs <= 1:
        return [Job(0, tuple(Segment(w, 1, heads[w], spans[w]) for w in writers), not f.writers)]
    counts = {w: reader.count(f, w, heads[w]) for w in writers}
    total = sum(counts.values()) + (0 if f.writers else reader.count(f, None))
    target = max(1, -(-total // jobs))
    parts: list[list[Segment]] = [[]]
    filled = 0
    for w in writers:
        first, done, n = 1, 0, counts[w]
        while len(parts) < jobs and filled + (n - done) > target:
            take = target - filled
            if take > 0:
                cut = reader.seq_at(f, w, heads[w], done + take - 1)
                parts[-1].append(Segment(w, first, cut, spans[w]))
                first, done = cut + 1, done + take
            parts.append([])
            filled = 0
        parts[-1].append(Segment(w, first, heads[w], spans[w]))
        filled += n - done
    return [Job(i, tuple(s), i == len(parts) - 1 and not f.writers) for i, s in enumerate(parts)]


def run(
    store: AuditStore,
    f: RecordFilter,
    file_format: str,
    directory: Path,
    jobs: list[Job],
    page_rows: int,
    progress: Callable[[int], None] | None,
) -> list[JobResult]:
    """Runs the jobs (one: here; more: a process each); their results in order. Raises what
    one job raised (here), ``JobError`` (another process), ``OSError``."""
    if len(jobs) == 1:
        return [run_job(store, f, file_format, directory, jobs[0], "", page_rows, progress)]
    url = store.engine.url.render_as_string(hide_password=False)
    ctx = multiprocessing.get_context("spawn")
    messages = ctx.Queue()
    procs = [
        ctx.Process(
            target=_child,
            args=(messages, url, f, file_format, str(directory), job, f"-{job.index + 1:03d}", page_rows),
            name=f"observer-export-{job.index + 1}",
            daemon=True,
        )
        for job in jobs
    ]
    results: dict[int, JobResult] = {}
    try:
        for proc in procs:
            proc.start()
        while len(results) < len(procs):
            try:
                message = messages.get(timeout=POLL_S)
            except queue.Empty:
                for i, proc in enumerate(procs):
                    if i not in results and not proc.is_alive() and messages.empty():
                        raise JobError(
                            f"export job {i + 1} ended without a result (exit code {proc.exitcode})"
                        ) from None
                continue
            if message[0] == "progress":
                if progress is not None:
                    progress(message[1])
            elif message[0] == "done":
                results[message[1]] = message[2]
            else:
                _, index, kind, errno, text = message
                if errno is not None:
                    raise OSError(errno, text)
                raise JobError(text if kind == "ExportError" else f"export job {index + 1}: {kind}: {text}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
        messages.close()
    return [results[i] for i in range(len(procs))]


def run_job(
    store: AuditStore,
    f: RecordFilter,
    file_format: str,
    directory: Path,
    job: Job,
    suffix: str,
    page_rows: int,
    progress: Callable[[int], None] | None,
) -> JobResult:
    """Writes one job's part into ``directory`` (its files named with ``suffix``); its files
    are removed if it fails."""
    out = FORMATS[file_format](directory, suffix)  # type: ignore[call-arg]
    result = JobResult([])
    try:
        with store.engine.connect() as conn:
            reader = RecordReader(conn, page_rows)
            for segment in job.segments:
                counts = result.writers.setdefault(
                    segment.writer_id, {"records": 0, "gaps": 0, "first_seq": None, "last_seq": None}
                )
                for page in _segment_pages(reader, f, segment, page_rows):
                    out.write(page)
                    gaps = _count(counts, page)
                    if progress is not None:
                        progress(len(page) - gaps)
            for page in reader.unchained(f) if job.unchained else ():
                out.write(page)
                result.unchained += len(page)
                if progress is not None:
                    progress(len(page))
        result.files = out.close()
    except BaseException:
        out.abort()
        for name in out.names():
            (directory / name).unlink(missing_ok=True)
        raise
    return result


def _child(
    messages: Any,
    url: str,
    f: RecordFilter,
    file_format: str,
    directory: str,
    job: Job,
    suffix: str,
    page_rows: int,
) -> None:
    """A job's process: its result, or its error (type, errno, text), on ``messages``."""
    try:
        store = AuditStore(url)
        try:
            result = run_job(
                store, f, file_format, Path(directory), job, suffix, page_rows, lambda n: messages.put(("progress", n))
            )
        finally:
            store.dispose()
        messages.put(("done", job.index, result))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent, which raises it
        errno = exc.errno if isinstance(exc, OSError) else None
        messages.put(("error", job.index, type(exc).__name__, errno, error_text(exc)))


def error_text(exc: BaseException) -> str:
    """One line for a job's error: an ``OSError``'s reason; for a database error the driver's
    first line (SQLAlchemy's text adds the statement, its parameters and a link)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _segment_pages(reader: RecordReader, f: RecordFilter, segment: Segment, page_rows: int) -> Iterator[list[Item]]:
    """The segment's records and gaps (``observer.store.export``'s rules), merged by seq."""
    w, span = segment.writer_id, segment.span
    records: Iterator[list[Item]] = iter(())
    if span is not None:
        lo, hi = max(segment.first_seq, span[0]), min(segment.last_seq, span[1])
        if lo <= hi:
            records = reader.chained(f, w, lo, hi)
    gaps = reader.gaps(w, segment.last_seq, span, f.since, f.until, first_seq=segment.first_seq)
    return merge(records, gaps, page_rows)


def _count(counts: Item, page: list[Item]) -> int:
    """Adds the page to a writer's counts; the number of gaps in it."""
    gaps = sum(1 for item in page if item["kind"] == "gap")
    counts["gaps"] += gaps
    counts["records"] += len(page) - gaps
    if counts["first_seq"] is None:
        counts["first_seq"] = page[0]["seq"]
    last = page[-1]
    counts["last_seq"] = last["seq_end"] if last["kind"] == "gap" else last["seq"]
    return gaps


def merge(records: Iterator[list[Item]], gap_pages: Iterator[list[Item]], page_rows: int) -> Iterator[list[Item]]:
    """Record pages and gap pages (each in seq order) as pages in seq order; a record page
    that no gap falls into passes as it is."""
    gaps = (g for page in gap_pages for g in page)
    gap = next(gaps, None)
    for page in records:
        if gap is None or gap["seq"] > page[-1]["seq"]:
            yield page
            continue
        merged: list[Item] = []
        for record in page:
            while gap is not None and gap["seq"] < record["seq"]:
                merged.append(gap)
                gap = next(gaps, None)
            merged.append(record)
        yield merged
    rest: list[Item] = []
    while gap is not None:
        rest.append(gap)
        if len(rest) == page_rows:
            yield rest
            rest = []
        gap = next(gaps, None)
    if rest:
        yield rest


__all__ = ["Job", "JobError", "JobResult", "Segment", "merge", "plan", "run", "run_job"]
