"""Saved flows through the capture addon, hook by hook, as the live proxy runs them.

``Replay`` holds one ``observer.capture.hooks.LLMAudit`` (in-process parsing, ``worker=False``;
its records go to a sink of ours) inside a mitmproxy ``Master`` whose options are the proxy
settings (``observer.config.proxy_option_values``), so the addon is configured exactly as
``observer run`` configures it. Each flow is driven in the live order (shared reference
"mitmproxy-streaming" §2):

1. ``requestheaders`` (the flow without its response or error, as live at that point); a
   request stream callable the addon sets (an upload of undeclared size) gets the saved request
   body, then ``b""``; ``request``;
2. ``responseheaders`` with the saved response; when the addon sets its stream callable
   (``flow.response.stream``), the saved body is fed through it in ``CHUNK_BYTES`` pieces, then
   ``b""``;
3. ``error`` when the flow has an error, else ``response``.

Whether a flow is recorded, and what its record says, is the addon's: the hooks see what they
see live. What a saved flow cannot give, the result says instead of a record made up without
it: a body the addon needs that the file does not hold (``raw_content`` ``None``: a body the
proxy streamed), or no response and no error. Two record fields come from the flow, not from
the replay's clock: ``ended_at`` (the response's end, as live; an error's time) and ``ttft_s``,
which is ``None``: the arrival times of the chunks are not in the file.

A replay must run outside a running event loop (the addon finishes a record at once then; on a
loop it would defer it, ``LLMAudit.response``): ``Replay()`` raises ``RuntimeError`` inside one.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from mitmproxy import http, master, options
from mitmproxy.flow import Error

from observer.capture.hooks import METADATA_KEY, LLMAudit
from observer.config import Settings, proxy_option_values
from observer.identity import FingerprintKey
from observer.records import Exchange, utc_from_epoch

#: Bytes of a saved body handed to the stream callable at a time.
CHUNK_BYTES = 64 << 10


class Fate(enum.StrEnum):
    """What became of a replayed flow."""

    RECORDED = "recorded"  # the addon made a record (``FlowResult.record``)
    NOT_LLM = "not_llm"  # the addon did not observe it (not LLM traffic, as live)
    NO_RESPONSE_BODY = "no_response_body"  # observed, but the file holds no response body
    NO_REQUEST_BODY = "no_request_body"  # observed, but the file holds no request body
    NO_RESPONSE = "no_response"  # observed, but the file holds neither a response nor an error
    NO_REQUEST_TIME = "no_request_time"  # observed, but the flow has no request start time


@dataclass(slots=True)
class FlowResult:
    """A replayed flow's ``fate`` and, when recorded, its ``record`` (not yet given its id and
    provenance: ``observer.ingest.run``)."""

    fate: Fate
    record: Exchange | None = None


class Replay:
    """One addon for many flows (``run``); ``close`` ends it. ``settings``: the proxy settings
    the addon runs with; ``fingerprint_key``: the proxy's (``observer.identity``), for the
    records' ``key_fingerprint`` (``None``: none). Raises ``mitmproxy.exceptions.OptionsError`` when the addon refuses a
    setting (as ``mitmdump`` would at start), ``RuntimeError`` inside a running event loop."""

    def __init__(self, settings: Settings, fingerprint_key: FingerprintKey | None = None) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("a replay runs outside an event loop (the addon would defer its records)")
        self._records: list[Exchange] = []
        self.addon = LLMAudit(sink=self._sink, worker=False, fingerprint_key=fingerprint_key)
        # A loop is what a Master needs to exist; it never runs: the hooks see no running loop.
        self._loop = asyncio.new_event_loop()
        try:
            self._master = master.Master(options.Options(), event_loop=self._loop)
            self._master.addons.add(self.addon)
            self._master.options.update(**proxy_option_values(settings))
        except BaseException:
            self._loop.close()
            raise

    def _sink(self, record: Exchange) -> bool:
        self._records.append(record)
        return True

    def run(self, flow: http.HTTPFlow) -> FlowResult:
        """Drives ``flow`` through the hooks (module docstring) and says what became of it.
        The flow is changed (its streams set, its body taken off while the hooks run)."""
        self._records.clear()
        addon = self.addon
        response, error = flow.response, flow.error
        request_body = flow.request.raw_content
        flow.metadata.pop(METADATA_KEY, None)  # (what a dump may have kept of a live run's state)
        flow.response, flow.error = None, None
        flow.request.stream = False
        missing: Fate | None = None
        addon.requestheaders(flow)
        observed = METADATA_KEY in flow.metadata
        body_lacking = False  # the addon streams the upload (keeping a copy) and the file lacks it
        if callable(flow.request.stream):  # an upload of undeclared size, or one held until the response decides
            if request_body is None:
                body_lacking = True
            else:
                _feed(flow.request.stream, request_body)
        elif observed and flow.request.stream is False and request_body is None:
            missing = Fate.NO_REQUEST_BODY  # the addon reads the buffered body, which the file lacks
        if observed and flow.request.timestamp_start is None:
            missing = missing or Fate.NO_REQUEST_TIME  # the record would start at the replay's clock
        addon.request(flow)
        if response is not None:
            body = response.raw_content
            response.stream = False
            flow.response = response
            addon.responseheaders(flow)
            if callable(response.stream):
                if body is None:
                    missing = missing or Fate.NO_RESPONSE_BODY
                else:
                    _feed(response.stream, body)
            observed = observed or METADATA_KEY in flow.metadata
        if body_lacking and observed:  # only once the flow is observed (a held body's response decides)
            missing = Fate.NO_REQUEST_BODY  # before the others, as the file lacks the first thing read
        if response is None and error is None and observed:
            missing = missing or Fate.NO_RESPONSE
            error = Error("the capture holds no response for this flow")
        if error is not None:
            flow.error = error
            addon.error(flow)
        else:
            addon.response(flow)
        records, self._records = self._records, []
        if not records:
            return FlowResult(Fate.NOT_LLM if missing is None else missing)
        if missing is not None:
            return FlowResult(missing)
        (record,) = records  # one flow, one record
        record.ttft_s = None  # the chunks' arrival times are not in the file
        if error is not None:
            record.ended_at = utc_from_epoch(error.timestamp)
        elif response is not None:
            record.ended_at = utc_from_epoch(response.timestamp_end)
        return FlowResult(Fate.RECORDED, record)

    def close(self) -> None:
        """Ends the master (its ``done`` event reaches the addon, and it removes the log handler it
        put on the root logger: left there, a later log line was sent to this closed loop and
        failed with "Event loop is closed") and the loop."""
        try:
            self._loop.run_until_complete(self._master.done())
        finally:
            self._loop.close()

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _feed(stream, body: bytes) -> None:
    """``body`` through a mitmproxy stream callable in ``CHUNK_BYTES`` pieces, then the end (``b""``)."""
    for start in range(0, len(body), CHUNK_BYTES):
        stream(body[start : start + CHUNK_BYTES])
    stream(b"")


__all__ = ["CHUNK_BYTES", "Fate", "FlowResult", "Replay"]
