"""Fixtures for the end-to-end tests: one upstream (in-process thread) per session and one
proxy-under-test process per module.

``E2E_TARGET`` chooses the proxy under test:

- ``observer`` (default): ``observer run`` (proxy + API). The tests are skipped, with the reason,
  when ``observer run --help`` does not work yet.
- ``passthrough``: plain ``mitmdump -s bench/passthrough_addon.py``. Only the transport checks run
  (bytes, timing); the record checks are left out. Useful to validate the harness itself.
- ``script:<path>``: ``mitmdump -s <path>``, transport checks only (e.g. ``script:addons/llm_audit.py``
  with ``E2E_MITM_SETS="observer_db=sqlite:///x.db"``, space-separated ``k=v``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.harness import REPO, ApiClient, ManagedProcess, MitmdumpProcess, ObserverProcess, observer_cli_available
from tests.e2e.upstream import UpstreamServer

_ACTIVE: list[ManagedProcess] = []


@dataclass
class ProxyUnderTest:
    kind: str  # "observer" | "passthrough" | "script:<path>"
    process: ManagedProcess
    proxy_url: str
    ca_path: str
    api: ApiClient | None

    @property
    def records(self) -> bool:
        return self.api is not None


@pytest.fixture(scope="session")
def upstream() -> Iterator[UpstreamServer]:
    with UpstreamServer() as up:
        yield up


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyUnderTest]:
    kind = os.environ.get("E2E_TARGET", "observer")
    workdir = str(tmp_path_factory.mktemp("e2e-" + kind.replace(":", "-").replace("/", "-")))
    proc: ManagedProcess
    if kind == "passthrough":
        proc = MitmdumpProcess(REPO / "bench" / "passthrough_addon.py", workdir=workdir)
    elif kind.startswith("script:"):
        sets = dict(kv.split("=", 1) for kv in os.environ.get("E2E_MITM_SETS", "").split())
        proc = MitmdumpProcess(REPO / kind.split(":", 1)[1], sets=sets, workdir=workdir)
    elif kind == "observer":
        ok, why = observer_cli_available()
        if not ok:
            pytest.skip(f"observer CLI not available: {why}")
        proc = ObserverProcess(workdir=workdir)
    else:
        raise pytest.UsageError(f"unknown E2E_TARGET={kind!r} (observer | passthrough | script:<path>)")
    proc.start(timeout=45)
    _ACTIVE.append(proc)
    api = proc.api() if isinstance(proc, ObserverProcess) else None
    try:
        yield ProxyUnderTest(kind, proc, proc.proxy_url, proc.ca_path, api)  # type: ignore[attr-defined]
    finally:
        _ACTIVE.remove(proc)
        if api is not None:
            api.close()
        code = proc.stop()
        print(f"\n{proc.name} exit code {code}; log tail:\n{proc.tail(20)}")


@pytest.fixture
def recorded(proxy: ProxyUnderTest) -> ProxyUnderTest:
    """``proxy``, when it keeps records (an API to read them); else the test is skipped."""
    if not proxy.records:
        pytest.skip("the proxy under test keeps no records (E2E_TARGET is not observer)")
    return proxy


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _ACTIVE:
        for proc in _ACTIVE:
            status = "running" if proc.alive() else f"exited ({proc.proc.returncode if proc.proc else '?'})"
            report.sections.append((f"{proc.name} log tail [{status}]", proc.describe(80)))
