"""What a start makes of the journal a previous run left: read every segment, find the exchanges
that were still open when it stopped (an ``OPEN`` without its ``RECORD`` or ``FORGET``), and
rebuild each as a record from its journaled request facts and response bytes, parsed by the same
code as a live stream (``observer.capture.parsing``) and ended as ``EndCause.SHUTDOWN``: its
outcome is ``interrupted`` unless the bytes already held the stream's end (then the answer was
complete and only its record was not yet made: ``completed``). ``transport_error`` says it was
recovered; a ``CUT`` entry (bytes missing from the journal) adds an ``observer_error``.

A multi-turn stream (``observer.tap``) is cut into the same turns as live, with the same ids
(``observer.capture.turns``); a turn whose record is in the journal is not rebuilt, and the
store skips one it already holds. A later turn's request is the stream's (the request body's
later envelopes are not journaled).

A WebSocket turn (its dialect is a socket dialect: ``new_session``) was journaled as the
canonical events its messages gave (``observer.journal.turnlog``): they are applied to a fresh
reassembler, as live, and the turn ends as ``SHUTDOWN``.

Echoes of the request's credential values are scrubbed from a live record (the proxy keeps those
values in memory only, never on disk); a recovered record gets the credential-shaped redaction
only (``observer.redact.redact_record`` with no values).

Damage: a segment's reading stops at a torn or corrupt entry (``observer.journal.format``). A
torn end of the newest segment is the expected trace of a kill (logged at info); any other
damage is logged as an error and what follows it in that segment is not read (the drainer's seq
check records the records lost there as a gap).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from observer.capture.parsing import final_facts, open_observer
from observer.capture.turns import turn_skeleton
from observer.dialects.registry import DialectRegistry
from observer.journal import format as fmt
from observer.journal import turnlog
from observer.journal.journal import segment_name, segment_numbers
from observer.reassembly import EndCause, Reassembler
from observer.records import Exchange, Violation, ViolationKind, utc_from_epoch
from observer.redact import redact_record
from observer.response import ResponseFacts, ResponseSpec, StreamEnd, assemble
from observer.tap import feed_pending

log = logging.getLogger("observer.journal")

RECOVERED = (
    "the observer stopped before this exchange was recorded (kill, crash or power loss); recovered from its journal"
)


@dataclass(slots=True)
class Recovery:
    """``recover``'s result: ``max_seq`` (highest seq in the segments; 0 when none),
    ``records`` (the rebuilt records of the exchanges left open), ``damaged`` (one line per
    damaged segment), ``segments`` and ``entries`` read."""

    max_seq: int = 0
    records: list[Exchange] = field(default_factory=list)
    record_seqs: list[int] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    segments: int = 0
    entries: int = 0

    def records_after(self, seq: int) -> int:
        """How many journaled records are numbered after ``seq`` (not yet stored)."""
        return sum(1 for s in self.record_seqs if s > seq)


@dataclass(slots=True)
class _Open:
    entry: fmt.Entry
    data: list = field(default_factory=list)  # DATA entries
    cut: bool = False


def recover(directory: Path, registry: DialectRegistry) -> Recovery:
    """Reads the segments in ``directory`` (see the module docstring). Never raises on damaged
    content; ``OSError`` when a segment cannot be read. A segment deleted between listing and
    reading is skipped (only a running journal deletes one, after its records were stored)."""
    result = Recovery()
    opened: dict[str, _Open] = {}
    recorded: set[str] = set()  # ids of the records in the journal
    numbers = segment_numbers(directory)
    for i, number in enumerate(numbers):
        try:
            buf = (directory / segment_name(number)).read_bytes()
        except FileNotFoundError:
            # Listed, then deleted by the journal still running (``observer journal`` reading a
            # live folder): a segment is deleted only once its records are stored, and the open
            # exchanges in it were carried into a newer one, so nothing recovery needs is lost.
            log.info("journal: %s was deleted while being read", segment_name(number))
            continue
        result.segments += 1
        try:
            scan = fmt.read_entries(buf)
        except ValueError:
            result.damaged.append(f"{segment_name(number)}: not a journal segment")
            continue
        if scan.damage is not None:
            line = f"{segment_name(number)}: {scan.damage} entry at offset {scan.end} of {len(buf)}"
            if scan.damage is fmt.Damage.TORN and i == len(numbers) - 1:
                log.info("journal: %s (the last write before the stop was cut short)", line)
            else:
                log.error("journal: %s; the rest of this segment is not read", line)
                result.damaged.append(line)
        for e in scan.entries:
            result.entries += 1
            kind = e.kind
            if kind is fmt.Kind.RECORD or kind is fmt.Kind.GAP:
                result.max_seq = max(result.max_seq, e.seq)
                if kind is fmt.Kind.RECORD:
                    result.record_seqs.append(e.seq)
                    try:
                        record_id = fmt.loads(memoryview(e.body)[8:])["id"]
                        opened.pop(record_id, None)
                        recorded.add(record_id)
                    except (ValueError, KeyError, TypeError):
                        pass  # the drainer rejects it
                continue
            try:
                rid = e.record_id
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                result.damaged.append(f"{segment_name(number)}: unreadable {kind.name} entry at {e.offset}")
                continue
            if kind is fmt.Kind.OPEN:
                opened[rid] = _Open(e)  # a copy carried into a newer segment replaces the older
            elif kind is fmt.Kind.FORGET:
                opened.pop(rid, None)
            elif rid in opened:
                if kind is fmt.Kind.DATA:
                    opened[rid].data.append(e)
                else:
                    opened[rid].cut = True
    for rid, o in opened.items():
        records = _rebuild(o, registry)
        if records is None:
            result.damaged.append(f"open exchange {rid}: unreadable")
        else:
            result.records += [r for r in records if r.id not in recorded]
    return result


def _rebuild(o: _Open, registry: DialectRegistry) -> list[Exchange] | None:
    """The records of one open exchange: one, or a multi-turn stream's turns (module
    docstring); ``None`` when its entry cannot be read."""
    try:
        d = o.entry.json
        exchange = Exchange.from_dict(d["exchange"])
        spec = ResponseSpec.from_dict(d["spec"])
        violations = [Violation.from_dict(v) for v in d["violations"]]
    except (ValueError, KeyError, TypeError):
        log.error("journal: an open exchange's entry cannot be read", exc_info=True)
        return None
    if _is_socket(registry, spec.dialect):
        return [_record(exchange, violations, _socket_turn(o, spec, exchange))]
    obs = open_observer(registry, spec, "recovery")
    last_s = spec.started_at_s
    turns: list[tuple[int, ResponseFacts]] = []
    for e in o.data:
        try:
            pending = e.chunks()
        except ValueError:
            o.cut = True
            break
        if pending:
            last_s = max(last_s, pending[-1])
            feed_pending(obs, pending)
            turns += obs.take_turns()
    facts = final_facts(obs, StreamEnd(EndCause.SHUTDOWN, last_s, transport_error=RECOVERED))
    if facts is not None and o.cut:
        facts.violations.append(_not_journaled("response bytes"))
    if not turns:
        return [_record(exchange, violations, facts if facts is not None else ResponseFacts())]
    if facts is not None:
        turns.append((len(turns), facts))
    records, started = [], None
    for index, turn in turns:
        records.append(_record(turn_skeleton(exchange, index, started), violations, turn))
        started = turn.ended_at
    return records


def _is_socket(registry: DialectRegistry, name: str) -> bool:
    try:
        return getattr(registry.get(name), "new_session", None) is not None
    except KeyError:
        return False  # open_observer records the unknown dialect


def _socket_turn(o: _Open, spec: ResponseSpec, exchange: Exchange) -> ResponseFacts:
    """The facts of a WebSocket turn left open: its journaled events replayed (module docstring)."""
    request = exchange.request
    r = Reassembler(spec.tool_names, request.request_id, limits=spec.limits)
    last_s = spec.started_at_s
    for e in o.data:
        try:
            pending = e.chunks()
            for i in range(0, len(pending), 2):
                r.apply_items(turnlog.decode(pending[i]), pending[i + 1])
                last_s = max(last_s, pending[i + 1])
        except ValueError:
            o.cut = True
            break
    facts = ResponseFacts(transport_error=RECOVERED)
    r.finish(facts, EndCause.SHUTDOWN, request_start_s=spec.started_at_s)
    facts.ended_at = utc_from_epoch(last_s)
    if o.cut:
        facts.violations.append(_not_journaled("the turn's events"))
    return facts


def _not_journaled(what: str) -> Violation:
    """The ``observer_error`` of an exchange whose journal lost the rest of its ``what`` (a ``CUT``)."""
    return Violation(ViolationKind.OBSERVER_ERROR, None, f"recovery: {what} after those kept were not in the journal")


def _record(skeleton: Exchange, violations: list[Violation], facts: ResponseFacts) -> Exchange:
    record = assemble(skeleton, violations, facts)
    redact_record(record, [])
    return record


__all__ = ["RECOVERED", "Recovery", "recover"]
