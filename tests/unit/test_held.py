"""The budget of held request bodies across flows (``observer.capture.held.HeldBudget``,
setting ``max_held_request_bytes``): reserved as bytes are copied, given back when a copy is
dropped or adopted and on every end of its flow, never a silently empty request when a copy had
to stop. Expected values are counted by hand in the comments."""

from __future__ import annotations

import pytest
from mitmproxy import http
from mitmproxy.flow import Error

from observer.capture.held import HeldBudget, hold
from observer.capture.request import RequestTap
from observer.dialects.base import RequestView
from observer.limits import Limits

# A UI request of exactly 100 bytes: 80 before the text, the 14 characters of "hello, budget!",
# and the 6 of '"}]}]}'.
REQ = b'{"id":"c9","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"hello, budget!"}]}]}'
MESSAGES = [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello, budget!"}]}]
UI_STREAM = (
    b'data: {"type":"start"}\n\n'
    b'data: {"type":"text-start","id":"t"}\n\n'
    b'data: {"type":"text-delta","id":"t","delta":"ok"}\n\n'
    b'data: {"type":"text-end","id":"t"}\n\n'
    b'data: {"type":"finish","finishReason":"stop"}\n\ndata: [DONE]\n\n'
)
UI_HEADERS = {"content-type": "text/event-stream", "x-vercel-ai-ui-message-stream": "v1"}
JSON_HEADERS = {"content-type": "application/json"}


def budget_violation(limit_bytes: int) -> tuple[str, str]:
    return (
        "oversize_request",
        "request body not parsed: its copy was dropped, the request bodies held at once across all flows"
        f" reached max_held_request_bytes ({limit_bytes} bytes)",
    )


# ----- the budget and the tap, pure -----


def test_the_budget_is_shared_by_the_copies_of_several_flows():
    """Budget 250 bytes, three copies. The chunk that does not fit stops its own copy, which
    gives back all it held at once; a copy adopted (``detach``) gives its bytes back and copies
    on outside the budget."""
    budget = HeldBudget(250)
    a, b, c = (RequestTap(1000, budget=budget) for _ in range(3))
    a(b"a" * 100)  # 100
    b(b"b" * 100)  # 200
    c(b"c" * 40)  # 240
    assert (budget.used_bytes, budget.peak_bytes, budget.refused) == (240, 240, 0)
    a(b"a" * 20)  # 260 > 250: a stops and gives back its 100 -> 140
    assert (a.starved, a.body(), budget.used_bytes, budget.refused) == (True, None, 140, 1)
    c(b"c" * 60)  # 200
    b(b"b" * 50)  # 250: exactly the budget, fits
    assert (budget.used_bytes, budget.peak_bytes) == (250, 250)
    c(b"c")  # 251 > 250: c stops and gives back its 100 -> 150 (b's)
    assert (c.starved, c.body(), budget.used_bytes, budget.refused) == (True, None, 150, 2)
    assert a(b"a" * 10) == b"a" * 10  # passed on, counted (130), not copied, nothing reserved
    assert (a.total_bytes, budget.used_bytes) == (130, 150)
    b.detach()  # adopted: its 150 back -> 0
    assert budget.used_bytes == 0
    b(b"B" * 500)  # copied on without the budget (its own cap: 1000)
    assert (b.body(), budget.used_bytes, budget.peak_bytes) == (b"b" * 150 + b"B" * 500, 0, 250)
    assert (a.starved, b.starved, c.starved) == (True, False, True)


def test_every_way_a_copy_ends_gives_its_bytes_back_once():
    """``release`` (not LLM), the per-flow cap, ``starve`` and ``detach`` each give back what the
    copy held, once: a second call gives back nothing."""
    budget = HeldBudget(1000)
    released, capped, starved, adopted = (RequestTap(100, budget=budget) for _ in range(4))
    for tap, n in ((released, 10), (capped, 90), (starved, 30), (adopted, 40)):
        tap(b"x" * n)
    assert budget.used_bytes == 170  # 10 + 90 + 30 + 40
    released.release()
    released.release()
    assert budget.used_bytes == 160
    capped(b"x" * 11)  # 101 > its own cap of 100: dropped, not starved
    assert (capped.over, capped.starved, budget.used_bytes) == (True, False, 70)
    starved.starve()
    starved.release()
    assert budget.used_bytes == 40
    adopted.detach()
    adopted.detach()
    adopted.release()  # (an adopted copy dropped later: already outside the budget)
    assert (budget.used_bytes, budget.refused) == (0, 0)
    limits = Limits(max_request_bytes=100, max_held_request_bytes=1000)
    assert capped.overflow(limits).detail == "request body over 100 bytes not parsed"
    assert (starved.overflow(limits).kind.value, starved.overflow(limits).detail) == budget_violation(1000)


def test_a_body_declared_over_what_is_free_is_not_copied_at_all():
    """``Content-Length`` 50 with 40 of 100 bytes free: no copy started (its bytes still
    counted); 40 fits exactly and is copied; over ``max_request_bytes``: no tap (as before)."""
    budget = HeldBudget(100)
    budget.reserve(60)
    limits = Limits(max_request_bytes=80)

    def view(length: str) -> RequestView:
        return RequestView(
            "POST", "app.example", "/api/x", {"content-type": "application/json", "content-length": length}
        )

    late = hold(view("50"), limits, budget)
    assert late.tap is not None and (late.tap.starved, budget.used_bytes, budget.refused) == (True, 60, 1)
    assert late.tap(b"y" * 50) == b"y" * 50
    assert (late.tap.total_bytes, late.tap.body(), budget.used_bytes) == (50, None, 60)
    fits = hold(view("40"), limits, budget)
    fits.tap(b"z" * 40)
    assert (fits.tap.starved, fits.tap.body(), budget.used_bytes) == (False, b"z" * 40, 100)
    huge = hold(view("81"), limits, budget)
    assert (huge.tap, huge.declared_bytes, budget.refused) == (None, 81, 1)


# ----- through the addon, hook by hook -----


class _Proxy:
    """The addon around an AI SDK app host (``app.example``, an LLM host by
    ``llm_hosts_extra``), driven hook by hook as mitmproxy drives streamed uploads."""

    def __init__(self, tctx, addon, records) -> None:
        self.tctx, self.addon, self.records = tctx, addon, records

    @property
    def budget(self) -> HeldBudget:
        return self.addon.held_requests.budget

    def flow(self, length: int | None = None, client=None):
        from mitmproxy.test import tflow

        f = tflow.tflow(client_conn=client) if client is not None else tflow.tflow()
        f.request.method, f.request.host, f.request.path = "POST", "app.example", "/api/assistant"
        f.request.headers.clear()
        f.request.headers["content-type"] = "application/json"
        if length is not None:
            f.request.headers["content-length"] = str(length)
        f.request.data.content = None  # streamed: mitmproxy keeps no copy
        f.request.timestamp_end = None  # still uploading
        f.request.stream = False
        self.addon.requestheaders(f)
        assert callable(f.request.stream)
        return f

    def send(self, f, chunk: bytes) -> None:
        assert f.request.stream(chunk) is chunk  # passed on unchanged, the same object

    def end_upload(self, f) -> None:
        f.request.stream(b"")
        f.request.timestamp_end = f.request.timestamp_start + 0.01
        self.addon.request(f)

    def respond(self, f, headers=UI_HEADERS, body=UI_STREAM, finish=True) -> None:
        f.response = http.Response.make(200, b"", headers)
        f.response.stream = False
        self.addon.responseheaders(f)
        tap = f.response.stream
        assert tap is True or tap(body) is body
        if finish:
            self.addon.response(f)

    def record_of(self, f) -> dict:
        from observer.capture.request import flow_record_id

        (rec,) = [r for r in self.records if r["id"] == flow_record_id(f.id)]
        return rec


@pytest.fixture
def proxy():
    from mitmproxy.test import taddons

    from observer.capture.hooks import LLMAudit

    records: list = []
    addon = LLMAudit(sink=lambda r: records.append(r.to_dict()) or True, worker=False)
    with taddons.context(addon) as tctx:

        def make(budget_bytes: int) -> _Proxy:
            tctx.configure(addon, observer_llm_hosts_extra="app.example", observer_max_held_request_bytes=budget_bytes)
            return _Proxy(tctx, addon, records)

        yield make


def test_each_addon_owns_its_budget_and_the_setting_sets_it():
    from mitmproxy.test import taddons

    from observer.capture.hooks import LLMAudit

    one, two = LLMAudit(sink=lambda r: True, worker=False), LLMAudit(sink=lambda r: True, worker=False)
    assert one.held_requests.budget is not two.held_requests.budget
    assert one.held_requests.budget.limit_bytes == 64 << 20 == Limits().max_held_request_bytes
    with taddons.context(one) as tctx:
        tctx.configure(one, observer_max_held_request_bytes=1234)
    assert (one.held_requests.budget.limit_bytes, two.held_requests.budget.limit_bytes) == (1234, 64 << 20)


def test_a_copy_stopped_by_the_budget_is_recorded_as_oversize_with_its_size(proxy):
    """Budget 150 bytes; two uploads of the 100-byte request in chunks of 50, interleaved:
    f1 50 (50), f2 50 (100), f1 50 (150: fits exactly), f2 50 (200 > 150: f2's copy stops and
    gives back its 50 -> 100). Both answers are AI SDK streams: f1's record has its request,
    f2's its 100 bytes as streamed and the budget's ``oversize_request`` (never silently
    empty); both streams complete. Afterwards nothing is held."""
    p = proxy(150)
    f1, f2 = p.flow(), p.flow()
    p.send(f1, REQ[:50])
    p.send(f2, REQ[:50])
    p.send(f1, REQ[50:])
    assert p.budget.used_bytes == 150
    p.send(f2, REQ[50:])
    assert (p.budget.used_bytes, p.budget.peak_bytes, p.budget.refused) == (100, 150, 1)
    for f in (f1, f2):
        p.end_upload(f)
        p.respond(f)
    kept, dropped = p.record_of(f1), p.record_of(f2)
    assert (kept["request"]["messages"], kept["request"]["body_bytes"], kept["violations"]) == (MESSAGES, 100, [])
    assert (dropped["request"]["messages"], dropped["request"]["body_bytes"]) == ([], 100)
    assert [(v["kind"], v["detail"]) for v in dropped["violations"]] == [budget_violation(150)]
    assert [(r["dialect"], r["outcome"], r["text"]) for r in (kept, dropped)] == [("vercel.ui", "completed", "ok")] * 2
    assert (len(p.addon.held_requests), p.budget.used_bytes) == (0, 0)


def test_a_body_declared_over_the_free_budget_is_not_copied_and_says_so(proxy):
    """Budget 150 bytes; f1 declares 100 and holds them; f2 declares 100 (100 + 100 > 150): not
    copied, not even its first 40 bytes (which would fit), its bytes counted. f1's answer is
    plain JSON (no record, its 100 given back); f2's is an AI SDK stream: 100 bytes and the
    budget's ``oversize_request``."""
    p = proxy(150)
    f1 = p.flow(length=100)
    p.send(f1, REQ)
    f2 = p.flow(length=100)
    p.send(f2, REQ[:40])
    assert (p.budget.used_bytes, p.budget.refused) == (100, 1)
    p.send(f2, REQ[40:])
    p.end_upload(f1)
    p.respond(f1, headers=JSON_HEADERS, body=b'{"ok":true}')
    assert p.budget.used_bytes == 0
    p.end_upload(f2)
    p.respond(f2)
    (rec,) = p.records
    assert (rec["request"]["messages"], rec["request"]["body_bytes"]) == ([], 100)
    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == [budget_violation(150)]
    assert len(p.addon.held_requests) == 0


def test_a_budget_of_zero_holds_nothing(proxy):
    """``max_held_request_bytes = 0``: no body is copied; a claimed one is ``oversize_request``
    with its size as streamed (an upload of undeclared size: chunked or HTTP/2)."""
    p = proxy(0)
    f = p.flow()
    p.send(f, REQ[:30])
    p.send(f, REQ[30:])
    assert (p.budget.used_bytes, p.budget.peak_bytes, p.budget.refused) == (0, 0, 1)
    p.end_upload(f)
    p.respond(f)
    (rec,) = p.records
    assert rec["request"]["body_bytes"] == 100
    assert [(v["kind"], v["detail"]) for v in rec["violations"]] == [budget_violation(0)]


def _ends(p: _Proxy, f, how: str) -> None:
    """Ends flow ``f``, 60 bytes into its upload, the way ``how`` says mitmproxy would."""
    if how == "not LLM":  # the response headers decide: plain JSON
        p.respond(f, headers=JSON_HEADERS, body=b"{}", finish=False)
    elif how == "adopted, still uploading":  # an AI SDK stream: the copy is the record's request now
        p.respond(f, finish=False)
    elif how == "client aborts the upload":  # mitmproxy: error hook, "Client disconnected."
        f.error = Error("Client disconnected.")
        p.addon.error(f)
    elif how == "upstream fails":
        f.error = Error("Server disconnected.")
        p.addon.error(f)
    elif how == "killed":  # flow.kill(): mitmproxy's error hook with its message
        f.error = Error(Error.KILLED_MESSAGE)
        p.addon.error(f)
    elif how == "connection closed without a hook":  # e.g. an HTTP/2 connection dropped
        p.addon.client_disconnected(f.client_conn)
    elif how == "proxy shuts down":  # the response never came
        p.addon.done()
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how",
    [
        "not LLM",
        "adopted, still uploading",
        "client aborts the upload",
        "upstream fails",
        "killed",
        "connection closed without a hook",
        "proxy shuts down",
    ],
)
def test_every_end_of_a_held_flow_gives_its_bytes_back(proxy, how):
    """Two held flows of one client connection and one of another, 60 bytes each (180); ending
    the first the way ``how`` says gives back its 60 (a closed connection: its client's two,
    120; shutdown: all 180). Nothing stays reserved once every flow has ended."""
    from mitmproxy.test import tflow

    p = proxy(1000)
    client = tflow.tclient_conn()
    f, sibling = p.flow(client=client), p.flow(client=client)
    other = p.flow()
    for g in (f, sibling, other):
        p.send(g, REQ[:60])
    assert (p.budget.used_bytes, len(p.addon.held_requests)) == (180, 3)
    _ends(p, f, how)
    left = {"connection closed without a hook": 60, "proxy shuts down": 0}.get(how, 120)
    assert p.budget.used_bytes == left
    if how != "proxy shuts down":
        for g in (sibling, other):  # (a sibling dropped with its connection: nothing left to give back)
            p.respond(g, headers=JSON_HEADERS, body=b"{}")
    assert (p.budget.used_bytes, len(p.addon.held_requests)) == (0, 0)
    if how == "adopted, still uploading":  # the rest of its upload is copied outside the budget
        p.send(f, REQ[60:])
        assert p.budget.used_bytes == 0
        p.end_upload(f)
        p.addon.response(f)
        assert (p.record_of(f)["request"]["messages"], p.record_of(f)["violations"]) == (MESSAGES, [])
    assert p.budget.peak_bytes == 180


def test_a_failure_while_the_response_decides_still_gives_the_bytes_back(proxy, monkeypatch):
    """``responseheaders`` fails (the registry raises): the flow streams on unobserved, the
    failure is counted, and its held copy is not left reserved."""
    p = proxy(1000)
    f = p.flow()
    p.send(f, REQ[:70])

    def boom(*args, **kwargs):
        raise RuntimeError("registry failed")

    monkeypatch.setattr(p.addon._registry, "classify_response", boom)
    p.respond(f, finish=False)
    assert f.response.stream is True
    assert (p.addon.hook_errors, p.budget.used_bytes, len(p.addon.held_requests)) == (1, 0, 0)


def test_a_smaller_budget_set_while_copies_are_held_refuses_new_bytes_until_enough_are_back(proxy):
    """120 bytes held of 1000; the budget set to 100: the held copies stay (never evicted), a
    new chunk of either does not fit (stops that copy: 60 back -> 60), and once the other's 60
    are back a new copy fits again."""
    p = proxy(1000)
    a, b = p.flow(), p.flow()
    p.send(a, REQ[:60])
    p.send(b, REQ[:60])
    p.tctx.configure(p.addon, observer_max_held_request_bytes=100)
    assert (p.budget.limit_bytes, p.budget.used_bytes) == (100, 120)
    p.send(a, REQ[60:61])  # 121 > 100: a's copy stops, 60 back
    assert p.budget.used_bytes == 60
    p.respond(b, headers=JSON_HEADERS, body=b"{}")  # 60 back
    c = p.flow()
    p.send(c, REQ)
    assert p.budget.used_bytes == 100
