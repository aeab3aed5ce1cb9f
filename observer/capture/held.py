"""Request bodies held on the side while they stream on, for a response that may still show an
LLM dialect: an AI SDK UI stream is known by its response header only
(``x-vercel-ai-ui-message-stream``), on an app-defined route (``/api/assistant``), so when its
request's headers arrive nothing says it is LLM traffic. Pure: no mitmproxy, no clock.

Which requests (``holds``): on an LLM host only (``observer.hosts``; the response-recognised
dialects count only there, ``DialectRegistry.classify_response``), not claimed by a dialect
from its headers, and one that a dialect with ``may_match_response(view)`` names (the AI SDK's:
a ``POST`` of JSON, ``text/plain`` or no media type). Any other request streams on unkept, as
before.

How (``hold``): the body is never delayed or buffered on the wire: it is the request's
``flow.request.stream`` callable (``RequestTap``), which hands every chunk on unchanged and
keeps a copy of at most ``max_request_bytes`` (``observer.limits``). The copy lives until the
response headers decide: claimed, it becomes the record's request (``adopt``), else it is
dropped (``RequestTap.release``). A body declared over the cap (``Content-Length``) is not
copied at all.

What it costs: per held request, one copy of its body in the proxy's memory (at most
``max_request_bytes``, 16 MiB by default) from its first chunk until its response headers
(usually milliseconds after the upload ended), and a ``bytearray`` append per chunk. An LLM
host's requests that a dialect claims by their headers (chat completions, messages, ...) are
not held: they are read as before.

All held copies together are bounded too (``HeldBudget``, ``max_held_request_bytes``, 64 MiB by
default; one per proxy, owned by its addon with the table of held requests, ``HeldRequests``):
many parallel uploads must not make the proxy hold N x 16 MiB of bodies that are mostly not LLM
traffic (``bench/held.py``, docs/performance.md: twelve parallel 15 MB uploads took +184 MB of
proxy RSS before, +75 MB with the default budget). Each chunk's
bytes are reserved as they are copied and given back when the copy is dropped (``release``:
not LLM; the flow's response, error, client connection or the proxy ended) or adopted (it is
the record's request from then on, kept per flow as any observed request body is). When a
chunk does not fit, that flow's copy stops and what it held is dropped at once (not kept half):
half a body cannot be parsed, so keeping it would only hold memory that other copies can use
to finish; the flow streams on untouched, its bytes counted. A body whose declared
``Content-Length`` does not fit in what is free is not copied at all (never a copy started
only to be dropped). No other flow's copy is evicted to make room: the flow whose chunk does
not fit is the one whose copy stops.

Failure modes, each on the record, never a silently empty request:

- over the cap: ``oversize_request`` with ``body_bytes`` (declared, or as streamed);
- over the shared budget: ``oversize_request`` naming ``max_held_request_bytes``, with
  ``body_bytes`` as streamed (a kind of its own would say nothing more: the body was not
  parsed for a memory cap, and the detail names which);
- still uploading when the response headers arrive (HTTP/2, or an HTTP/1.1 server answering
  early): the body is read when the upload ends (the ``request`` hook, which mitmproxy runs at
  the end of a streamed upload, also after the response started); when the exchange ends first,
  ``incomplete_request`` with the bytes seen (``observer.capture.flows.FlowTable.finish``);
- HTTP/2: the same callable sees each DATA frame (mitmproxy's ``HttpStream`` is the same for
  HTTP/1.1 and HTTP/2); a request whose HEADERS end the stream has no body (``body_bytes`` 0);
- claimed by its response but not held (a ``GET`` resuming a stream has no body; a multipart
  ``POST`` is not a UI request): ``non_held_request`` says whether a body went unkept.
"""

from __future__ import annotations

from dataclasses import dataclass

from observer.capture.flows import FlowState
from observer.capture.request import RequestTap, declared_too_large
from observer.dialects.base import Dialect, RequestView
from observer.limits import Limits
from observer.records import Violation, ViolationKind


class HeldBudget:
    """The bytes of held request copies across all flows of one proxy, at most ``limit_bytes``
    (``max_held_request_bytes``). ``RequestTap`` reserves each chunk as it copies it and gives
    its bytes back when its copy is dropped or adopted; ``used_bytes`` is then the bytes held
    now, ``peak_bytes`` the most ever held at once, ``refused`` the copies stopped or not
    started for want of budget. ``limit_bytes`` may change while copies are held (a smaller
    one refuses new bytes until enough are given back)."""

    __slots__ = ("limit_bytes", "peak_bytes", "refused", "used_bytes")

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.peak_bytes = 0
        self.refused = 0

    def fits(self, n_bytes: int) -> bool:
        """True when ``n_bytes`` more fit now; else False, counted in ``refused``."""
        if self.used_bytes + n_bytes <= self.limit_bytes:
            return True
        self.refused += 1
        return False

    def reserve(self, n_bytes: int) -> bool:
        """Reserves ``n_bytes`` of copy; False (nothing reserved, counted in ``refused``) when
        they do not fit."""
        if not self.fits(n_bytes):
            return False
        self.used_bytes += n_bytes
        self.peak_bytes = max(self.peak_bytes, self.used_bytes)
        return True

    def give_back(self, n_bytes: int) -> None:
        """Gives back ``n_bytes`` reserved before (a copy dropped or adopted)."""
        self.used_bytes -= n_bytes


@dataclass(slots=True)
class HeldRequest:
    """A request body kept on the side: ``tap`` (the request's stream callable and the copy),
    or, for a body declared over the cap, ``too_large`` (its ``oversize_request``) and
    ``declared_bytes`` (its ``Content-Length``) with no copy made (``tap`` ``None``)."""

    tap: RequestTap | None
    too_large: Violation | None = None
    declared_bytes: int = 0

    def release(self) -> None:
        """Not LLM traffic after all: the copy is dropped and no further chunk is copied."""
        if self.tap is not None:
            self.tap.release()


def holders(dialects: tuple[Dialect, ...]) -> tuple[Dialect, ...]:
    """The dialects of ``dialects`` that may claim a request by its response
    (``may_match_response``)."""
    return tuple(d for d in dialects if callable(getattr(d, "may_match_response", None)))


def holds(candidates: tuple[Dialect, ...], view: RequestView, llm_host: bool) -> bool:
    """True when the body of ``view`` (a request no dialect claimed by its headers) is to be
    held: an LLM host's, named by one of ``candidates`` (``holders``)."""
    return llm_host and any(d.may_match_response(view) for d in candidates)  # type: ignore[attr-defined]


class HeldRequests:
    """The held request bodies of one proxy (its addon's) and their ``budget``: by flow id, and
    by client connection, so that a connection that closed drops the copies of its flows that
    mitmproxy ended without a hook (``release_client``), and the proxy's end drops the rest
    (``release_all``). ``pop`` hands one over to be adopted or released."""

    __slots__ = ("_clients", "_flows", "budget")

    def __init__(self, budget: HeldBudget) -> None:
        self.budget = budget
        self._flows: dict[str, tuple[str, HeldRequest]] = {}  # flow id -> (client connection id, held)
        self._clients: dict[str, set[str]] = {}  # client connection id -> its flow ids

    def __len__(self) -> int:
        return len(self._flows)

    def add(self, flow_id: str, client_id: str, held: HeldRequest) -> None:
        self.release(flow_id)  # (a flow holds one body)
        self._flows[flow_id] = (client_id, held)
        self._clients.setdefault(client_id, set()).add(flow_id)

    def pop(self, flow_id: str) -> HeldRequest | None:
        """The held body of flow ``flow_id``, no longer in the table, or ``None``; the caller
        adopts or releases it."""
        entry = self._flows.pop(flow_id, None)
        if entry is None:
            return None
        client_id, held = entry
        ids = self._clients.get(client_id)
        if ids is not None:
            ids.discard(flow_id)
            if not ids:
                del self._clients[client_id]
        return held

    def release(self, flow_id: str) -> None:
        """Drops the held body of flow ``flow_id``, if any."""
        held = self.pop(flow_id)
        if held is not None:
            held.release()

    def release_client(self, client_id: str) -> int:
        """Drops the held bodies of client connection ``client_id``; how many."""
        ids = list(self._clients.get(client_id, ()))
        for flow_id in ids:
            self.release(flow_id)
        return len(ids)

    def release_all(self) -> int:
        """Drops every held body (the proxy stops); how many."""
        ids = list(self._flows)
        for flow_id in ids:
            self.release(flow_id)
        return len(ids)


def hold(view: RequestView, limits: Limits, budget: HeldBudget) -> HeldRequest:
    """The held body of ``view``: a ``RequestTap`` of ``max_request_bytes`` whose copy is
    reserved in ``budget``; declared over ``max_request_bytes`` (``Content-Length``), no copy
    and its ``oversize_request``; declared over what ``budget`` has free, a tap that copies
    nothing (``RequestTap.starve``: its bytes still counted)."""
    length = view.headers.get("content-length", "").strip()
    too_large = declared_too_large(length, limits)
    if too_large is not None:
        return HeldRequest(None, too_large, int(length))
    tap = RequestTap(limits.max_request_bytes, budget=budget)
    if length.isdigit() and not budget.fits(int(length)):
        tap.starve()
    return HeldRequest(tap)


def adopt(state: FlowState, held: HeldRequest | None) -> None:
    """Makes ``held`` the request body of ``state``, a flow its response claimed: the copy is
    read as the request (``state.request_tap``, ``state.held``: read once the upload has
    ended), its bytes given back to the held budget (``RequestTap.detach``); a body declared
    over the cap gives its size and ``oversize_request``; no held body (``None``) its size when
    declared and ``non_held_request``'s violation."""
    request = state.exchange.request
    if held is None:
        state.parsed = True
        length = state.view.headers.get("content-length", "").strip()
        if length.isdigit():
            request.body_bytes = int(length)
        lost = non_held_request(state.view)
        if lost is not None:
            state.violations.append(lost)
    elif held.tap is None:
        state.parsed = True
        request.body_bytes = held.declared_bytes
        if held.too_large is not None:
            state.violations.append(held.too_large)
    else:
        held.tap.detach()  # the record's request now: out of the budget of undecided copies
        state.request_tap = held.tap
        state.held = True


def non_held_request(view: RequestView) -> Violation | None:
    """The violation of a request claimed by its response whose body was not held (streamed on
    unkept): ``invalid_request`` naming its method and media type when it had a body (declared
    ``Content-Length`` above 0, or undeclared with ``Transfer-Encoding``), else ``None`` (a
    ``GET`` or an empty body: nothing was lost)."""
    length = view.headers.get("content-length", "").strip()
    chunked = "transfer-encoding" in view.headers
    if not (chunked or (length.isdigit() and int(length) > 0)):
        return None
    size = f" of {length} bytes" if length.isdigit() else ""
    kind = view.media_type or "no media type"
    return Violation(
        ViolationKind.INVALID_REQUEST,
        None,
        f"request body{size} not kept: a {view.method} of {kind} is not held until the response headers"
        " (only the requests a response-recognised dialect may answer are: observer.capture.held)",
    )


__all__ = ["HeldBudget", "HeldRequest", "HeldRequests", "adopt", "hold", "holders", "holds", "non_held_request"]
