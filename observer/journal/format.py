"""The journal's byte format: segment files of CRC-checked entries (pure: no I/O, no clock).

A segment is ``SEGMENT_MAGIC`` followed by entries. An entry is a 9-byte header (``<II``: body
length, CRC-32 of the body; then the kind byte, counted in the length) and its body::

    length u32 LE | crc32(kind + body) u32 LE | kind u8 | body

Kinds (``Kind``) and their bodies:

- ``OPEN``: an exchange whose response headers arrived. JSON ``{"id", "exchange", "spec",
  "violations"}``: the record skeleton (``Exchange.to_dict()``: HTTP and request facts, already
  redacted), the ``ResponseSpec`` its parse needs, and the request side's violations.
- ``DATA``: response bytes of an open exchange as they arrived: the record id (``u8`` length,
  UTF-8), then chunks ``arrival_s f64 LE | length u32 LE | bytes``.
- ``RECORD``: a finished record: ``seq u64 LE`` then the JSON of ``Exchange.to_dict()``.
- ``GAP``: records that were dropped before the journal: ``seq u64 LE`` then JSON ``{"first_at",
  "last_at", "dropped", "reason"}`` (RFC 3339 times).
- ``FORGET``: the id (as in ``DATA``) of an opened exchange whose record was dropped (counted in
  a gap): recovery must not make it an interrupted record too.
- ``CUT``: the id (as in ``DATA``) of an open exchange whose later response bytes are not in the
  journal (its per-flow cap, or the journal fell behind): recovery says so on the record.

``seq`` numbers a writer's records and gaps from 1 without holes: a hole the reader finds is
itself evidence of loss. JSON is ``orjson`` where it can encode the value and the standard
library's ASCII-only encoding where it cannot (lone surrogates, integers beyond 64 bits), so any
record that exists can be journaled; both read back with ``loads``.

A reader stops at the first entry that is incomplete (a torn write: the process died in the
middle) or whose CRC does not match (``EntryReader`` tells the two apart), never guessing past it.
"""

from __future__ import annotations

import enum
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from observer.jsontext import dumps, loads

#: First bytes of every segment file.
SEGMENT_MAGIC = b"OBSJRNL1"
#: ``length, crc`` of an entry.
HEADER = struct.Struct("<II")
#: Largest entry body accepted on read (a corrupt length must not make the reader allocate 4 GiB).
MAX_ENTRY_BYTES = 256 << 20
#: Longest record id a ``DATA``/``FORGET``/``CUT`` entry carries (UTF-8 bytes).
MAX_ID_BYTES = 255

_SEQ = struct.Struct("<Q")
_CHUNK = struct.Struct("<dI")


class Kind(enum.IntEnum):
    OPEN = ord("O")
    DATA = ord("D")
    RECORD = ord("R")
    GAP = ord("G")
    FORGET = ord("F")
    CUT = ord("C")


def entry(kind: Kind, *body: bytes) -> bytes:
    """One framed entry of the concatenated ``body`` parts (joined once, with the header)."""
    kind_byte = _KIND_BYTES[kind]
    crc = zlib.crc32(kind_byte)
    length = 1
    for part in body:
        crc = zlib.crc32(part, crc)
        length += len(part)
    return b"".join((HEADER.pack(length, crc), kind_byte, *body))


_KIND_BYTES = {k: bytes((k,)) for k in Kind}


def open_entry(record_id: str, exchange: dict[str, Any], spec: dict[str, Any], violations: list[Any]) -> bytes:
    return entry(Kind.OPEN, dumps({"id": record_id, "exchange": exchange, "spec": spec, "violations": violations}))


def data_entry(record_id: str, pending: list) -> bytes:
    """``pending`` = ``[chunk, arrival_s, chunk, arrival_s, ...]`` (the tap's list)."""
    parts = [_id_bytes(record_id)]
    for i in range(0, len(pending) - 1, 2):
        chunk = pending[i]
        parts.append(_CHUNK.pack(pending[i + 1], len(chunk)))
        parts.append(chunk)
    return entry(Kind.DATA, b"".join(parts))


def record_entry(seq: int, record_json: bytes) -> bytes:
    return entry(Kind.RECORD, _SEQ.pack(seq), record_json)


def gap_entry(seq: int, gap: dict[str, Any]) -> bytes:
    return entry(Kind.GAP, _SEQ.pack(seq), dumps(gap))


def forget_entry(record_id: str) -> bytes:
    return entry(Kind.FORGET, _id_bytes(record_id))


def cut_entry(record_id: str) -> bytes:
    return entry(Kind.CUT, _id_bytes(record_id))


def _id_bytes(record_id: str) -> bytes:
    raw = record_id.encode("utf-8", "surrogatepass")
    if not 1 <= len(raw) <= MAX_ID_BYTES:
        raise ValueError(f"a record id has 1..{MAX_ID_BYTES} bytes, not {len(raw)}")
    return bytes((len(raw),)) + raw


def _id_end(body: bytes) -> int:
    return 1 + body[0]


# ----- reading -----


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry read back: its ``kind``, ``body`` (after the kind byte), and where it lies in
    its segment (``offset`` of its header, ``size`` in bytes with the header)."""

    kind: Kind
    body: bytes
    offset: int
    size: int

    @property
    def seq(self) -> int:
        """``RECORD``/``GAP``: the writer's sequence number."""
        return _SEQ.unpack_from(self.body)[0]

    @property
    def json(self) -> Any:
        """``OPEN``: the object; ``RECORD``/``GAP``: the object after the seq."""
        return loads(memoryview(self.body)[8:] if self.kind in (Kind.RECORD, Kind.GAP) else self.body)

    @property
    def record_id(self) -> str:
        """``DATA``/``FORGET``/``CUT``: the record id; ``OPEN``: read from the JSON."""
        if self.kind in (Kind.DATA, Kind.FORGET, Kind.CUT):
            return self.body[1 : _id_end(self.body)].decode("utf-8", "surrogatepass")
        return self.json["id"]

    def chunks(self) -> list:
        """``DATA``: ``[chunk, arrival_s, ...]`` as ``data_entry`` was given them. Raises
        ``ValueError`` on a body that does not split into whole chunks."""
        body = self.body
        out: list = []
        pos = _id_end(body)
        end = len(body)
        while pos < end:
            if pos + _CHUNK.size > end:
                raise ValueError("a data entry ends inside a chunk header")
            arrival_s, n = _CHUNK.unpack_from(body, pos)
            pos += _CHUNK.size
            if pos + n > end:
                raise ValueError("a data entry ends inside a chunk")
            out.append(body[pos : pos + n])
            out.append(arrival_s)
            pos += n
        return out


class Damage(enum.StrEnum):
    """Why reading a segment stopped before its end."""

    TORN = "torn"  # the last entry is incomplete: a write cut short (the process died)
    CORRUPT = "corrupt"  # an entry's CRC or kind is wrong, or its length is impossible


@dataclass(frozen=True, slots=True)
class Scan:
    """``read_entries``'s result: the entries, the offset after the last good one (``end``),
    and ``damage`` when it stopped early (``None``: the whole buffer was read)."""

    entries: list[Entry]
    end: int
    damage: Damage | None


def read_entries(buf: bytes, start: int = 0, *, final: bool = True) -> Scan:
    """The entries of the segment bytes ``buf`` (the whole file) from ``start``
    (``len(SEGMENT_MAGIC)`` or the offset after an earlier entry). ``final``: ``buf`` is all
    there is (an incomplete entry at its end is ``TORN``); otherwise an incomplete entry is
    simply not returned yet. Never raises on damaged bytes; raises ``ValueError`` when ``buf``
    does not start with ``SEGMENT_MAGIC``."""
    if not buf.startswith(SEGMENT_MAGIC):
        raise ValueError("not a journal segment (bad magic)")
    return read_run(buf, 0, max(start, len(SEGMENT_MAGIC)), final=final)


def read_run(buf: bytes, base: int, pos: int = 0, *, final: bool = True) -> Scan:
    """The entries of ``buf``, the bytes of a segment from its offset ``base``, starting at
    ``buf[pos]`` (an entry's first byte); offsets in the result are the segment's. As
    ``read_entries`` otherwise."""
    end = len(buf)
    out: list[Entry] = []
    while pos < end:
        if pos + HEADER.size > end:
            return Scan(out, base + pos, Damage.TORN if final else None)
        length, crc = HEADER.unpack_from(buf, pos)
        if not 1 <= length <= MAX_ENTRY_BYTES:
            return Scan(out, base + pos, Damage.CORRUPT)
        stop = pos + HEADER.size + length
        if stop > end:
            return Scan(out, base + pos, Damage.TORN if final else None)
        framed = buf[pos + HEADER.size : stop]
        if zlib.crc32(framed) != crc:
            return Scan(out, base + pos, Damage.CORRUPT)
        try:
            kind = Kind(framed[0])
        except ValueError:
            return Scan(out, base + pos, Damage.CORRUPT)
        out.append(Entry(kind, framed[1:], base + pos, stop - pos))
        pos = stop
    return Scan(out, base + pos, None)


def needed_bytes(buf: bytes, pos: int = 0) -> int:
    """Bytes from ``buf[pos]`` the entry starting there needs (its header's length; the header's
    size while fewer bytes than a header are there)."""
    if len(buf) - pos < HEADER.size:
        return HEADER.size
    return HEADER.size + HEADER.unpack_from(buf, pos)[0]


__all__ = [
    "HEADER",
    "MAX_ID_BYTES",
    "SEGMENT_MAGIC",
    "Damage",
    "Entry",
    "Kind",
    "Scan",
    "cut_entry",
    "data_entry",
    "dumps",
    "entry",
    "forget_entry",
    "gap_entry",
    "loads",
    "needed_bytes",
    "open_entry",
    "read_entries",
    "read_run",
    "record_entry",
]
