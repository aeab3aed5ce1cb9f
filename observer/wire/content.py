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

Decompression bombs: output is not bounded here; a few bytes of input can expand to
gigabytes in one ``feed``. The caller must cap the decoded bytes it accepts per stream (and
should feed modest chunks, as the proxy does) -- that bound lives with the caller, which
knows its per-stream budget.
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

__all__ = ["ContentDecoder", "make_decoder"]


class ContentDecoder(Protocol):
    """Decodes one response body's content coding incrementally.

    - ``feed(data)``: compressed bytes in, decoded bytes out (possibly ``b""``). Raises
      ``ContentDecodingError`` on corrupt input.
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


class _Identity:
    """``identity``: no transformation (RFC 9110 §8.4.1)."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = True

    def feed(self, data: bytes) -> bytes:
        return data

    def close(self) -> bytes:
        return b""


class _Base:
    """Shared error handling: the first error is sticky (later calls raise it again)."""

    __slots__ = ("complete", "_error", "_name")

    def __init__(self, name: str) -> None:
        self.complete = False
        self._error: ContentDecodingError | None = None
        self._name = name

    def _fail(self, exc: BaseException) -> ContentDecodingError:
        self._error = ContentDecodingError(f"corrupt {self._name} content: {exc}")
        return self._error

    def _check(self) -> None:
        if self._error is not None:
            raise self._error


class _Gzip(_Base):
    """``gzip`` / ``x-gzip`` (RFC 1952), members decoded one after another."""

    __slots__ = ("_d", "_members")

    def __init__(self) -> None:
        super().__init__("gzip")
        self._d: zlib._Decompress | None = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._members = 0  # members completed

    def feed(self, data: bytes) -> bytes:
        self._check()
        out = []
        while data and self._d is not None:
            try:
                out.append(self._d.decompress(data))
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
            return self._d.flush()
        except zlib.error as exc:  # pragma: no cover - flush after decompress does not fail
            raise self._fail(exc) from None


class _Deflate(_Base):
    """``deflate``: zlib (RFC 1950) per RFC 9110 §8.4.1.2, or raw deflate (RFC 1951)."""

    __slots__ = ("_d", "_head")

    def __init__(self) -> None:
        super().__init__("deflate")
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
            out = d.decompress(data)
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
            return out + self._d.flush()
        except zlib.error as exc:  # pragma: no cover - flush after decompress does not fail
            raise self._fail(exc) from None


class _Brotli(_Base):
    """``br`` (RFC 7932)."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        super().__init__("br")
        self._d = brotli.Decompressor()

    def feed(self, data: bytes) -> bytes:
        self._check()
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

    def close(self) -> bytes:
        self._check()
        return b""


class _Zstd(_Base):
    """``zstd`` (RFC 8878), frames decoded one after another (RFC 8878 §3.1)."""

    __slots__ = ("_d",)

    def __init__(self) -> None:
        super().__init__("zstd")
        self._d = zstd.ZstdDecompressor()

    def feed(self, data: bytes) -> bytes:
        self._check()
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

    def close(self) -> bytes:
        self._check()
        return b""


class _Chain:
    """Several codings: ``decoders`` in decoding order (the reverse of the field's order)."""

    __slots__ = ("_decoders",)

    def __init__(self, decoders: list[ContentDecoder]) -> None:
        self._decoders = decoders

    @property
    def complete(self) -> bool:
        return all(d.complete for d in self._decoders)

    def feed(self, data: bytes) -> bytes:
        for d in self._decoders:
            data = d.feed(data)
        return data

    def close(self) -> bytes:
        out = b""
        for d in self._decoders:
            out = d.feed(out) + d.close() if out else d.close()
        return out


_CODINGS = {
    "gzip": _Gzip,
    "x-gzip": _Gzip,  # RFC 9110 §8.4.1.3: recipients SHOULD treat x-gzip as gzip
    "deflate": _Deflate,
    "br": _Brotli,
    "zstd": _Zstd,
}


def make_decoder(content_encoding: str | None) -> ContentDecoder:
    """Returns a fresh decoder for a ``Content-Encoding`` field value (RFC 9110 §8.4).

    ``None``, ``""`` and ``identity`` give a pass-through decoder. The value is a comma-separated
    list; names are case-insensitive, whitespace around them and empty list elements are
    ignored (RFC 9110 §5.6.1), ``identity`` elements are skipped. Raises
    ``UnsupportedEncoding`` for any other coding (e.g. ``compress``).
    """
    names = [n.strip().lower() for n in (content_encoding or "").split(",")]
    names = [n for n in names if n and n != "identity"]
    for n in names:
        if n not in _CODINGS:
            raise UnsupportedEncoding(f"unsupported Content-Encoding: {n!r}")
    if not names:
        return _Identity()
    # Applied in list order, so undone in reverse (RFC 9110 §8.4).
    decoders: list[ContentDecoder] = [_CODINGS[n]() for n in reversed(names)]
    return decoders[0] if len(decoders) == 1 else _Chain(decoders)
