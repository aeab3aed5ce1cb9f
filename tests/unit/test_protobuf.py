"""Tests for observer.wire.protobuf (schema-less walker, field maps).

Expected values are written by hand from protobuf.dev "Encoding" (key = ``field << 3 | wire
type``; varints little-endian base 128; ``LEN`` = varint length + bytes) and the ambiguity rules
of reference ``binary-formats.md`` §7 as the module states them. Fixtures:
``tests/fixtures/wire/binary/protobuf_*.pb`` and the envelope payloads of ``connect_*.connect``
(``generate.py`` in that folder).
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from observer.wire.envelope import CONNECT, Envelope, EnvelopeDecoder
from observer.wire.protobuf import (
    I32,
    I64,
    LEN,
    VARINT,
    Field,
    FieldMap,
    WalkResult,
    fields_at,
    flatten,
    packed_varints,
    strings,
    walk,
    zigzag,
)
from tests.wirefeed import feed

BINARY = Path(__file__).resolve().parent.parent / "fixtures" / "wire" / "binary"
_spec = importlib.util.spec_from_file_location("binary_fixture_generator", BINARY / "generate.py")
gen = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(gen)  # type: ignore[union-attr]


def fixture(name: str) -> bytes:
    return (BINARY / name).read_bytes()


def payloads(name: str, encoding: str | None) -> list[bytes]:
    return [e.payload for e in feed(EnvelopeDecoder(CONNECT, encoding), [fixture(name)]) if isinstance(e, Envelope)]


# -- the §9.9 ambiguous cases ------------------------------------------------------------------------

AMBIGUOUS = bytes.fromhex(
    "0a04" "0a026869"  # 1: "\n\x02hi" -- a string that parses as a message
    "1204" "08781006"  # 2: {1: 120, 2: 6} -- varint-only submessage (valid UTF-8 too)
    "1a04" "01960103"  # 3: packed repeated [1, 150, 3]
    "20" "ffffffffffffffffff01"  # 4: 10-byte varint 2^64 - 1
    "2a04" "20746865"  # 5: " the" -- text that is also a valid message {4: 116, 13: 101}
)  # fmt: skip


def test_ambiguous_fixture_bytes():
    assert fixture("protobuf_ambiguous.pb") == AMBIGUOUS


def test_ambiguous_cases():
    want = [
        Field("1", 1, LEN, (Field("1.1", 1, LEN, "hi", b"hi"),), b"\n\x02hi"),
        Field("2", 2, LEN, (Field("2.1", 1, VARINT, 120), Field("2.2", 2, VARINT, 6)), b"\x08\x78\x10\x06"),
        Field("3", 3, LEN, b"\x01\x96\x01\x03", b"\x01\x96\x01\x03"),
        Field("4", 4, VARINT, 2**64 - 1),
        Field("5", 5, LEN, " the", b" the"),
    ]
    assert walk(AMBIGUOUS) == WalkResult(want, None)
    assert [f.kind for f in want] == ["message", "message", "bytes", "varint", "string"]
    # A field map resolves each case as its schema says.
    fm = FieldMap(
        {
            "1": ("as_string", "string"),
            "2.1": ("a", "uint64"),
            "2.2": ("b", "uint64"),
            "3": ("packed", "uint64"),
            "4": ("as_int64", "int64"),
            "5.4": ("four", "uint32"),
            "5.13": ("thirteen", "uint32"),
        }
    )
    assert fm.extract(AMBIGUOUS) == (
        {
            "as_string": ["\n\x02hi"],
            "a": [120],
            "b": [6],
            "packed": [1, 150, 3],
            "as_int64": [-1],
            "four": [116],
            "thirteen": [101],
        },
        [],
    )
    assert packed_varints(b"\x01\x96\x01\x03") == ([1, 150, 3], None)
    assert fields_at(AMBIGUOUS, "5.4") == WalkResult([Field("5.4", 4, VARINT, 116)], None)


def test_truncated_length():
    assert fixture("protobuf_truncated.pb") == bytes.fromhex("0a026f6b12056162")
    assert walk(fixture("protobuf_truncated.pb")) == WalkResult(
        [Field("1", 1, LEN, "ok", b"ok")], "length 5 of field 2 at byte 4 runs past the end (2 bytes left)"
    )


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (bytes.fromhex("08ffffffffffffffffff01"), None),  # 10 bytes, 2^64 - 1: fine
        (bytes.fromhex("08ffffffffffffffffff02"), "varint at byte 1 overflows 64 bits"),
        (bytes.fromhex("08ffffffffffffffffffff01"), "varint at byte 1 is longer than 10 bytes"),
        (bytes.fromhex("0880"), "truncated varint at byte 1"),
        (bytes.fromhex("80"), "truncated varint at byte 0"),
        (bytes.fromhex("0b"), "group wire type 3 (SGROUP, deprecated) of field 1 at byte 0"),
        (bytes.fromhex("0c"), "group wire type 4 (EGROUP, deprecated) of field 1 at byte 0"),
        (bytes.fromhex("0e"), "invalid wire type 6 of field 1 at byte 0"),
        (bytes.fromhex("0f"), "invalid wire type 7 of field 1 at byte 0"),
        (bytes.fromhex("0001"), "field number 0 at byte 0"),
        (bytes.fromhex("f8ffffff0f01"), None),  # field 2^29 - 1: the largest
        (bytes.fromhex("8080808010"), "field number 536870912 at byte 0 exceeds 2^29 - 1"),
        (bytes.fromhex("0d010203"), "truncated 4-byte value of field 1 at byte 0"),
        (bytes.fromhex("0901020304050607"), "truncated 8-byte value of field 1 at byte 0"),
        (bytes.fromhex("0a"), "truncated varint at byte 1"),
        (bytes.fromhex("0a036162"), "length 3 of field 1 at byte 0 runs past the end (2 bytes left)"),
    ],
)
def test_malformed_input_returns_what_parsed_and_why(data, error):
    result = walk(b"\x10\x01" + data)  # a good field first: it is kept
    assert result.fields[0] == Field("2", 2, VARINT, 1)
    if error is None:
        assert result.error is None and len(result.fields) == 2
    else:
        # Offsets in the reason count from the start of the data walked (2 bytes were prepended).
        at = error.split("at byte ")[1].split()[0]
        assert result == WalkResult(
            [Field("2", 2, VARINT, 1)], error.replace(f"at byte {at}", f"at byte {int(at) + 2}")
        )


def test_largest_field_number_and_fixed_values():
    data = bytes.fromhex("f8ffffff0f01") + bytes.fromhex("0d01000080") + bytes.fromhex("110000000000000080")
    assert walk(data) == WalkResult(
        [
            Field("536870911", 2**29 - 1, VARINT, 1),
            Field("1", 1, I32, 0x80000001),
            Field("2", 2, I64, 2**63),
        ],
        None,
    )


def test_depth_is_capped():
    """{1: {1: ... {1: 0}}} nine messages deep: the top message is depth 1, so with max_depth 3
    the payload of the field at path 1.1.1 stays bytes (not read as a message)."""
    inner = b"\x08\x00"  # {1: 0}
    for _ in range(8):
        inner = b"\x0a" + bytes([len(inner)]) + inner
    fields, error = walk(inner, max_depth=3)
    assert error is None
    level2 = fields[0].value[0]
    assert level2.path == "1.1" and level2.kind == "message"
    level3 = level2.value[0]
    assert level3.path == "1.1.1" and level3.kind == "bytes" and level3.value == inner[6:]
    deep = walk(inner).fields  # default depth 8: the payload of a field of the depth-8 message stays bytes
    for _ in range(7):
        deep = deep[0].value
    assert deep[0].path == ".".join(["1"] * 8) and deep[0].kind == "bytes" and deep[0].value == b"\x08\x00"


def test_field_budget():
    data = b"\x08\x01" * 50
    result = walk(data, max_fields=10)
    assert result == WalkResult([Field("1", 1, VARINT, 1)] * 10, "stopped after 10 fields (max_fields)")
    # Trial parses count: a LEN payload holding 20 varint fields, with 5 allowed.
    nested = b"\x0a\x28" + b"\x10\x01" * 20
    result = walk(nested, max_fields=5)
    assert result.error == "stopped after 5 fields (max_fields)"
    assert result.fields == [Field("1", 1, LEN, nested[2:], nested[2:])]
    assert walk(nested, max_fields=21).error is None


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_bounds_must_be_positive(bad):
    with pytest.raises(ValueError):
        walk(b"", max_depth=bad)
    with pytest.raises(ValueError):
        walk(b"", max_fields=bad)


def test_empty_and_control_strings():
    assert walk(b"\x0a\x00") == WalkResult([Field("1", 1, LEN, "", b"")], None)
    # A DEL or a C1 control is not printable; invalid UTF-8 is not text; TAB/LF/CR are.
    for payload in (b"a\x7fb", "a\u0085b".encode(), b"\xff\xfe"):
        assert walk(b"\x0a" + bytes([len(payload)]) + payload).fields[0].kind == "bytes", payload
    assert walk(b"\x0a\x05a\tb\r\n").fields[0].value == "a\tb\r\n"
    text = "h\u00e9llo \u20ac \U0001f469\u200d\U0001f4bb"  # a ZWJ sequence (format character) is text
    raw = text.encode()
    assert walk(b"\x0a" + bytes([len(raw)]) + raw).fields[0].value == text


# -- strings, fields_at, flatten ------------------------------------------------------------------------


def test_strings_of_unknown_endpoints():
    assert [strings(p) for p in payloads("connect_cursor.connect", None)] == [["Hello"], [" the"], [], [], []]
    assert [strings(p) for p in payloads("connect_windsurf.connect", "gzip")[:4]] == [
        ["msg_1", "Hel"],
        ["lo"],
        ["call_1", "get_weather", '{"city":"Paris"}'],
        [],
    ]
    assert strings(fixture("protobuf_truncated.pb")) == ["ok"]
    assert strings(AMBIGUOUS, min_chars=3) == [" the"]


def test_fields_at_reads_each_step_as_a_message():
    cursor = payloads("connect_cursor.connect", None)
    assert fields_at(cursor[0], "1.1.1") == WalkResult([Field("1.1.1", 1, LEN, "Hello", b"Hello")], None)
    assert fields_at(cursor[3], "1.14.2") == WalkResult([Field("1.14.2", 2, VARINT, 6)], None)
    assert fields_at(cursor[3], "1.1.1") == WalkResult([], None)
    # Repeated parents give several fields; a parent that is not a message is reported.
    data = b"\x0a\x02\x08\x01" + b"\x0a\x02\x08\x02" + b"\x0a\x01\xff"
    result = fields_at(data, "1.1")
    assert result.fields == [Field("1.1", 1, VARINT, 1), Field("1.1", 1, VARINT, 2)]
    assert result.error == "1: truncated varint at byte 0"
    with pytest.raises(ValueError):
        fields_at(data, "1..2")
    with pytest.raises(ValueError):
        fields_at(data, "0")


def test_flatten():
    assert flatten(walk(AMBIGUOUS).fields) == [
        ("1.1", "hi"),
        ("2.1", 120),
        ("2.2", 6),
        ("3", b"\x01\x96\x01\x03"),
        ("4", 2**64 - 1),
        ("5", " the"),
    ]


# -- field maps ---------------------------------------------------------------------------------------

CURSOR = FieldMap(
    {
        "1.1.1": ("text", "string"),
        "1.8.1": ("token_delta", "uint64"),
        "1.13": ("heartbeat", "message"),
        "1.14": ("turn_ended", "message"),
        "1.14.1": ("input_tokens", "uint64"),
        "1.14.2": ("output_tokens", "uint64"),
    }
)

WINDSURF = FieldMap(
    {
        "1": ("message_id", "string"),
        "3": ("delta_text", "string"),
        "5": ("stop_reason", "enum"),
        "6": ("tool_call", FieldMap({"1": ("id", "string"), "2": ("name", "string"), "3": ("arguments", "string")})),
        "7.2": ("input_tokens", "uint64"),
        "7.3": ("output_tokens", "uint64"),
    }
)


def test_cursor_field_map():
    got = [CURSOR.extract(p) for p in payloads("connect_cursor.connect", None)]
    assert got == [
        ({"text": ["Hello"]}, []),
        ({"text": [" the"]}, []),
        ({"token_delta": [2]}, []),
        ({"turn_ended": [b"\x08\x78\x10\x06"], "input_tokens": [120], "output_tokens": [6]}, []),
        ({"heartbeat": [b""]}, []),
    ]
    assert CURSOR.names == ["text", "token_delta", "heartbeat", "turn_ended", "input_tokens", "output_tokens"]


def test_windsurf_field_map_with_a_nested_map():
    got = [WINDSURF.extract(p).values for p in payloads("connect_windsurf.connect", "gzip")[:4]]
    assert got == [
        {"message_id": ["msg_1"], "delta_text": ["Hel"]},
        {"delta_text": ["lo"]},
        {"tool_call": [{"id": ["call_1"], "name": ["get_weather"], "arguments": ['{"city":"Paris"}']}]},
        {"stop_reason": [10], "input_tokens": [12], "output_tokens": [7]},
    ]


def test_field_map_scalar_types():
    data = (
        b"\x08" + b"\xff" * 9 + b"\x01"  # 1: varint 2^64-1
        + b"\x10\x03"  # 2: varint 3 (zigzag -2)
        + b"\x1d" + struct.pack("<f", 1.5)  # 3: I32
        + b"\x21" + struct.pack("<d", -2.25)  # 4: I64
        + b"\x2d" + struct.pack("<i", -7)  # 5: I32
        + b"\x31" + struct.pack("<q", -8)  # 6: I64
        + b"\x38\x02"  # 7: varint 2
        + b"\x42\x08" + struct.pack("<ff", 1.0, 2.0)  # 8: packed floats
        + b"\x4a\x03\xff\xfe\x41"  # 9: not UTF-8
    )  # fmt: skip
    fm = FieldMap(
        {
            "1": ("u64", "uint64"),
            "2": ("s64", "sint64"),
            "3": ("f", "float"),
            "4": ("d", "double"),
            "5": ("sf32", "sfixed32"),
            "6": ("sf64", "sfixed64"),
            "7": ("flag", "bool"),
            "8": ("floats", "float"),
            "9": ("text", "string"),
        }
    )
    values, errors = fm.extract(data)
    assert values == {
        "u64": [2**64 - 1],
        "s64": [-2],
        "f": [1.5],
        "d": [-2.25],
        "sf32": [-7],
        "sf64": [-8],
        "flag": [True],
        "floats": [1.0, 2.0],
        "text": ["\ufffd\ufffdA"],
    }
    assert errors == ["9: invalid UTF-8 replaced by U+FFFD"]
    more = FieldMap(
        {"1": ("i32", "int32"), "2": ("u32", "uint32"), "3": ("f32", "fixed32"), "4": ("f64", "fixed64")}
    ).extract(
        b"\x08"
        + b"\xff" * 9
        + b"\x01"
        + b"\x10"
        + b"\xff" * 9
        + b"\x01"
        + b"\x1d\x01\x00\x00\x00"
        + b"\x21"
        + b"\x02"
        + b"\x00" * 7
    )
    assert more == ({"i32": [-1], "u32": [0xFFFFFFFF], "f32": [1], "f64": [2]}, [])
    assert zigzag(0) == 0 and zigzag(1) == -1 and zigzag(4294967294) == 2147483647


def test_field_map_mismatches_are_reported_not_raised():
    fm = FieldMap(
        {
            "1": ("s", "string"),
            "2": ("n", "uint64"),
            "3.1": ("deep", "uint64"),
            "4": ("d", "double"),
            "5": ("sub", FieldMap({"1": ("x", "uint64")})),
            "6": ("packed", "sint32"),
            "7": ("fixed", "fixed32"),
        }
    )
    data = b"\x08\x01" + b"\x15\x00\x00\x00\x00" + b"\x18\x05" + b"\x20\x01" + b"\x28\x01" + b"\x32\x02\x03\x80"
    data += b"\x3a\x05\x01\x00\x00\x00\x09"
    values, errors = fm.extract(data)
    assert values == {"packed": [-2], "fixed": [1]}
    assert errors == [
        "1: expected string (LEN), got VARINT",
        "2: expected uint64 (VARINT), got I32",
        "3: expected a message (LEN), got VARINT",
        "4: expected double (I64), got VARINT",
        "5: expected a message (LEN), got VARINT",
        "6: packed sint32: truncated varint at byte 1",
        "7: packed fixed32: 1 byte left over",
    ]
    # A message on the way that does not parse: what parsed before is kept.
    values, errors = FieldMap({"1.1": ("x", "uint64"), "2": ("y", "uint64")}).extract(b"\x0a\x03\x08\x07\x0f\x10\x02")
    assert values == {"x": [7], "y": [2]}
    assert errors == ["1: invalid wire type 7 of field 1 at byte 2"]
    # A nested map's errors carry the path of its field.
    values, errors = WINDSURF.extract(b"\x32\x02\x08\x01")
    assert values == {"tool_call": [{}]} and errors == ["6: 1: expected string (LEN), got VARINT"]


@pytest.mark.parametrize(
    "entries",
    [{"1": ("x", "varchar")}, {"1.a": ("x", "string")}, {"": ("x", "string")}, {"0": ("x", "string")}],
)
def test_bad_field_maps_raise(entries):
    with pytest.raises(ValueError):
        FieldMap(entries)


# -- properties ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_never_raise(data):
    fields, error = walk(data, max_fields=500)
    assert error is None or isinstance(error, str)
    strings(data, max_fields=500)
    CURSOR.extract(data, max_fields=500)
    WINDSURF.extract(data, max_fields=500)
    fields_at(data, "1.1", max_fields=500)


def _message(draw, depth: int) -> tuple[bytes, list]:
    """A random message and its expected ``flatten``. Strings are printable; field numbers are 2
    and 3, whose keys (``10``, ``12``, ``18``, ``1a``) are control bytes, so no nested message is
    printable text (numbers from 4 on could make one printable: then it reads as a string)."""
    data = b""
    leaves: list = []
    for _ in range(draw(st.integers(0, 4))):
        number = draw(st.integers(2, 3))
        path = str(number)
        choice = draw(st.integers(0, 2 if depth < 3 else 1))
        if choice == 0:
            v = draw(st.integers(0, 2**64 - 1))
            data += gen.pb_uint(number, v)
            leaves.append((path, v))
        elif choice == 1:
            s = draw(st.text(st.characters(codec="utf-8", categories=["L", "N", "Zs"]), min_size=1, max_size=8))
            data += gen.pb_len(number, s)
            leaves.append((path, s))
        else:
            sub, sub_leaves = _message(draw, depth + 1)
            if not sub:
                continue
            data += gen.pb_len(number, sub)
            leaves += [(f"{path}.{p}", v) for p, v in sub_leaves]
    return data, leaves


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_generated_messages_walk_back_to_their_fields(data):
    """Messages built by the test helper's encoder: every varint and string comes back at its
    path, nested messages read as messages."""
    raw, leaves = _message(data.draw, 1)
    result = walk(raw)
    assert result.error is None
    assert flatten(result.fields) == leaves
