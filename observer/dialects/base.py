"""The dialect contract: how a wire dialect is recognised, how its request is read, and how
its response messages map onto canonical events (DESIGN "observer/dialects")."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from observer.events import CanonicalEvent
from observer.records import RequestFacts, Violation
from observer.wire.sse import SSEEvent


@dataclass(frozen=True, slots=True)
class RequestView:
    """What is known of a request when its headers arrive (no body yet).

    ``headers`` has lower-case names; ``path`` includes the query string.
    """

    method: str
    host: str
    path: str
    headers: Mapping[str, str]

    @property
    def media_type(self) -> str:
        """The ``Content-Type`` without parameters, lower-cased ("" when absent), RFC 9110 §8.3.1."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()


class StreamAdapter(Protocol):
    """Maps one response's decoded messages onto canonical events (one instance per stream)."""

    def on_sse(self, event: SSEEvent) -> list[CanonicalEvent | Violation]:
        """Maps one SSE event; returns canonical events and violations in wire order."""
        ...

    def on_lost(self) -> None:
        """A wire event was dropped below the dialect (e.g. ``oversize_event``): its absence
        is already recorded and must not count again (e.g. as a ``seq`` gap)."""
        ...


class Dialect(Protocol):
    """One wire dialect. Implementations are stateless; per-stream state lives in the adapter."""

    name: str

    def matches(self, request: RequestView) -> bool:
        """True when this dialect speaks for the request (cheap: headers and path only)."""
        ...

    def parse_request(self, body: bytes) -> tuple[RequestFacts, list[Violation]]:
        """Reads the request body into ``RequestFacts``; never raises on bad input (violations instead)."""
        ...

    def new_adapter(self, request: RequestFacts) -> StreamAdapter:
        """A fresh adapter for one response stream of ``request``."""
        ...
