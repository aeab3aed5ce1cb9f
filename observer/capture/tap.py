"""The per-flow ``flow.response.stream`` callable: every chunk goes back to mitmproxy unchanged
(the same object) and is queued, with its arrival time, for the flow's backend."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from observer.capture.backend import Backend
from observer.capture.batcher import TapBatcher

log = logging.getLogger("observer.capture")


class StreamTap:
    """Returns each chunk unchanged and queues it with its arrival time (``time.time()``, epoch
    seconds) for ``backend`` (flow ``key``): handed over in the batcher's sweep, or at once when
    ``flush_bytes`` are waiting (bounded memory; big batches for bulk streams) or there is no
    batcher. Each batch also goes to the ``journal`` (``observer.journal.Journal.data``), once,
    before the backend sees it. Runs inside mitmproxy's core, so no method raises (an exception
    would silently drop the chunk for the client)."""

    __slots__ = (
        "_backend",
        "_batcher",
        "_flush_bytes",
        "_journal",
        "_journaled",
        "_key",
        "_pending",
        "_pending_bytes",
        "queued",
    )

    def __init__(
        self, key: str, backend: Backend, flush_bytes: int, batcher: TapBatcher | None = None, journal=None
    ) -> None:
        self._key = key
        self._backend = backend
        self._journal = journal
        self._journaled = 0  # leading items of _pending already given to the journal
        self._batcher = batcher
        self._flush_bytes = flush_bytes if batcher is not None else 0  # handed over at once from here
        self._pending: list = []  # chunk, arrival time, chunk, arrival time, ... (oldest first)
        self._pending_bytes = 0  # bytes in _pending
        self.queued = False  # in one of the batcher's queues (set and cleared by the batcher)

    def __call__(self, data: bytes) -> bytes:
        if data:
            try:
                pending = self._pending
                pending.append(data)
                pending.append(time.time())
                self._pending_bytes += len(data)
                batcher = self._batcher
                if batcher is None or self._pending_bytes >= self._flush_bytes:
                    self.flush()
                elif not self.queued and not batcher.mark(self):
                    self.flush()
            except Exception:  # fail open: the chunk goes on whatever happened here
                log.error("observer: stream tap failed", exc_info=True)
        return data

    def flush(self) -> None:
        """Hands every pending chunk over now (idempotent)."""
        self.observe(None, None)

    def observe(self, deadline: float | None, clock: Callable[[], float] | None) -> bool:
        """Hands the pending chunks over in arrival order; with a ``deadline`` (``clock()``
        seconds) the backend may stop once it has passed, and the rest stays pending. True when
        nothing is left. The list is taken off the tap before it is handed over, so a chunk is
        handed over exactly once."""
        pending = self._pending
        if not pending:
            return True
        nbytes = self._pending_bytes
        self._pending = []
        self._pending_bytes = 0
        journal = self._journal
        if journal is not None and len(pending) > self._journaled:
            try:
                if self._journaled:
                    new = pending[self._journaled :]
                    journal.data(self._key, new, sum(map(len, new[::2])))
                else:
                    journal.data(self._key, pending, nbytes)
            except Exception:  # noqa: BLE001 - never out of the tap
                log.error("observer: journaling chunks failed", exc_info=True)
        self._journaled = 0
        try:
            i = self._backend.data(self._key, pending, nbytes, deadline, clock)
        except Exception:  # noqa: BLE001 - never out of the tap; the backend does not raise
            log.error("observer: handing chunks to the backend failed", exc_info=True)
            return True
        if i < len(pending):  # the slice ran out
            rest = pending[i:]
            rest += self._pending  # (empty: nothing runs in between; kept in order anyway)
            self._pending = rest
            self._pending_bytes = sum(map(len, rest[::2]))
            self._journaled = len(rest)
            return False
        return True


__all__ = ["StreamTap"]
