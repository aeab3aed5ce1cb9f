"""A bounded, schema-less protobuf wire-format walker, and per-endpoint field maps.

Reads protobuf messages without their ``.proto``: for the Connect/gRPC payloads of endpoints
whose schema is private (Cursor, Windsurf: field paths from public reverse-engineering, reference
§5.2, §6) and for unknown endpoints (the printable strings found: :func:`strings`). No I/O, no
globals; malformed input never raises: what parsed is returned with the reason it stopped.

Sources: protobuf.dev "Encoding" (the wire format: "Base 128 Varints", "Message Structure",
wire types ``VARINT`` 0, ``I64`` 1, ``LEN`` 2, ``SGROUP`` 3, ``EGROUP`` 4, ``I32`` 5, "Packed
Repeated Fields", "Signed Integers" (ZigZag), field numbers 1 .. 2^29 - 1); protobuf.dev
"Language Guide (proto 3)" (parsers accept packed and unpacked repeated scalars alike); the project
reference ``binary-formats.md`` §7.

Shapes and units
----------------
- :class:`Field`: ``path`` (dotted field numbers from the top message, ``"1.14.2"``),
  ``number``, ``wire_type`` (0, 1, 2, 5), ``value`` and, for ``LEN``, ``raw`` (its bytes). The
  ``value`` is an ``int`` for ``VARINT`` (unsigned, < 2^64), ``I64`` and ``I32`` (unsigned,
  little-endian as on the wire); for ``LEN`` one of (``kind``):
  ``"message"`` a ``tuple[Field, ...]``, ``"string"`` a ``str``, ``"bytes"`` the ``bytes``.
- :func:`walk` returns ``WalkResult(fields, error)``: the fields parsed in wire order and
  ``None``, or the fields parsed before the first malformed one and the reason (byte offsets
  count from the start of ``data``).

Reading a ``LEN`` payload (the ambiguity, §7): a string, bytes, a nested message and a packed
repeated field look alike. Without a field map:

1. valid UTF-8 with no control character (C0 except TAB, LF, CR; DEL; C1) -> ``"string"``
   (also the empty payload);
2. else, if the depth allows, a nested ``"message"`` when it parses *exactly*: every key has a
   field number >= 1 and a wire type in {0, 1, 2, 5}, and the last field ends on the last byte;
3. else ``"bytes"`` (packed repeated scalars land here: :func:`packed_varints` reads them).

Rule 1 comes before rule 2 (the reference lists message first): short text such as ``" the"``
(``20 74 68 65``) or ``"hi"`` is also a valid message (``{4: 116, 13: 101}``), and LLM text
deltas are exactly such short strings; a real message is rarely free of control bytes (keys of
fields 1-3 and lengths or values under 32 are control bytes). The verified cases stay as the
reference has them: ``"\\n\\x02hi"`` reads as the message ``{1: "hi"}`` (``\\x02`` is a control
byte), a varint-only submessage such as ``{1: 120, 2: 6}`` (``08 78 10 06``) as a message.
A field map (:class:`FieldMap`) removes the guessing where the schema is known.

Malformed input (the walk stops; the reason names the byte): a truncated key, varint, fixed
value or length; a varint longer than 10 bytes, or a 10-byte one above 2^64 - 1; field number
0 or above 2^29 - 1; wire types 3 and 4 (groups: deprecated, not read) and 6, 7 (undefined).

Bounds: ``max_depth`` (default 8, the top message is depth 1) caps nesting; ``max_fields``
(default 100 000) caps the keys decoded in one call, trial parses of ``LEN`` payloads included,
so the work is at most ``max_fields`` fields and ``O(len(data) * max_depth)`` byte steps.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from observer.wire.frames import nbytes

__all__ = [
    "I32",
    "I64",
    "LEN",
    "VARINT",
    "Extracted",
    "Field",
    "FieldMap",
    "WalkResult",
    "fields_at",
    "flatten",
    "packed_varints",
    "strings",
    "walk",
    "zigzag",
]

VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_FIELD_NUMBER = (1 << 29) - 1
DEFAULT_MAX_DEPTH = 8
DEFAULT_MAX_FIELDS = 100_000
_WIRE_NAMES = {VARINT: "VARINT", I64: "I64", LEN: "LEN", SGROUP: "SGROUP", EGROUP: "EGROUP", I32: "I32"}
_U64 = (1 << 64) - 1
# Not "printable": C0 controls except TAB, LF, CR; DEL; C1 controls.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class Field:
    """One field as on the wire (module docstring: shapes)."""

    path: str
    number: int
    wire_type: int
    value: int | str | bytes | tuple[Field, ...]
    raw: bytes | None = None

    @property
    def kind(self) -> str:
        """``"varint"``, ``"i64"``, ``"i32"``, or for ``LEN``: ``"message"``, ``"string"``,
        ``"bytes"``."""
        if self.wire_type != LEN:
            return {VARINT: "varint", I64: "i64", I32: "i32"}[self.wire_type]
        if isinstance(self.value, tuple):
            return "message"
        return "string" if isinstance(self.value, str) else "bytes"


class WalkResult(NamedTuple):
    """What parsed (``fields``) and why the walk stopped early (``error``; ``None``: it did not)."""

    fields: list[Field]
    error: str | None


class _Malformed(Exception):
    """Internal: why the bytes at hand are not a message (never leaves this module)."""


class _Budget:
    """Keys still to decode in one call (shared by the recursion; local to the call)."""

    __slots__ = ("left", "limit", "hit")

    def __init__(self, limit: int) -> None:
        self.left = limit
        self.limit = limit
        self.hit = False  # the limit stopped a parse (a trial's included)

    def reason(self) -> str:
        return f"stopped after {self.limit} fields (max_fields)"


def _check_limits(max_depth: int, max_fields: int) -> None:
    for name, v in (("max_depth", max_depth), ("max_fields", max_fields)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def _varint(data: bytes, i: int, n: int) -> tuple[int, int]:
    """The varint at ``data[i]`` and the offset after it; raises ``_Malformed``."""
    if i < n:
        b = data[i]
        if b < 0x80:
            return b, i + 1
    start = i
    value = 0
    shift = 0
    while True:
        if i >= n:
            raise _Malformed(f"truncated varint at byte {start}")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > _U64:
                raise _Malformed(f"varint at byte {start} overflows 64 bits")
            return value, i
        shift += 7
        if shift >= 70:
            raise _Malformed(f"varint at byte {start} is longer than 10 bytes")


def _text(payload: bytes) -> str | None:
    """``payload`` as text when it is valid UTF-8 with no control character, else ``None``."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _CONTROL.search(text) else text


def _parse(
    data: bytes, prefix: str, depth: int, max_depth: int, budget: _Budget, classify: bool
) -> tuple[list[Field], str | None]:
    """The fields of ``data`` as one message at ``depth``; ``classify`` reads ``LEN`` payloads
    (module docstring), else leaves them as bytes."""
    fields: list[Field] = []
    i = 0
    n = len(data)
    sep = prefix + "." if prefix else ""
    try:
        while i < n:
            if budget.left <= 0:
                budget.hit = True
                return fields, budget.reason()
            budget.left -= 1
            at = i
            key, i = _varint(data, i, n)
            number = key >> 3
            wt = key & 7
            if number == 0:
                raise _Malformed(f"field number 0 at byte {at}")
            if number > MAX_FIELD_NUMBER:
                raise _Malformed(f"field number {number} at byte {at} exceeds 2^29 - 1")
            path = sep + str(number)
            if wt == VARINT:
                value, i = _varint(data, i, n)
                fields.append(Field(path, number, VARINT, value))
            elif wt == LEN:
                length, j = _varint(data, i, n)
                if length > n - j:
                    raise _Malformed(
                        f"length {length} of field {number} at byte {at} runs past the end ({nbytes(n - j)} left)"
                    )
                raw = data[j : j + length]
                i = j + length
                value = _classify(raw, path, depth, max_depth, budget) if classify else raw
                fields.append(Field(path, number, LEN, value, raw))
                if budget.hit:  # the limit cut a trial parse short: the reading above may be off
                    return fields, budget.reason()
            elif wt == I64 or wt == I32:
                size = 8 if wt == I64 else 4
                if n - i < size:
                    raise _Malformed(f"truncated {size}-byte value of field {number} at byte {at}")
                fields.append(Field(path, number, wt, int.from_bytes(data[i : i + size], "little")))
                i += size
            elif wt == SGROUP or wt == EGROUP:
                raise _Malformed(f"group wire type {wt} ({_WIRE_NAMES[wt]}, deprecated) of field {number} at byte {at}")
            else:
                raise _Malformed(f"invalid wire type {wt} of field {number} at byte {at}")
    except _Malformed as exc:
        return fields, str(exc)
    return fields, None


def _classify(raw: bytes, path: str, depth: int, max_depth: int, budget: _Budget) -> str | bytes | tuple[Field, ...]:
    text = _text(raw)
    if text is not None:
        return text
    if depth < max_depth:
        sub, err = _parse(raw, path, depth + 1, max_depth, budget, True)
        if err is None and sub:
            return tuple(sub)
    return raw


def walk(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH, max_fields: int = DEFAULT_MAX_FIELDS) -> WalkResult:
    """The fields of ``data`` read as one protobuf message, ``LEN`` payloads read by the module's
    rules down to ``max_depth``; the walk stops at the first malformed field (``error``) or after
    ``max_fields`` keys. Raises ``ValueError`` only for a bound that is not a positive int."""
    _check_limits(max_depth, max_fields)
    fields, error = _parse(bytes(data), "", 1, max_depth, _Budget(max_fields), True)
    return WalkResult(fields, error)


def flatten(fields: list[Field] | tuple[Field, ...]) -> list[tuple[str, int | str | bytes]]:
    """``(path, value)`` for every leaf field in wire order (a nested message is replaced by its
    fields), e.g. for logs: ``[("1.1.1", "Hello"), ("1.14.1", 120)]``."""
    out: list[tuple[str, int | str | bytes]] = []
    for f in fields:
        if isinstance(f.value, tuple):
            out += flatten(f.value)
        else:
            out.append((f.path, f.value))
    return out


def strings(
    data: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH, max_fields: int = DEFAULT_MAX_FIELDS, min_chars: int = 1
) -> list[str]:
    """The printable strings (``kind == "string"``) of at least ``min_chars`` characters in
    ``data``, in wire order (those before a malformed field, if any): what a record of an endpoint
    without a field map holds."""
    fields, _ = walk(data, max_depth, max_fields)
    return [v for _, v in flatten(fields) if isinstance(v, str) and len(v) >= min_chars]


def _path_numbers(path: str) -> list[int]:
    try:
        numbers = [int(p) for p in path.split(".")]
    except ValueError:
        raise ValueError(f"a field path is dotted field numbers, got {path!r}") from None
    if any(not 1 <= n <= MAX_FIELD_NUMBER for n in numbers) or not all(p.isdigit() for p in path.split(".")):
        raise ValueError(f"a field path is dotted field numbers, got {path!r}")
    return numbers


def fields_at(
    data: bytes, path: str, *, max_depth: int = DEFAULT_MAX_DEPTH, max_fields: int = DEFAULT_MAX_FIELDS
) -> WalkResult:
    """Every field at ``path`` (``"1.14.1"``; repeated fields and repeated parents give several),
    in wire order. Each step above the last reads its ``LEN`` fields as messages whatever the
    heuristics would say (the path says they are); the fields found are read by the module's
    rules below them. ``error``: the first reason a message on the way did not parse (its path
    and byte), with what parsed kept. Raises ``ValueError`` for a malformed ``path``."""
    _check_limits(max_depth, max_fields)
    numbers = _path_numbers(path)
    budget = _Budget(max_fields)
    level: list[tuple[str, bytes]] = [("", bytes(data))]
    error: str | None = None
    found: list[Field] = []
    for k, number in enumerate(numbers):
        last = k == len(numbers) - 1
        nxt: list[tuple[str, bytes]] = []
        for prefix, buf in level:
            fields, err = _parse(buf, prefix, k + 1, max_depth, budget, False)
            if err is not None and error is None:
                error = f"{prefix or 'top level'}: {err}"
            for f in fields:
                if f.number != number:
                    continue
                if last:
                    if f.wire_type == LEN:
                        assert f.raw is not None
                        f = Field(f.path, f.number, LEN, _classify(f.raw, f.path, k + 1, max_depth, budget), f.raw)
                    found.append(f)
                elif f.wire_type == LEN:
                    nxt.append((f.path, f.value))  # type: ignore[arg-type]
        level = nxt
    return WalkResult(found, error)


def packed_varints(raw: bytes) -> tuple[list[int], str | None]:
    """The varints of a packed repeated field's payload, and the reason decoding stopped
    (``None``: all of it was read)."""
    out: list[int] = []
    i = 0
    n = len(raw)
    try:
        while i < n:
            v, i = _varint(raw, i, n)
            out.append(v)
    except _Malformed as exc:
        return out, str(exc)
    return out, None


def zigzag(value: int) -> int:
    """ZigZag-decodes a ``sint32``/``sint64`` varint (protobuf "Signed Integers")."""
    return (value >> 1) ^ -(value & 1)


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


_VARINT_TYPES = {
    "uint64": lambda v: v,
    "uint32": lambda v: v & 0xFFFFFFFF,
    "int64": lambda v: _signed(v, 64),
    "int32": lambda v: _signed(v, 32),
    "enum": lambda v: _signed(v, 32),
    "sint64": zigzag,
    "sint32": lambda v: _signed(zigzag(v), 32),
    "bool": lambda v: v != 0,
}
_I32_TYPES = {
    "fixed32": lambda v: v,
    "sfixed32": lambda v: _signed(v, 32),
    "float": lambda v: struct.unpack("<f", v.to_bytes(4, "little"))[0],
}
_I64_TYPES = {
    "fixed64": lambda v: v,
    "sfixed64": lambda v: _signed(v, 64),
    "double": lambda v: struct.unpack("<d", v.to_bytes(8, "little"))[0],
}
_LEN_TYPES = frozenset({"string", "bytes", "message"})
TYPES = frozenset(_VARINT_TYPES) | frozenset(_I32_TYPES) | frozenset(_I64_TYPES) | _LEN_TYPES


class Extracted(NamedTuple):
    """What a :class:`FieldMap` found: ``values`` (name -> values in wire order; a singular
    field's value is the last one, protobuf's "last one wins") and ``errors`` (why a message on
    the way did not parse, or a field's wire type did not fit its map entry)."""

    values: dict[str, list]
    errors: list[str]


class _Node:
    __slots__ = ("entry", "children")

    def __init__(self) -> None:
        self.entry: tuple[str, str | FieldMap] | None = None
        self.children: dict[int, _Node] = {}


class FieldMap:
    """Dotted field paths of one message type mapped to ``(name, type)``: the fields an audit
    record needs from an endpoint whose schema is known (reference §5.2, §6).

    ``type`` is a protobuf scalar type name (``string``, ``bytes``, ``uint64``, ``uint32``,
    ``int64``, ``int32``, ``sint64``, ``sint32``, ``bool``, ``enum``, ``fixed64``, ``fixed32``,
    ``sfixed64``, ``sfixed32``, ``double``, ``float``), ``message`` (its raw bytes: presence), or a
    nested ``FieldMap``, whose :meth:`extract` values (a dict per occurrence) become the values:
    repeated submessages keep their fields together, e.g. Windsurf's tool call ``6.{1 id, 2 name,
    3 arguments_json}``. The steps of a path are read as messages whatever the heuristics say;
    numeric types also accept the packed (``LEN``) encoding. Raises ``ValueError`` for a
    malformed path or an unknown type.

    Example (Cursor ``AgentServerMessage``)::

        FieldMap({"1.1.1": ("text", "string"), "1.14": ("turn_ended", "message"),
                  "1.14.1": ("input_tokens", "uint64"), "1.14.2": ("output_tokens", "uint64")})
    """

    __slots__ = ("_root", "_names")

    def __init__(self, entries: Mapping[str, tuple[str, str | FieldMap]]) -> None:
        self._root = _Node()
        self._names: list[str] = []
        for path, (name, typ) in entries.items():
            if not (isinstance(typ, FieldMap) or typ in TYPES):
                raise ValueError(f"unknown field type {typ!r} for {path!r}")
            node = self._root
            for number in _path_numbers(path):
                node = node.children.setdefault(number, _Node())
            node.entry = (name, typ)
            self._names.append(name)

    @property
    def names(self) -> list[str]:
        """The names mapped, in the order given."""
        return list(self._names)

    def extract(self, data: bytes, *, max_fields: int = DEFAULT_MAX_FIELDS) -> Extracted:
        """The mapped fields of ``data`` (one message of this type). Never raises on ``data``."""
        _check_limits(1, max_fields)
        values: dict[str, list] = {}
        errors: list[str] = []
        self._extract(bytes(data), self._root, "", 1, values, errors, _Budget(max_fields))
        return Extracted(values, errors)

    def _extract(
        self,
        data: bytes,
        node: _Node,
        prefix: str,
        depth: int,
        values: dict[str, list],
        errors: list[str],
        budget: _Budget,
    ) -> None:
        fields, err = _parse(data, prefix, depth, depth, budget, False)
        if err is not None:
            errors.append(f"{prefix or 'top level'}: {err}")
        for f in fields:
            child = node.children.get(f.number)
            if child is None:
                continue
            if child.entry is not None:
                name, typ = child.entry
                got = _convert(f, typ, errors, budget)
                if got:
                    values.setdefault(name, []).extend(got)
            if child.children:
                if f.wire_type == LEN:
                    self._extract(f.value, child, f.path, depth + 1, values, errors, budget)  # type: ignore[arg-type]
                elif child.entry is None:
                    errors.append(f"{f.path}: expected a message (LEN), got {_WIRE_NAMES[f.wire_type]}")


def _convert(f: Field, typ: str | FieldMap, errors: list[str], budget: _Budget) -> list:
    """``f``'s value(s) as ``typ`` (several for a packed field); a mismatch is noted in ``errors``."""
    wt = f.wire_type
    if isinstance(typ, FieldMap):
        if wt != LEN:
            errors.append(f"{f.path}: expected a message (LEN), got {_WIRE_NAMES[wt]}")
            return []
        sub_values: dict[str, list] = {}
        sub_errors: list[str] = []
        typ._extract(f.value, typ._root, "", 1, sub_values, sub_errors, budget)  # type: ignore[arg-type]
        errors += [f"{f.path}: {e}" for e in sub_errors]
        return [sub_values]
    if typ in _LEN_TYPES:
        if wt != LEN:
            errors.append(f"{f.path}: expected {typ} (LEN), got {_WIRE_NAMES[wt]}")
            return []
        raw: bytes = f.value  # type: ignore[assignment]
        if typ == "string":
            try:
                return [raw.decode("utf-8")]
            except UnicodeDecodeError:
                errors.append(f"{f.path}: invalid UTF-8 replaced by U+FFFD")
                return [raw.decode("utf-8", "replace")]
        return [raw]
    if typ in _VARINT_TYPES:
        conv = _VARINT_TYPES[typ]
        if wt == VARINT:
            return [conv(f.value)]
        if wt == LEN:
            got, err = packed_varints(f.value)  # type: ignore[arg-type]
            if err is not None:
                errors.append(f"{f.path}: packed {typ}: {err}")
            return [conv(v) for v in got]
        errors.append(f"{f.path}: expected {typ} (VARINT), got {_WIRE_NAMES[wt]}")
        return []
    size, want, conv = (4, I32, _I32_TYPES[typ]) if typ in _I32_TYPES else (8, I64, _I64_TYPES[typ])
    if wt == want:
        return [conv(f.value)]
    if wt == LEN:
        raw = f.value  # type: ignore[assignment]
        whole = len(raw) - len(raw) % size
        if whole != len(raw):
            errors.append(f"{f.path}: packed {typ}: {nbytes(len(raw) - whole)} left over")
        return [conv(int.from_bytes(raw[i : i + size], "little")) for i in range(0, whole, size)]
    errors.append(f"{f.path}: expected {typ} ({_WIRE_NAMES[want]}), got {_WIRE_NAMES[wt]}")
    return []
