"""Baseline mitmproxy addon for the bench and the e2e harness: streams every response through
unchanged (``flow.response.stream = True`` in ``responseheaders``) and records nothing.

Without it mitmproxy buffers whole responses, so an SSE stream would reach the client in one
lump at its end (mitmproxy 12 buffers bodies by default). Load with
``mitmdump -q -s bench/passthrough_addon.py``.
"""

from mitmproxy import http


class Passthrough:
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            flow.response.stream = True


addons = [Passthrough()]
