"""Incremental, sans-IO decoding of HTTP content codings (RFC 9110 §8.4 ``Content-Encoding``).

:func:`make_decoder` turns a ``Content-Encoding`` field value into a :class:`ContentDecoder`:
compressed ``bytes`` in through ``feed``, decoded ``bytes`` out, as soon as the input allows
(servers that stream SSE flush their compressor per event, e.g. zlib ``Z_SYNC_FLUSH``, and
each event's bytes come out of the ``feed`` that delivered them). No I/O, no clock, no globals.

Codings (RFC 9110 §8.4.1; names case-insensitive, surrounding whitespace ignored):

- ``identity`` (also a missing or empty field): pass-through; ``feed`` returns its argument.
- ``gzip`` / ``x-gzip`` (RFC 1952): concatenated members are decoded one after another;
  bytes after a complete member that do not start a valid member are ignored, as curl and
  urllib3 do (servers are known to pad).
- ``deflate``: RFC 9110 §8.4.1.2 says the zlib format (RFC 1950); some servers send raw
  deflate (RFC 1951) instead, so the first two bytes decide (zlib header check, RFC 1950
  §2.2: CM = 8, CINFO <= 7, FCHECK makes CMF*256+FLG a multiple of 31), even when they
  arrive in separate chunks.
- ``br`` (RFC 7932) via ``brotli.Decompressor``.
- ``zstd`` (RFC 8878) via ``compression.zstd`` (Python 3.14+) or ``backports.zstd``; several
  frames are decoded one after another.

A list (``"gzip, br"``) names codings in the order they were applied (RFC 9110 §8.4), so
they are undone in reverse: br first, then gzip.

Errors: an unknown coding raises :class:`~observer.errors.UnsupportedEncoding` from
``make_decoder``; corrupt input raises :class:`~observer.errors.ContentDecodingError` from
``feed`` (or ``close``), and every later call raises it again. A stream cut short (no end
marker) is not an error: ``close`` returns what could be decoded and ``complete`` stays
``False``.

Decompression bombs and output limits
-------------------------------------

A few kilobytes of gzip, brotli or zstd can expand to gigabytes, and the proxy decodes on its
single event loop: an unbounded ``feed`` stalls every flow for seconds and takes gigabytes of
memory before any check after the fact could run. So :func:`make_decoder` takes limits that
bound the decoding itself (all off by default, which leaves the output unbounded, as above):

- ``max_ratio`` (with ``ratio_allowance_bytes``, default 1 MiB): the stream's total decoded
  output may never exceed ``ratio_allowance_bytes + max_ratio * encoded``, where ``encoded``
  counts every byte passed to ``feed`` so far, the current call included. The allowance lets
  a short body (headers, dictionaries, a small highly repetitive reply) decode in full.
- ``max_output_bytes``: the total decoded output may never exceed this many bytes.

Both are checked, the smaller one binds. Once a ``feed`` (or ``close``) would take the total
output past the budget, it raises ``ContentDecodingError`` with ``code ==
"decompression_limit"`` naming the limit; that call's output is dropped (output of earlier
calls stays returned, so the caller saw at most the budget), and the decoder is failed like
on corrupt input: every later ``feed``/``close`` raises the same error. A total exactly at
the budget is fine.

The work done is bounded too, not just the result: each decompressor is asked for at most
the remaining budget plus one byte, through its output-limiting API, and the call is failed
as soon as that extra byte shows up:

- gzip / deflate: ``zlib.decompressobj().decompress(data, max_length)``; zlib stops at
  ``max_length`` (the rest of the input stays in ``unconsumed_tail``), so at most
  budget + 1 bytes are ever inflated.
- zstd: ``ZstdDecompressor.decompress(data, max_length=...)`` (PEP 784 API; ``needs_input``
  ``False`` means more output is pending), likewise at most budget + 1 bytes.
- br: ``brotli.Decompressor.process(data, output_buffer_limit=1)``: brotli's limit only stops
  the output buffer from growing past its first block (about 32 KiB in Brotli 1.2: the
  binding allocates 32 KiB, then doubles), so each call yields at most one block; the
  remaining output is drained with ``process(b"")`` while ``can_accept_more_data()`` is
  ``False`` or the last call produced output, checking the budget after every call. Worst
  case: budget + one block (about 32 KiB) decoded before the error. The input goes to
  ``process`` in slices of at most 64 KiB (memoryview, no copy), because the binding copies
  the unconsumed rest of its input on each output-limited call.
- identity: the output is the input (so only ``max_output_bytes`` can bind, ``max_ratio`` >= 1).

Chains (``"gzip, br"``) check the final output against the budget computed from the chain's
original encoded input. Each inner stage (here br, whose output is gzip data) is bounded the
same way, against the same original input, with twice the budget plus 64 KiB of headroom:
intermediate data is normally smaller than the final output, but framing overhead
(incompressible data, many small gzip members or zstd frames) can make it somewhat larger.
An inner bomb therefore fails with ``decompression_limit`` too ("intermediate ... output").

Memory: apart from the (bounded) output, each decoder keeps its coding's window state: 32 KiB
for zlib, up to 16 MiB for brotli, and for zstd the window the frame declares (at most
libzstd's default ``window_log_max``, 128 MiB; RFC 9659 limits HTTP senders to 8 MiB). It does
not grow with the output and is not counted in the budget.

Cost on the common path: when limits are set, each ``feed`` does a few integer operations
(O(1), no extra copies of input or output besides joining per-call pieces, as without
limits); brotli makes one extra ``process(b"")`` call per ``feed`` to learn that no output is
pending.
"""

from __future__ import annotations

import sys
import zlib
from typing import Protocol

import brotli

from observer.errors import ContentDecodingError, UnsupportedEncoding

if sys.version_info >= (3, 14):  # pragma: no cover - depends on the interpreter
    from compression import zstd
else:  # pragma: no cover - depends on the interpreter
    from backports import zstd

__all__ = ["LIMIT_CODE", "ContentDecoder", "make_decoder"]

LIMIT_CODE = "decompression_limit"  # ContentDecodingError.code when a limit is hit

# Largest max_length the C decompressors accept (Py_ssize_t), minus one for the extra byte.
_MAX_ROOM = sys.maxsize - 1
# Inner chain stages: budget * _INNER_FACTOR + _INNER_SLACK (see the module docstring).
_INNER_FACTOR = 2
_INNER_SLACK = 64 * 1024
# brotli: input handed to one output-limited process() call (the binding copies the
# unconsumed rest of it on every call that stops at the output limit).
_BR_SLICE = 64 * 1024


class ContentDecoder(Protocol):
    """Decodes one response body's content coding incrementally.

    - ``feed(data)``: compressed bytes in, decoded bytes out (possibly ``b""``). Raises
      ``ContentDecodingError`` on corrupt input, or with ``code == "decompression_limit"``
      when the output would exceed the limits given to :func:`make_decoder`.
    - ``close()``: end of body; returns any remaining decoded bytes (usually ``b""``). Raises
      ``ContentDecodingError`` if the stream is corrupt; a stream cut short is not an error
      (``complete`` stays ``False``).
    - ``complete``: ``True`` once the coding's end marker was seen (always ``True`` for
      identity; ``False`` for an empty compressed body).
    """

    @property
    def complete(self) -> bool: ...

    def feed(self, data: bytes) -> bytes: ...

    def close(self) -> bytes: ...


class _Meter:
    """One stream's limits and the encoded bytes fed so far (shared by a chain's stages)."""

    __slots__ = ("allowance", "encoded", "max_output", "max_ratio")

    def __init__(self, max_ratio: int | None, allowance: int, max_output: int | None) -> None:
        self.max_ratio = max_ratio
        self.allowance = allowance
        self.max_output = max_output
        self.encoded = 0

    def cap(self) -> int:
        """The budget for the total decoded output now (the smaller of the two limits)."""
        cap = self.max_output
        if self.max_ratio is not None:
            by_ratio = self.allowance + self.max_ratio * self.encoded
            if cap is None or by_ratio < cap:
                cap = by_ratio
        assert cap is not None
        return cap

    def describe(self) -> str:
        """Names the limit that binds now."""
        if self.max_ratio is not None:
            by_ratio = self.allowance + self.max_ratio * self.encoded
            if self.max_output is None or by_ratio < self.max_output:
                return (
                    f"max_ratio={self.max_ratio} ({self.allowance} + {self.max_ratio} x {self.encoded}"
                    f" encoded bytes = {by_ratio} bytes)"
                )
        return f"max_output_bytes={self.max_output}"


class _Base:
    """Shared error handling (the first error is sticky: later calls raise it again) and the
    output budget (``_meter`` is ``None`` without limits)."""

    __slots__ = ("complete", "_counts_input", "_error", "_factor", "_meter", "_name", "_out", "_slack")

    def __init__(
        self, name: str, meter: _Meter | None = None, *, counts_input: bool = True, inner: bool = False
    ) -> None:
        self.complete = False
        self._error: ContentDecodingError | None = None
        self._name = name
        self._meter = meter
        self._counts_input = counts_input  # False in a chain: the chain counts the input once
        self._factor, self._slack = (_INNER_FACTOR, _INNER_SLACK) if inner else (1, 0)
        self._out = 0  # decoded bytes produced so far (counted only with limits)

    def _fail(self, exc: BaseException) -> ContentDecodingError:
        self._error = ContentDecodingError(f"corrupt {self._name} content: {exc}")
        return self._error

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _room(self) -> int:
        """Decoded bytes this stage may still produce (>= 0)."""
        assert self._meter is not None
        return min(self._meter.cap() * self._factor + self._slack - self._out, _MAX_ROOM)

    def _over(self) -> ContentDecodingError:
        assert self._meter is not None
        limit = self._meter.describe()
        if self._factor == 1:
            msg = f"decoded {self._name} output would exceed {limit}"
        else:
            msg = (
                f"intermediate {self._name} output of a chain would exceed"
                f" {self._factor} x {limit} + {self._slack} bytes"
            )
        self._error = ContentDecodingError(msg, code=LIMIT_CODE)
        return self._error

    def _count_in(self, data: bytes) -> None:
        if self._counts_input:
            assert self._meter is not None
            self._meter.encoded += len(data)

    def _inflate(self, d: zlib._Decompress, data: bytes) -> bytes:
        """``d.decompress(data)`` within the budget: raises the limit error once more than the
        remaining budget would come out, having inflated at most one byte more than that."""
        room = self._room()
        out = d.decompress(data, room + 1)
        self._out += len(out)
        if len(out) > room:
            raise self._over()
        # Output below max_length means zlib used up the input (or reached the end of the
        # stream): unconsumed_tail is empty, nothing is pending.
        if d.unconsumed_tail and not d.eof:  # pragma: no cover - defensive, see above
            return out + self._inflate(d, d.unconsumed_tail)
        return out

    def _flush(self, d: zlib._Decompress) -> bytes:
        out = d.flush()  # nothing is pending after _inflate: b"" in practice, checked anyway
        if self._meter is not None:
            self._out += len(out)
            if self._out > self._meter.cap() * self._factor + self._slack:
                raise self._over()
        return out


class _Identity:
    """``identity``: no transformation (RFC 9110 §8.4.1)."""

    __slots__ = ("complete",)
    identity = True  # output is input: a caller may skip ``feed`` (nothing to count or refuse)

    def __init__(self) -> None:
        self.complete = True

    def feed(self, data: bytes) -> bytes:
        return data

    def close(self) -> bytes:
        return b""


class _LimitedIdentity(_Base):
    """``identity`` with limits: the output is the input, counted against the budget.

    ``identity`` is True without ``max_output_bytes``: the output never exceeds ``max_ratio`` x
    the input, so only that limit could refuse bytes; without it callers may skip ``feed``."""

    __slots__ = ()

    @property
    def identity(self) -> bool:
        """True when ``feed`` can never refuse (no ``max_output_bytes``): it may be skipped."""
        assert self._meter is not None
        return self._meter.max_output is None

    def __init__(self, meter: _Meter) -> None:
        super().__init__("identity", meter)
        self.complete = True

    def feed(self, data: bytes) -> bytes:
        self._check()
        self._count_in(data)
        if len(data) > self._room():
            raise self._over()
        self._out += len(data)
        return data

    def close(self) -> bytes:
        self._check()
        return b""


class _Gzip(_Base):
    """``gzip`` / ``x-gzip`` (RFC 1952), members decoded one after another."""

    __slots__ = ("_d", "_members")

    def __init__(self, meter: _Meter | None = None, **kw: bool) -> None:
        super().__init__("gzip", meter, **kw)
        self._d: zlib._Decompress | None = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._members = 0  # members completed

    def feed(self, data: bytes) -> bytes:
        self._check()
        if self._meter is not None:
            self._count_in(data)
        out = []
        while data and self._d is not None:
            try:
                out.append(self._d.decompress(data) if self._meter is None else self._inflate(self._d, data))
            except zlib.error as exc:
                if self._members:
                    # Trailing bytes after a complete member that are not a gzip member:
                    # ignored (curl, urllib3 behaviour); stop decoding.
                    self._d = None
                    self.complete = True
                    break
                raise self._fail(exc) from None
            if not self._d.eof:
                break
            # End of one member: what follows may be the next member (RFC 1952 §2.2).
            self._members += 1
            self.complete = True
            data = self._d.unused_data
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self._d is not None and not self._d.eof and data:
            # Bytes of a new member have started: the stream is complete again only at its end.
            self.complete = False
        return b"".join(out)

    def close(self) -> bytes:
        self._check()
        if self._d is None:
            return b""
        try:
            return self._flush(self._d)
        except zlib.error as exc:  # pragma: no cover - flush after decompress does not fail
            raise self._fail(exc) from None


class _Deflate(_Base):
    """``deflate``: zlib (RFC 1950) per RFC 9110 §8.4.1.2, or raw deflate (RFC 1951)."""

    __slots__ = ("_d", "_head")

    def __init__(self, meter: _Meter | None = None, **kw: bool) -> None:
        super().__init__("deflate", meter, **kw)
        self._d: zlib._Decompress | None = None
        self._head = b""  # first byte held until the second decides zlib vs raw

    @staticmethod
    def _is_zlib_header(head: bytes) -> bool:
        # RFC 1950 §2.2: CMF low nibble CM = 8 (deflate), high nibble CINFO <= 7 (window
        # <= 32 KiB), and (CMF*256 + FLG) % 31 == 0. One byte: judge on CMF alone.
        cmf = head[0]
        if cmf & 0x0F != 8 or cmf >> 4 > 7:
            return False
        return len(head) < 2 or (cmf * 256 + head[1]) % 31 == 0

    def feed(self, data: bytes) -> bytes:
        self._check()
        if self._meter is not None:
            self._count_in(data)
        if self._d is None:
            head = self._head + data
            if len(head) < 2:
                self._head = head
                return b""
            self._head = b""
            self._d = zlib.decompressobj(zlib.MAX_WBITS if self._is_zlib_header(head) else -zlib.MAX_WBITS)
            data = head
        return self._run(data)

    def _run(self, data: bytes) -> bytes:
        d = self._d
        assert d is not None
        if not data:
            return b""
        if d.eof:
            raise self._fail(ValueError("data after the end of the deflate stream"))
        try:
            out = d.decompress(data) if self._meter is None else self._inflate(d, data)
        except zlib.error as exc:
            raise self._fail(exc) from None
        if d.eof:
            self.complete = True
            if d.unused_data:
                raise self._fail(ValueError("data after the end of the deflate stream"))
        return out

    def close(self) -> bytes:
        self._check()
        if self._d is None:
            if not self._head:
                return b""
            # The body was a single byte: decide on it alone; it cannot be a whole stream.
            head, self._head = self._head, b""
            self._d = zlib.decompressobj(zlib.MAX_WBITS if self._is_zlib_header(head) else -zlib.MAX_WBITS)
            out = self._run(head)
        else:
            out = b""
        try:
            return out + self._flush(self._d)
        except zlib.error as exc:  # pragma: no cover - flush after decompress does not fail
            raise self._fail(exc) from None


class _Brotli(_Base):
    """``br`` (RFC 7932)."""

    __slots__ = ("_d",)

    def __init__(self, meter: _Meter | None = None, **kw: bool) -> None:
        super().__init__("br", meter, **kw)
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        self._check()
        if self._meter is not None:
            return self._feed_limited(data)
        if not data:
            return b""
        if self.complete:
            # RFC 7932 defines one stream per body; brotli rejects bytes after its end.
            raise self._fail(ValueError("data after the end of the brotli stream"))
        try:
            out = self._d.process(data)
        except brotli.error as exc:
            raise self._fail(exc) from None
        if self._d.is_finished():
            self.complete = True
        return out

    def _feed_limited(self, data: bytes) -> bytes:
        """``feed`` in output-limited steps of one buffer block (see the module docstring)."""
        self._count_in(data)
        if not data:
            return b""
        cap = self._room() + self._out  # total output this stage may have produced
        d = self._d
        out = []
        view = memoryview(data) if len(data) > _BR_SLICE else None
        for pos in range(0, len(data), _BR_SLICE):
            if self.complete:
                raise self._fail(ValueError("data after the end of the brotli stream"))
            try:
                piece = d.process(data if view is None else view[pos : pos + _BR_SLICE], output_buffer_limit=1)
                while True:
                    if piece:
                        self._out += len(piece)
                        if self._out > cap:
                            raise self._over()
                        out.append(piece)
                    if d.is_finished():
                        self.complete = True
                        break
                    # More to drain: input the binding still holds, or output pending
                    # behind a full block (a call that produced nothing proves there is none).
                    if d.can_accept_more_data() and not piece:
                        break
                    piece = d.process(b"", output_buffer_limit=1)
            except brotli.error as exc:
                raise self._fail(exc) from None
        return b"".join(out)

    def close(self) -> bytes:
        self._check()
        return b""


class _Zstd(_Base):
    """``zstd`` (RFC 8878), frames decoded one after another (RFC 8878 §3.1)."""

    __slots__ = ("_d",)

    def __init__(self, meter: _Meter | None = None, **kw: bool) -> None:
        super().__init__("zstd", meter, **kw)
        self._d = zstd.ZstdDecompressor()

    def feed(self, data: bytes) -> bytes:
        self._check()
        if self._meter is not None:
            return self._feed_limited(data)
        out = []
        while data:
            try:
                out.append(self._d.decompress(data))
            except zstd.ZstdError as exc:
                raise self._fail(exc) from None
            if not self._d.eof:
                self.complete = False
                break
            # End of a frame; any further bytes start the next frame.
            self.complete = True
            data = self._d.unused_data
            self._d = zstd.ZstdDecompressor()
        return b"".join(out)

    def _feed_limited(self, data: bytes) -> bytes:
        self._count_in(data)
        if not data:
            return b""
        out = []
        while True:
            room = self._room()
            try:
                piece = self._d.decompress(data, max_length=room + 1)
            except zstd.ZstdError as exc:
                raise self._fail(exc) from None
            self._out += len(piece)
            if len(piece) > room:
                raise self._over()
            out.append(piece)
            if not self._d.eof:
                # Below max_length the decompressor has used up its input (needs_input); were
                # output still pending, the next round fetches it, within the budget again.
                if self._d.needs_input or not piece:
                    self.complete = False
                    break
                data = b""  # pragma: no cover - not reached below max_length
                continue  # pragma: no cover
            # End of a frame; any further bytes start the next frame.
            self.complete = True
            data = self._d.unused_data
            self._d = zstd.ZstdDecompressor()
            if not data:
                break
        return b"".join(out)

    def close(self) -> bytes:
        self._check()
        return b""


class _Chain:
    """Several codings: ``decoders`` in decoding order (the reverse of the field's order).

    With limits, ``meter`` counts the chain's encoded input once for all stages."""

    __slots__ = ("_decoders", "_error", "_meter")

    def __init__(self, decoders: list[ContentDecoder], meter: _Meter | None = None) -> None:
        self._decoders = decoders
        self._meter = meter
        self._error: ContentDecodingError | None = None

    @property
    def complete(self) -> bool:
        return all(d.complete for d in self._decoders)

    def feed(self, data: bytes) -> bytes:
        if self._error is not None:
            raise self._error
        if self._meter is not None:
            self._meter.encoded += len(data)
        try:
            for d in self._decoders:
                data = d.feed(data)
        except ContentDecodingError as exc:
            self._error = exc
            raise
        return data

    def close(self) -> bytes:
        if self._error is not None:
            raise self._error
        out = b""
        try:
            for d in self._decoders:
                out = d.feed(out) + d.close() if out else d.close()
        except ContentDecodingError as exc:
            self._error = exc
            raise
        return out


_CODINGS = {
    "gzip": _Gzip,
    "x-gzip": _Gzip,  # RFC 9110 §8.4.1.3: recipients SHOULD treat x-gzip as gzip
    "deflate": _Deflate,
    "br": _Brotli,
    "zstd": _Zstd,
}


def make_decoder(
    content_encoding: str | None,
    *,
    max_ratio: int | None = None,
    ratio_allowance_bytes: int = 1 << 20,
    max_output_bytes: int | None = None,
) -> ContentDecoder:
    """Returns a fresh decoder for a ``Content-Encoding`` field value (RFC 9110 §8.4).

    ``None``, ``""`` and ``identity`` give a pass-through decoder. The value is a comma-separated
    list; names are case-insensitive, whitespace around them and empty list elements are
    ignored (RFC 9110 §5.6.1), ``identity`` elements are skipped. Raises
    ``UnsupportedEncoding`` for any other coding (e.g. ``compress``).

    Limits (module docstring): the total decoded output may never exceed
    ``ratio_allowance_bytes + max_ratio * encoded_bytes_fed`` (if ``max_ratio`` is set) nor
    ``max_output_bytes`` (if set); past that, ``feed``/``close`` raise ``ContentDecodingError``
    with code ``"decompression_limit"`` after bounded work. Without either, output is
    unbounded. Raises ``ValueError`` for ``max_ratio < 1`` or negative byte counts.
    """
    if max_ratio is not None and max_ratio < 1:
        raise ValueError(f"max_ratio must be >= 1, got {max_ratio!r}")
    if ratio_allowance_bytes < 0:
        raise ValueError(f"ratio_allowance_bytes must be >= 0, got {ratio_allowance_bytes!r}")
    if max_output_bytes is not None and max_output_bytes < 0:
        raise ValueError(f"max_output_bytes must be >= 0, got {max_output_bytes!r}")
    names = [n.strip().lower() for n in (content_encoding or "").split(",")]
    names = [n for n in names if n and n != "identity"]
    for n in names:
        if n not in _CODINGS:
            raise UnsupportedEncoding(f"unsupported Content-Encoding: {n!r}")
    meter = None
    if max_ratio is not None or max_output_bytes is not None:
        meter = _Meter(max_ratio, ratio_allowance_bytes, max_output_bytes)
    if not names:
        return _Identity() if meter is None else _LimitedIdentity(meter)
    # Applied in list order, so undone in reverse (RFC 9110 §8.4).
    if len(names) == 1:
        return _CODINGS[names[0]](meter)
    if meter is None:
        return _Chain([_CODINGS[n]() for n in reversed(names)])
    last = len(names) - 1
    return _Chain(
        [_CODINGS[n](meter, counts_input=False, inner=i < last) for i, n in enumerate(reversed(names))],
        meter,
    )
