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

Failure modes, each on the record, never a silently empty request:

- over the cap: ``oversize_request`` with ``body_bytes`` (declared, or as streamed);
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

#: The ``flow.metadata`` key of a held request body (``HeldRequest``).
HELD_KEY = "llm_audit.held"


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


def hold(view: RequestView, limits: Limits) -> HeldRequest:
    """The held body of ``view``: a ``RequestTap`` of ``max_request_bytes``, or, declared over
    it (``Content-Length``), no copy and its ``oversize_request``."""
    length = view.headers.get("content-length", "").strip()
    too_large = declared_too_large(length, limits)
    if too_large is not None:
        return HeldRequest(None, too_large, int(length))
    return HeldRequest(RequestTap(limits.max_request_bytes))


def adopt(state: FlowState, held: HeldRequest | None) -> None:
    """Makes ``held`` the request body of ``state``, a flow its response claimed: the copy is
    read as the request (``state.request_tap``, ``state.held``: read once the upload has
    ended); a body declared over the cap gives its size and ``oversize_request``; no held body
    (``None``) its size when declared and ``non_held_request``'s violation."""
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


__all__ = ["HELD_KEY", "HeldRequest", "adopt", "hold", "holders", "holds", "non_held_request"]
