"""The parse of one response, as both backends run it (in the proxy process and in the worker):
an observer that is always built (``open_observer``), fed (``observer.tap.feed_pending``) and
finished (``finish_observer``) without an exception ever leaving. A failure is recorded on the
response's facts as ``observer_error`` and the bytes are still counted."""

from __future__ import annotations

import logging

from observer.dialects.registry import DialectRegistry
from observer.reassembly import Reassembler
from observer.records import Violation, ViolationKind, utc_from_epoch
from observer.response import ResponseFacts, ResponseSpec, StreamEnd
from observer.tap import StreamObserver

log = logging.getLogger("observer.capture")


class WorkerDied(Exception):
    """The observer worker process is gone (the message says why)."""


class WorkerOverloaded(Exception):
    """The worker fell behind: a flow's bytes past the bound were not observed."""


class FailedObserver:
    """Stands in for a ``StreamObserver`` that could not be built: counts bytes, and finishes
    with one ``observer_error`` (``detail``) and the outcome of a stream that was not read."""

    needs_arrival_times = False
    broken = True
    turns: tuple = ()  # never cuts turns (``StreamObserver.turns``)
    turns_cut = 0
    tail_empty = False

    def __init__(self, spec: ResponseSpec, detail: str) -> None:
        self._spec = spec
        self._facts = ResponseFacts(violations=[Violation(ViolationKind.OBSERVER_ERROR, None, detail)])

    @property
    def response_bytes(self) -> int:
        return self._facts.response_bytes

    def feed(self, data: bytes, now_s: float) -> None:
        self._facts.response_bytes += len(data)

    def skip(self, nbytes: int) -> None:
        self._facts.response_bytes += nbytes

    def fail(self, exc: BaseException) -> None:
        pass

    def take_turns(self) -> list:
        return []

    def finish(self, end: StreamEnd) -> ResponseFacts:
        facts = self._facts
        facts.transport_error = end.transport_error
        facts.ended_at = utc_from_epoch(end.at_s)
        Reassembler(limits=self._spec.limits).finish(
            facts, end.cause, request_start_s=self._spec.started_at_s, readable=False
        )
        return facts


Observer = StreamObserver | FailedObserver


def open_observer(registry: DialectRegistry, spec: ResponseSpec, where: str) -> Observer:
    """The observer of the response ``spec`` describes; a ``FailedObserver`` (detail
    ``"<where>: <exception>"``) when it cannot be built (an unknown dialect, a bug)."""
    try:
        return StreamObserver(registry.get(spec.dialect), spec)
    except Exception as exc:  # noqa: BLE001 - recorded on the flow's facts
        log.error("observer: cannot observe a %s response (%s)", spec.dialect, where, exc_info=True)
        return FailedObserver(spec, f"{where}: {type(exc).__name__}: {exc}")


def failed_observer(registry: DialectRegistry, spec: ResponseSpec, exc: BaseException, counted_bytes: int) -> Observer:
    """An observer for a flow whose observation already stopped (``exc`` says why; recorded as
    ``observer_error``) after ``counted_bytes`` were forwarded: it only counts from here on."""
    obs = open_observer(registry, spec, "open")
    obs.fail(exc)
    obs.skip(counted_bytes)
    return obs


def finish_observer(obs: Observer, end: StreamEnd, skipped_bytes: int = 0) -> ResponseFacts:
    """The facts of the response ``obs`` observed. ``skipped_bytes`` were forwarded but not
    observed (the worker fell behind): observation stopped at the first of them
    (``observer_error``, ``WorkerOverloaded``) and they are counted. Never raises: a failed
    finish gives facts with the bytes counted and an ``observer_error``."""
    try:
        if skipped_bytes:
            obs.fail(WorkerOverloaded(f"the worker fell behind; the last {skipped_bytes} bytes were not observed"))
            obs.skip(skipped_bytes)
        return obs.finish(end)
    except Exception as exc:  # noqa: BLE001 - never lose the record
        log.error("observer: finishing a %s response failed", type(obs).__name__, exc_info=True)
        return ResponseFacts(
            ended_at=utc_from_epoch(end.at_s),
            transport_error=end.transport_error,
            response_bytes=obs.response_bytes,
            violations=[Violation(ViolationKind.OBSERVER_ERROR, None, f"finish: {type(exc).__name__}")],
        )


def final_facts(obs: Observer, end: StreamEnd, skipped_bytes: int = 0) -> ResponseFacts | None:
    """``finish_observer``'s facts, or ``None`` when ``obs`` cut its stream into turns and
    nothing of a record followed the last one (``StreamObserver.tail_empty``): no record."""
    facts = finish_observer(obs, end, skipped_bytes)
    return None if obs.tail_empty else facts


__all__ = [
    "FailedObserver",
    "Observer",
    "WorkerDied",
    "WorkerOverloaded",
    "failed_observer",
    "final_facts",
    "finish_observer",
    "open_observer",
]
