"""The hot path stays linear in the stream's length (issue 4): a ``StreamObserver`` fed many
small deltas, or one huge event in small chunks, the way a stream arrives.

- Work: the CPU time for 8x the input is at most ``MAX_RATIO`` times that for 1x (linear: about
  8; a quadratic step: about 64). Generous on purpose: the bound is for the shape of the cost,
  not for speed, which bench/core.py measures. Best of three runs, GC paused, CPU time (not
  wall time: other processes on the machine do not count), a run cut off once it is hopeless.
- Memory: while streaming, memory grows by at most ``MAX_BYTES_PER_CHAR`` per character of
  text (the text itself, about 1 B for ASCII): no piece costs its own object for long (one-char
  deltas once held ~58 B each) and the text so far is never copied whole (the bug fixed: all of
  it was re-joined every 256 deltas, which only costs visible time at hundreds of MB, but
  doubles the memory at once). Deterministic: traced allocations, not time.

The mutation tests at the end put each of those bugs back and check that a test fails."""

from __future__ import annotations

import gc
import time
import tracemalloc
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import orjson
import pytest

from observer.dialects.base import RequestView
from observer.dialects.openai_chat import OpenAIChatAdapter
from observer.dialects.registry import default_registry
from observer.limits import Limits
from observer.reassembly import EndCause
from observer.records import Exchange
from observer.response import ResponseSpec, StreamEnd, assemble
from observer.tap import StreamObserver
from observer.wire.sse import SSEDecoder

MAX_RATIO = 24  # CPU time at 8x over 1x: 3x the linear 8, well under a quadratic's 64
MAX_BYTES_PER_CHAR = 1.5  # traced memory growth per ASCII character streamed
REQUEST = b'{"model":"gpt","messages":[{"role":"user","content":"hi"}],"stream":true}'
LIMITS = Limits(max_stream_text_chars=1 << 30, max_event_bytes=1 << 28, max_stream_events=1 << 30)
_HEAD = b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt","choices":[{"index":0,"delta":'
_OPENING = _HEAD + b'{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
_CALL = (
    _HEAD
    + b'{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":""}}]},"finish_reason":null}]}\n\n'
)
_DONE = b"data: [DONE]\n\n"


class _TooSlow(Exception):
    """A measured run passed its deadline."""


def _text_deltas(n: int, chars: int) -> list[bytes]:
    """An ``openai.chat`` stream of ``n`` text deltas of ``chars`` characters, one event each."""
    delta = _HEAD + b'{"content":' + orjson.dumps("x" * chars) + b'},"finish_reason":null}]}\n\n'
    return [_OPENING, *[delta] * n, _DONE]


def _argument_fragments(n: int, chars: int) -> list[bytes]:
    """An ``openai.chat`` stream opening one tool call, then ``n`` argument fragments of
    ``chars`` characters, one event each."""
    frag = _HEAD + b'{"tool_calls":[{"index":0,"function":{"arguments":' + orjson.dumps("a" * chars) + b"}}]}"
    frag += b',"finish_reason":null}]}\n\n'
    return [_OPENING, _CALL, *[frag] * n, _DONE]


def _huge_event(chars: int, chunk_bytes: int = 1024) -> list[bytes]:
    """An ``openai.chat`` stream whose one text delta holds ``chars`` characters, cut into
    ``chunk_bytes`` chunks."""
    body = _HEAD + b'{"content":"' + b"y" * chars + b'"},"finish_reason":null}]}\n\n' + _DONE
    return [_OPENING, *[body[i : i + chunk_bytes] for i in range(0, len(body), chunk_bytes)]]


def _batched(chunks: list[bytes], size: int = 4096) -> list[bytes]:
    """The same bytes in ``size``-byte chunks (several events each, cut anywhere)."""
    body = b"".join(chunks)
    return [body[i : i + size] for i in range(0, len(body), size)]


def _observer() -> StreamObserver:
    dialect = default_registry().get("openai.chat")
    view = RequestView("POST", "127.0.0.1", "/v1/chat/completions", {"content-type": "application/json"})
    facts, _ = dialect.parse_request(REQUEST, view)
    spec = ResponseSpec(
        dialect.name,
        200,
        "text/event-stream",
        None,
        0.0,
        view.path,
        tuple(facts.tool_names),
        facts.request_id,
        facts.stream,
        LIMITS,
    )
    return StreamObserver(dialect, spec)


def _record(obs: StreamObserver, chunks: list[bytes]) -> Exchange:
    """The record of the stream ``obs`` was fed (``chunks``), assembled as the capture path does."""
    ex = Exchange(
        id="linear",
        dialect="openai.chat",
        host="127.0.0.1",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/1.1",
        started_at=datetime.fromtimestamp(0, tz=timezone.utc),
        status_code=200,
    )
    return assemble(ex, [], obs.finish(StreamEnd(EndCause.EOF, 1.0 + len(chunks))))


def _stream(chunks: list[bytes], deadline: float = float("inf")) -> Exchange:
    """Feeds ``chunks`` to a fresh observer and returns the record; ``_TooSlow`` once the
    process's CPU time passes ``deadline``."""
    obs = _observer()
    for i, chunk in enumerate(chunks):
        obs.feed(chunk, 1.0 + i)
        if not i & 63 and time.process_time() > deadline:
            raise _TooSlow
    return _record(obs, chunks)


@contextmanager
def _no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _cpu_s(chunks: list[bytes], limit_s: float = float("inf")) -> float:
    """Best CPU time (s) of three runs of ``_stream(chunks)``; ``inf`` when a run takes more
    than ``limit_s``."""
    best = float("inf")
    for _ in range(3):
        with _no_gc():
            start = time.process_time()
            try:
                _stream(chunks, deadline=start + limit_s)
            except _TooSlow:
                return float("inf")
            best = min(best, time.process_time() - start)
    return best


def work_ratio(make: Callable[[int], list[bytes]], n: int) -> float:
    """CPU time of the stream ``make(8 * n)`` over that of ``make(n)`` (``inf`` once the 8x
    run takes ``MAX_RATIO`` times the 1x one: already a failure)."""
    small = _cpu_s(make(n))
    return _cpu_s(make(8 * n), limit_s=MAX_RATIO * small) / small


def growth_per_char(make: Callable[[int], list[bytes]], n: int) -> float:
    """Traced peak memory while streaming ``make(8 * n)`` minus that for ``make(n)``, per
    character of text the larger one adds (bytes per character; the record itself, built by
    ``finish``, is not counted)."""

    def peak(chunks: list[bytes]) -> tuple[int, int]:
        obs = _observer()
        with _no_gc():
            tracemalloc.start()
            try:
                for i, chunk in enumerate(chunks):
                    obs.feed(chunk, 1.0 + i)
                high = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        ex = _record(obs, chunks)
        return high, len(ex.text or "") + sum(len(c.arguments) for c in ex.tool_calls)

    (low, chars_low), (high, chars_high) = peak(make(n)), peak(make(8 * n))
    return (high - low) / (chars_high - chars_low)


STREAMS = {
    "text deltas, one event per chunk": lambda n: _text_deltas(n, 16),
    "text deltas, 4 KiB chunks": lambda n: _batched(_text_deltas(n, 16)),
    "argument fragments, one event per chunk": lambda n: _argument_fragments(n, 16),
}


@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_many_small_deltas_cost_linear_time(stream):
    """Eight times the deltas cost at most ``MAX_RATIO`` times the CPU time."""
    assert work_ratio(STREAMS[stream], 6000) < MAX_RATIO


@pytest.mark.parametrize("chunk_bytes", [1024, 16384])
def test_one_huge_event_costs_linear_time(chunk_bytes):
    """One event eight times as large, in chunks of the same size, costs at most
    ``MAX_RATIO`` times the CPU time (its unterminated line is not re-copied per chunk)."""
    assert work_ratio(lambda n: _huge_event(n, chunk_bytes), 2 << 20) < MAX_RATIO


@pytest.mark.parametrize(("chars", "n"), [(1, 4000), (16, 1000)])
@pytest.mark.parametrize("make", [_text_deltas, _argument_fragments], ids=["text", "arguments"])
def test_streaming_memory_is_the_text(make, chars, n):
    """Memory grows by at most ``MAX_BYTES_PER_CHAR`` per character streamed, one-character
    deltas included (trial finding: 8M of them held ~58 B each; now ~1.2 B: the text and one
    string header per 256 characters)."""
    assert growth_per_char(lambda k: make(k, chars), n) < MAX_BYTES_PER_CHAR


def test_records_are_exact():
    """The streams measured above give their whole text and arguments."""
    assert _stream(_text_deltas(1000, 3)).text == "xxx" * 1000
    assert _stream(_batched(_text_deltas(1000, 3), 100)).text == "xxx" * 1000
    assert _stream(_argument_fragments(1000, 2)).tool_calls[0].arguments == "aa" * 1000
    assert _stream(_huge_event(3_000_000)).text == "y" * 3_000_000


def _line_in_1k_chunks(n: int, end: bytes) -> None:
    data = b"data: " + b"y" * n + end + end
    dec = SSEDecoder(max_event_bytes=16 << 20)
    out = []
    for i in range(0, len(data), 1024):
        out += dec.feed(data[i : i + 1024])
    out += dec.close()
    assert out == [(b"", b"y" * n, None, None, 6 + n + 2 * len(end))]


@pytest.mark.parametrize("end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
def test_long_line_in_1k_chunks(end):
    """An unterminated event arriving in 1 KiB chunks comes out whole and exact."""
    _line_in_1k_chunks(3_000_000, end)


# -- mutations: each bug put back must fail a test above ----------------------------------------
# (The time checks run on smaller inputs here: a mutated run is slow by design, and the 8x run
# is cut off once it passes ``MAX_RATIO`` times the 1x one.)


@pytest.mark.mutation
def test_quadratic_rejoin_fails_the_memory_test(monkeypatch):
    """The bug fixed in issue 4 put back: each coalescing joins the whole text so far, not only
    the pieces since the last run."""
    import observer.reassembly as reassembly

    def rejoin_everything(parts):
        parts[:] = ["".join(parts)]
        parts.joined = 1

    monkeypatch.setattr(reassembly, "_coalesce", rejoin_everything)
    assert _stream(_text_deltas(1000, 3)).text == "xxx" * 1000  # still correct, only costly
    assert growth_per_char(lambda n: _text_deltas(n, 16), 1000) >= MAX_BYTES_PER_CHAR


@pytest.mark.mutation
def test_unjoined_pieces_fail_the_memory_test(monkeypatch):
    """Pieces never coalesced (one object per one-character delta) fail the memory test."""
    import observer.reassembly as reassembly

    monkeypatch.setattr(reassembly, "_coalesce", lambda parts: None)
    assert growth_per_char(lambda n: _text_deltas(n, 1), 4000) >= MAX_BYTES_PER_CHAR


@pytest.mark.mutation
def test_quadratic_join_per_delta_fails_the_time_test(monkeypatch):
    """A fast lane that joins the text seen so far on every delta (e.g. to look for a repeat)
    fails the time test."""
    original = OpenAIChatAdapter.fast
    seen: weakref.WeakKeyDictionary[OpenAIChatAdapter, list[str]] = weakref.WeakKeyDictionary()

    class Joining:
        """The real sink, joining every text seen so far on each delta."""

        def __init__(self, adapter, sink):
            self._adapter, self._sink = adapter, sink

        def text(self, index, block_type, text, now_s):
            pieces = seen.setdefault(self._adapter, [])
            pieces.append(text)
            "".join(pieces)
            self._sink.text(index, block_type, text, now_s)

        def fragment(self, *args):
            self._sink.fragment(*args)

    def joining(self, event, obj, sink, now_s):
        return original(self, event, obj, Joining(self, sink), now_s)

    monkeypatch.setattr(OpenAIChatAdapter, "fast", joining)
    assert work_ratio(STREAMS["text deltas, one event per chunk"], 4000) >= MAX_RATIO  # (margin under load)


@pytest.mark.mutation
def test_recopied_partial_line_fails_the_time_test(monkeypatch):
    """An SSE decoder that copies the unterminated line it holds again with every chunk (bytes
    concatenation instead of a growing buffer) fails the time test."""
    original = SSEDecoder.feed
    held: dict[int, bytes] = {}  # by id: the decoder has __slots__ (no weak references)

    def recopying(self, data):
        held[id(self)] = b"" if b"\n" in data else held.get(id(self), b"") + data
        return original(self, data)

    monkeypatch.setattr(SSEDecoder, "feed", recopying)
    assert work_ratio(lambda n: _huge_event(n, 1024), 1 << 20) >= MAX_RATIO  # (512 KiB measured 20-30: too near)
