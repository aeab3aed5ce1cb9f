"""The tap batcher: streamed chunks are handed to their backend in timed sweeps instead of one by
one inside mitmproxy's per-chunk path (why, with the measurements: docs/performance.md,
"Capture path: batches and slices")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("observer.capture")


class Handle(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """What the batcher needs of an event loop (``asyncio.AbstractEventLoop`` has both)."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> Handle: ...

    def call_soon(self, callback: Callable[[], object]) -> Handle: ...


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The scheduler of a batcher on mitmproxy's loop: the running event loop, or ``None``
    (outside one: the taps hand their chunks over inline)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class Batched(Protocol):
    """A tap as the batcher sees it (``observer.capture.tap.StreamTap``)."""

    queued: bool

    def observe(self, deadline: float | None, clock: Callable[[], float] | None) -> bool: ...

    def flush(self) -> None: ...


class TapBatcher:
    """Runs the taps' pending chunks in sweeps: one ``call_later`` callback every ``interval_s``
    seconds starts a sweep that hands over every chunk queued since, tap after tap, in slices
    of at most ``slice_s`` seconds each (``clock()`` seconds, read after each chunk; a slice that
    ran out continues in a ``call_soon`` callback, behind the I/O that became ready meanwhile).

    Rules: taps are visited in the order they were queued; a tap whose slice ran out goes to the
    back of the sweep, so a flow with many chunks delays the others by at most one slice. A tap
    is in at most one queue at a time (``queued``) and takes its chunks off its list before
    feeding them, so no chunk is handed over twice or out of order, whichever of a slice, the
    tap's own size flush or the finishing ``flush`` comes first. Taps queued after a sweep began
    wait for the next timed sweep (a sweep that took in new arrivals would never end under
    load). ``interval_s <= 0``, or ``scheduler()`` returning ``None`` (no event loop), means
    inline: ``mark`` returns False and the tap hands its chunk over at once. ``slice_s <= 0``: a
    sweep is one callback. ``drain`` (shutdown) hands over everything queued and cancels the
    callbacks. No method raises."""

    __slots__ = ("_clock", "_cont", "_dirty", "_scheduler", "_sweep", "_timer", "interval_s", "slice_s")

    def __init__(
        self,
        scheduler: Callable[[], Scheduler | None],
        interval_s: float = 0.05,
        slice_s: float = 0.0005,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._scheduler = scheduler  # the event loop to schedule on, or None (inline)
        self.interval_s = interval_s  # seconds between timed sweeps; <= 0: inline
        self.slice_s = slice_s  # seconds of parsing per loop callback; <= 0: no limit
        self._clock = clock  # seconds, monotonic
        self._dirty: list[Batched] = []  # queued for the next timed sweep
        self._sweep: deque[Batched] = deque()  # the sweep in progress: taps not yet fully handed over
        self._timer: Handle | None = None  # the next timed sweep
        self._cont: Handle | None = None  # the next slice of the sweep in progress

    def mark(self, tap: Batched) -> bool:
        """Queues ``tap`` for the next sweep; False when no sweep can be scheduled (hand over now)."""
        if self._timer is None:
            if self.interval_s <= 0:
                return False
            scheduler = self._scheduler()
            if scheduler is None:
                return False
            self._timer = scheduler.call_later(self.interval_s, self.sweep)
        tap.queued = True
        self._dirty.append(tap)
        return True

    def sweep(self) -> None:
        """The timed callback: the taps queued since the last sweep join the sweep in progress
        (if a slow one is still going) or start one, whose first slice runs now."""
        if self._timer is not None:
            self._timer.cancel()  # no-op when this is the timer firing; a direct call replaces it
            self._timer = None
        self._sweep.extend(self._dirty)
        self._dirty = []
        if self._cont is None:
            self._slice()

    def _slice(self) -> None:
        """Hands over queued taps, oldest first, until the queue is empty or ``slice_s`` has
        passed (at least one chunk); schedules the next slice if any remain."""
        self._cont = None
        queue = self._sweep
        clock = self._clock
        try:
            deadline = clock() + self.slice_s if self.slice_s > 0 else None
            while queue:
                tap = queue[0]
                if not tap.observe(deadline, clock):
                    queue.rotate(-1)  # its slice ran out: to the back, behind the taps not yet visited
                    break
                queue.popleft()
                tap.queued = False
                if deadline is not None and queue and clock() >= deadline:
                    break
        except Exception:  # noqa: BLE001 - a loop callback must not raise; observe does not
            log.error("observer: tap sweep failed", exc_info=True)
        if queue:
            scheduler = self._scheduler()
            if scheduler is not None:
                self._cont = scheduler.call_soon(self._slice)
            else:  # no event loop any more: the rest now
                self.drain()

    def drain(self) -> None:
        """Hands over every queued chunk now, in one go, and cancels the scheduled callbacks
        (shutdown: nothing is left waiting for a loop that is stopping)."""
        for handle in (self._timer, self._cont):
            if handle is not None:
                handle.cancel()
        self._timer = self._cont = None
        taps = [*self._sweep, *self._dirty]
        self._sweep.clear()
        self._dirty = []
        for tap in taps:
            tap.queued = False
            tap.flush()


__all__ = ["Scheduler", "TapBatcher", "running_loop"]
