"""One capture file ingested: its flows replayed (``observer.ingest.replay``), each record given
its deterministic id and its provenance, and stored (``observer.ingest.writer``); the counts of
what became of every flow (``FileReport``).

A record's id is ``record_id``: a UUID 5, the same whenever the same flow is ingested again,
so that the store skips it (``AuditStore.write_many`` stores an id once). A dump's flow is named
by its mitmproxy flow id alone (a UUID 4 per flow, kept in the dump): a dump appended to later
(``mitmdump -w +FILE``) or saved again under another name gives its earlier flows the ids they
had, and a flow the proxy recorded live (``observer.capture.request.flow_record_id``) is not
stored again from a dump of the same run. A HAR entry has no id: it is named by the file's
SHA-256 and its index (so a HAR of flows recorded live adds copies).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from observer.capture.request import FLOW_NAMESPACE, flow_record_id
from observer.ingest.captures import DUMP, Capture, DamagedCapture, SavedFlow, read_flows
from observer.ingest.replay import Fate, Replay
from observer.ingest.writer import IngestWriter
from observer.records import Provenance, utc_from_epoch

#: The UUID 5 namespace of ingested records' ids (the live capture's, for a dump's flows).
INGEST_NAMESPACE = FLOW_NAMESPACE
#: ``Provenance.source`` of an ingested record.
SOURCE = "offline_ingest"
#: Warning lines per file and kind; past them a count says how many more.
WARNINGS_MAX = 20

_WHY = {
    Fate.NO_RESPONSE_BODY: (
        "an LLM exchange, but the file holds no response body (the proxy streamed it; mitmdump keeps"
        " streamed bodies with --set store_streamed_bodies=true): not recorded"
    ),
    Fate.NO_REQUEST_BODY: "an LLM exchange, but the file holds no request body (streamed by the proxy): not recorded",
    Fate.NO_RESPONSE: "an LLM exchange, but the file holds neither its response nor an error: not recorded",
    Fate.NO_REQUEST_TIME: "an LLM exchange without a request start time: not recorded",
}


def record_id(capture: Capture, flow_id: str) -> str:
    """The record id of flow ``flow_id`` of ``capture`` (module docstring)."""
    if capture.file_format == DUMP:
        return flow_record_id(flow_id)  # the id the live capture gave the same flow
    else:
        name = f"{capture.file_format}:{capture.sha256}:{flow_id}"
    return str(uuid.uuid5(INGEST_NAMESPACE, name))


@dataclass(slots=True)
class FileReport:
    """What became of a capture's flows: ``flows`` read (of any kind), records ``stored``,
    ``already_stored`` (ingested before: skipped), ``not_llm`` (not LLM traffic, as the addon
    decides live, or not HTTP), ``no_response_body`` / ``no_request_body`` / ``no_response``
    (LLM exchanges the file holds too little of: not recorded), ``unreadable`` (HAR entries or
    flows that cannot be read), ``refused`` (records the database refused), ``damaged`` (why the
    rest of a dump could not be read, or ``None``) and the warning lines (capped per kind)."""

    capture: Capture
    flows: int = 0
    stored: int = 0
    already_stored: int = 0
    not_llm: int = 0
    no_response_body: int = 0
    no_request_body: int = 0
    no_response: int = 0
    unreadable: int = 0
    refused: int = 0
    damaged: str | None = None
    warnings: list[str] = field(default_factory=list)
    _warned: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether everything in the file was read and every record it gave was stored."""
        return self.damaged is None and not self.unreadable and not self.refused

    def warn(self, kind: str, line: str) -> None:
        n = self._warned[kind] = self._warned.get(kind, 0) + 1
        if n <= WARNINGS_MAX:
            self.warnings.append(line)

    def summary(self) -> str:
        """One line: the counts, the ones that are 0 left out after the first three."""
        parts = [
            f"{self.stored} records stored",
            f"{self.already_stored} already stored",
            f"{self.not_llm} not LLM traffic",
        ]
        for n, what in (
            (self.no_response_body, "without a response body in the file"),
            (self.no_request_body, "without a request body in the file"),
            (self.no_response, "without a response in the file"),
            (self.unreadable, "unreadable"),
            (self.refused, "refused by the database"),
        ):
            if n:
                parts.append(f"{n} {what}")
        return f"{self.capture.path}: {self.flows} flows read: " + ", ".join(parts)

    def more(self) -> list[str]:
        """``... and N more`` lines for the kinds warned about more than ``WARNINGS_MAX`` times."""
        return [
            f"{self.capture.path}: ... and {n - WARNINGS_MAX} more {kind}"
            for kind, n in self._warned.items()
            if n > WARNINGS_MAX
        ]


def ingest_file(
    capture: Capture,
    replay: Replay,
    writer: IngestWriter,
    *,
    progress: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.time,
) -> FileReport:
    """Ingests ``capture``'s flows and stores its records (flushed before it returns);
    ``progress(n)``: ``n`` more bytes of the file done. Raises ``NotACapture`` for a dump whose
    first flow cannot be read, and the database's errors (``IngestWriter.flush``); a dump
    damaged later is ``report.damaged`` (what was read before is ingested)."""
    report = FileReport(capture)
    ingested_at = utc_from_epoch(clock())
    stored, duplicates, refused = writer.stored, writer.duplicates, len(writer.refused)
    done = 0
    try:
        for saved in read_flows(capture):
            report.flows += 1
            _one(saved, capture, replay, writer, report, ingested_at)
            if progress is not None and saved.offset_bytes > done:
                progress(saved.offset_bytes - done)
                done = saved.offset_bytes
    except DamagedCapture as exc:
        report.damaged = str(exc)
    writer.flush()
    report.stored = writer.stored - stored
    report.already_stored = writer.duplicates - duplicates
    report.refused = len(writer.refused) - refused
    if progress is not None and capture.size_bytes > done:
        progress(capture.size_bytes - done)
    return report


def _one(saved: SavedFlow, capture: Capture, replay: Replay, writer: IngestWriter, report: FileReport, at) -> None:
    where = f"{capture.path}: flow {saved.flow_id}"
    if saved.unreadable is not None:
        report.unreadable += 1
        report.warn("unreadable entries", f"{where}: cannot be read ({saved.unreadable}); skipped")
        return
    if saved.flow is None:  # a TCP, UDP or DNS flow: not HTTP, so not LLM traffic
        report.not_llm += 1
        return
    flow = saved.flow
    req = flow.request
    what = f"{where} ({req.method} {req.scheme}://{req.host}:{req.port}{req.path.partition('?')[0]})"  # (no query: credentials)
    try:
        result = replay.run(flow)
    except Exception as exc:  # noqa: BLE001 - a flow the replay cannot take: counted and said, the others go on
        report.unreadable += 1
        report.warn("unreadable flows", f"{what}: cannot be replayed ({type(exc).__name__}: {exc}); skipped")
        return
    if result.fate is Fate.RECORDED:
        record = result.record
        assert record is not None
        record.id = record_id(capture, saved.flow_id)
        record.provenance = Provenance(
            SOURCE, str(capture.path), capture.sha256, capture.file_format, saved.flow_id, at
        )
        writer.add(record)
    elif result.fate is Fate.NOT_LLM:
        report.not_llm += 1
    else:
        counter = {
            Fate.NO_RESPONSE_BODY: "no_response_body",
            Fate.NO_REQUEST_BODY: "no_request_body",
            Fate.NO_RESPONSE: "no_response",
            Fate.NO_REQUEST_TIME: "unreadable",
        }[result.fate]
        setattr(report, counter, getattr(report, counter) + 1)
        report.warn(f"flows {result.fate.value.replace('_', ' ')}", f"{what}: {_WHY[result.fate]}")


__all__ = ["INGEST_NAMESPACE", "SOURCE", "FileReport", "ingest_file", "record_id"]
