"""The messages between the proxy and its worker process (``observer.capture.link`` and
``observer.capture.worker``), and their framing on a pipe.

Each frame is a 4-byte little-endian payload length followed by a pickle (protocol 5) of one
message. Parent and worker are the same code, so the protocol is not versioned. The classes live
here, not in the worker's module, because that one runs as ``__main__`` in the worker, where
pickle would name its classes ``__main__.X``.

Proxy -> worker: ``Open``, ``Data``, ``Finish``, ``Stop``. Worker -> proxy: ``Turn`` (a turn of
a multi-turn stream ended, in answer to the ``Data`` that ended it), ``Facts`` (one per
``Finish``), ``Stopped`` (after the last ``Facts``, in answer to ``Stop``).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from observer.response import ResponseFacts, ResponseSpec, StreamEnd

HEADER_BYTES = 4  # the little-endian payload length
MAX_FRAME_BYTES = 1 << 30  # a frame announcing more is a protocol error (a corrupt pipe)


@dataclass(frozen=True, slots=True)
class Open:
    """Start observing flow ``fid`` (its record id), whose response ``spec`` describes."""

    fid: str
    spec: ResponseSpec


@dataclass(frozen=True, slots=True)
class Data:
    """For each ``(fid, pending)`` in ``batches``: ``pending`` = ``[chunk, arrival_s, chunk,
    arrival_s, ...]`` (bytes, epoch seconds), oldest first, exactly as the proxy forwarded them.
    The batches of all flows handed over in one loop callback travel in one frame."""

    batches: list[tuple[str, list]]


@dataclass(frozen=True, slots=True)
class Finish:
    """Flow ``fid``'s transport ended (``end``); ``skipped_bytes`` were forwarded but not sent
    (the pipe was over its bound), so its observation stopped at the first of them."""

    fid: str
    end: StreamEnd
    skipped_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Stop:
    """No more frames: answer ``Stopped`` after the last ``Facts`` and exit."""


@dataclass(frozen=True, slots=True)
class Turn:
    """Turn ``index`` (from 0) of flow ``fid``'s multi-turn stream ended: its facts
    (``observer.tap.StreamObserver.take_turns``). Always before that flow's ``Facts``."""

    fid: str
    index: int
    facts: ResponseFacts


@dataclass(frozen=True, slots=True)
class Facts:
    """The answer to ``Finish``: flow ``fid``'s response facts; ``None`` when its stream was cut
    into turns and nothing followed the last one (``observer.capture.parsing.final_facts``)."""

    fid: str
    facts: ResponseFacts | None


@dataclass(frozen=True, slots=True)
class Stopped:
    """The answer to ``Stop``."""


def encode(message: object) -> bytes:
    """One frame: 4-byte little-endian length + pickle (protocol 5) of ``message``."""
    payload = pickle.dumps(message, protocol=5)
    return len(payload).to_bytes(HEADER_BYTES, "little") + payload


class FrameReader:
    """Incremental frame decoder: ``feed(bytes)`` returns the messages the bytes complete, in
    order, whatever the chunking. Raises ``ValueError`` on a frame longer than
    ``MAX_FRAME_BYTES`` (a corrupt pipe); unpickling errors propagate."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list:
        buf = self._buf
        buf += data
        out = []
        pos, n = 0, len(buf)
        while n - pos >= HEADER_BYTES:
            size = int.from_bytes(buf[pos : pos + HEADER_BYTES], "little")
            if size > MAX_FRAME_BYTES:
                raise ValueError(f"frame of {size} bytes announced: corrupt pipe")
            end = pos + HEADER_BYTES + size
            if end > n:
                break
            out.append(pickle.loads(memoryview(buf)[pos + HEADER_BYTES : end]))
            pos = end
        if pos:
            del buf[:pos]
        return out

    @property
    def pending_bytes(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)


__all__ = ["Data", "Facts", "Finish", "FrameReader", "MAX_FRAME_BYTES", "Open", "Stop", "Stopped", "Turn", "encode"]
