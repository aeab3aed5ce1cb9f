"""Golden records: every wire fixture driven through the mitmproxy addon's hooks (request
headers, request, response headers, the stream callable, then ``response`` or ``error``), in
the in-process mode and the worker mode, with the full record kept (every field but the id and
the clock readings) in ``tests/fixtures/golden/<dialect>/<case>.<scenario>.json``.

They were written once from the code before the capture-architecture change (issue 11) and
pin the records byte for byte while the capture path is rebuilt: they are a regression net,
not a statement of what is right (the hand-written ``*.expected.json`` are that).

Scenarios per fixture: ``eof`` (the whole body in 37-byte chunks, then ``response``),
``abort`` (the first half, then ``error`` "Client disconnected"), and ``bad_request`` (as
``eof``, the request body not JSON: since issue 14 such a request on an LLM host is not LLM
traffic, and its record keeps metadata only, ``not_llm_request``; the draft's dialect still
records it with ``invalid_request`` beside the response's violations). Run
``python -m tests.golden --missing`` to write the golden records of new fixtures only, and
``python -m tests.golden --write`` to rewrite them all (only on purpose: a record change must be
reviewed by eye before the files are rewritten).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from mitmproxy import http
from mitmproxy.flow import Error
from mitmproxy.test import taddons, tflow

from tests.wirefeed import Case, cases, dialect_dirs, load

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
SCENARIOS = ("eof", "abort", "bad_request")
CHUNK_BYTES = 37
VOLATILE = ("id", "started_at", "ended_at", "ttft_s")  # ids and clock readings


def all_cases() -> list[tuple[str, str]]:
    return [(d, c) for d in dialect_dirs() for c in cases(d)]


def flow_of(case: Case) -> http.HTTPFlow:
    f = tflow.tflow()
    f.request.method = "POST"
    f.request.host = "llm.example"
    f.request.path = case.path
    f.request.headers.clear()
    f.request.headers["content-type"] = "application/json"
    for k, v in case.request_headers.items():
        f.request.headers[k] = v
    f.request.content = case.request
    return f


def request_of(case: Case, scenario: str) -> bytes:
    return b"{not json" if scenario == "bad_request" else case.request


def chunks_of(case: Case, scenario: str) -> list[bytes]:
    body = case.body[: len(case.body) // 2] if scenario == "abort" else case.body
    return [body[i : i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)]


def stable(record: Any) -> dict[str, Any]:
    """The record's dict without its id and clock readings."""
    d = record.to_dict()
    for key in VOLATILE:
        d.pop(key, None)
    return d


def drive(addon: Any, case: Case, scenario: str) -> None:
    """Runs one exchange of ``case`` through the addon's hooks."""
    f = flow_of(case)
    f.request.content = request_of(case, scenario)
    addon.requestheaders(f)
    addon.request(f)
    headers = {"content-type": case.content_type, **case.response_headers}
    if case.content_encoding:
        headers["content-encoding"] = case.content_encoding
    f.response = http.Response.make(case.status, b"", headers)
    f.response.stream = False
    addon.responseheaders(f)
    tap = f.response.stream
    for c in chunks_of(case, scenario):
        assert tap is True or tap(c) is c  # (True: metadata only, streamed on unread)
    if scenario != "abort":
        addon.response(f)
    else:
        f.error = Error("Client disconnected.")
        addon.error(f)


def records(worker: bool) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every (dialect, case, scenario)'s stable record, in the given mode."""
    from observer.capture.hooks import LLMAudit

    async def run() -> dict[tuple[str, str, str], dict[str, Any]]:
        got: list[Any] = []
        addon = LLMAudit(sink=lambda r: got.append(r) or True, worker=worker)
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        loop = asyncio.get_running_loop()
        with taddons.context(addon) as tctx:
            tctx.configure(addon, observer_llm_hosts_extra="llm.example")  # the fixtures' host is an LLM host
            addon.running()
            assert (addon._link is not None) is worker, "the worker mode must parse in the worker process"
            try:
                for d, c in all_cases():
                    for scenario in SCENARIOS:
                        n = len(got)
                        drive(addon, load(d, c), scenario)
                        end = loop.time() + 15.0
                        # every record of the exchange is in once its final facts came back
                        while len(got) == n or addon._deferred or addon._flows._unrecorded:
                            if loop.time() > end:
                                raise AssertionError(f"no record for {d}/{c}/{scenario}")
                            await asyncio.sleep(0.002)
                        made = [stable(r) for r in got[n:]]  # a stream cut into turns: one per turn
                        out[(d, c, scenario)] = made[0] if len(made) == 1 else made
            finally:
                addon.done()
        return out

    return asyncio.run(run())


def golden_path(dialect: str, case: str, scenario: str) -> Path:
    return GOLDEN / dialect / f"{case}.{scenario}.json"


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write(missing_only: bool) -> int:
    """Writes the golden records (``missing_only``: of the fixtures that have none); 1 when the
    two modes disagree on a record."""
    inproc, worker = records(False), records(True)
    written = 0
    for key, rec in inproc.items():
        if worker[key] != rec:
            print(f"{key}: the worker's record differs from the in-process one", file=sys.stderr)
            return 1
        path = golden_path(*key)
        if missing_only and path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(rec), encoding="utf-8")
        written += 1
    print(f"wrote {written} golden records to {GOLDEN}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] not in (["--write"], ["--missing"]):
        sys.exit("usage: python -m tests.golden --write | --missing")
    sys.exit(write(missing_only=sys.argv[1] == "--missing"))
