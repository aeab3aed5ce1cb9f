"""The dialect toolkit: what several dialects share, with exactly the violations they record."""

from __future__ import annotations

from typing import Any

import pytest

from observer.dialects import toolkit
from observer.records import Violation


@pytest.mark.parametrize(
    ("value", "is_int", "count"),
    [
        (0, True, 0),
        (2**63 - 1, True, 2**63 - 1),
        (2**63, False, None),
        (-(2**63), True, None),
        (-(2**63) - 1, False, None),
        (-1, True, None),
        (True, False, None),
        (1.0, False, None),
        ("1", False, None),
        (None, False, None),
    ],
)
def test_int64_and_token_counts(value: Any, is_int: bool, count: int | None) -> None:
    """JSON integers that fit 64 bits, booleans never; a token count is one that is >= 0."""
    assert toolkit.is_int(value) is is_int
    assert toolkit.count(value) == count


@pytest.mark.parametrize(
    ("data", "not_object", "detail"),
    [
        ("[1]", None, "chunk: data is not a JSON object"),
        ("[1]", "chunk is not a JSON object", "chunk is not a JSON object"),
        ("{", None, "chunk: unexpected end of data: line 1 column 2 (char 1)"),
    ],
)
def test_load_object_violations(data: str, not_object: str | None, detail: str) -> None:
    """Not JSON: invalid_json naming what; not an object: invalid_event with the given detail."""
    out: list[Any] = []
    assert toolkit.load_object(data, out, "chunk", not_object) is None
    assert [v.detail for v in out] == [detail]
    assert out[0].kind == ("invalid_json" if data == "{" else "invalid_event")


def test_load_object_and_request_give_the_object() -> None:
    """A JSON object comes back as a dict; a request's comes with an empty violation list of its own."""
    out: list[Any] = []
    assert toolkit.load_object(b'{"a": 1}', out, "x") == {"a": 1} and out == []
    doc, violations = toolkit.load_request(b'{"model": "m"}')
    assert doc == {"model": "m"} and violations == []
    assert toolkit.load_request(b"{}")[1] is not violations


@pytest.mark.parametrize(
    ("body", "detail"),
    [(b"[]", "request body is not a JSON object"), (b"{", "request body is not JSON: ")],
)
def test_load_request_violations(body: bytes, detail: str) -> None:
    """A body that is not a JSON object gives one invalid_request and no document."""
    doc, violations = toolkit.load_request(body)
    assert doc is None and [v.kind for v in violations] == ["invalid_request"]
    assert violations[0].detail.startswith(detail)


def test_messages_tools_and_names() -> None:
    """Messages without an object and role are counted once; tools keep objects; names are strings."""
    violations: list[Violation] = []
    toolkit.check_messages([{"role": "user"}, "x", {"content": "y"}], violations)
    toolkit.check_messages([{"role": "user"}], violations)
    assert [v.detail for v in violations] == ["2 message(s) without an object and role"]
    tools = toolkit.read_tools({"tools": [{"name": "a"}, 1, {"name": 2}, {}]}, "tools", violations)
    assert tools == [{"name": "a"}, {"name": 2}, {}] and toolkit.tool_names(tools) == ["a"]
    assert toolkit.read_tools({"functions": {}}, "functions", violations) == []
    assert violations[-1].detail == "functions is not an array"


@pytest.mark.parametrize(
    ("data", "size"),
    [("", 0), ("QQ==", 1), ("QUI=", 2), ("QUJD", 3), ("QUJD\nREVG", 6), ("QUI", 2), ("=", 0)],
)
def test_base64_decoded_size(data: str, size: int) -> None:
    """RFC 4648 §4 sizes without decoding: padding and whitespace discounted, unpadded accepted."""
    assert toolkit.base64_decoded_size(data) == size
