"""Every fenced code block of ``README.md`` and ``docs/ca-install.md`` is run by a test here, or
listed with the reason it cannot run on this machine (issue 14 item 5).

``parse_blocks`` finds every fenced block (```` ``` ```` or ``~~~``, with its info string, file
and line). ``REGISTRY`` maps each block, by its file and its first line that is not blank or a
comment (``block_key``), to the test that runs it (``Runs``), to the test that checks what it
says when it cannot be run for real (``Checks``, with the reason), or to the reason it is not run
at all (``NotRun``). ``test_every_block_is_accounted_for`` fails on a block the registry does
not know (a new snippet must be run or excused) and on an entry whose block is gone.

The runnable blocks run AS WRITTEN: the text is taken from the document when the test runs and
only hosts, ports and paths are replaced, by plain string replacement (``subst``, which fails
when a replaced string is no longer in the block): the proxy ``127.0.0.1:8080`` /
``observer.corp.example:8080`` becomes this module's ``observer run`` on a free port, the API
``127.0.0.1:8081`` its API, ``llm.example.internal`` / ``api.openai.com`` a local TLS upstream
that is on the LLM host list (``DocsUpstream``, 127.0.0.1 on a free port), ``example.com`` a
second local TLS server that is not. Shell blocks run with ``bash -e`` in a folder laid out as
the checkout after ``make run`` (``.observer/api-token``, ``.observer/mitmproxy/``,
``observer.db``), with a clean environment (no proxy or CA variables of this machine, ``HOME`` a
temporary folder, ``.venv/bin`` first on ``PATH``).

Blocks that route by ``NO_PROXY=localhost,127.0.0.1`` (and Java, which never proxies loopback
names) reach the upstream under a second name of this machine's loopback (its host name, or
another name ``/etc/hosts`` gives 127.0.0.1, when it resolves to 127.0.0.1 only; else those tests
are skipped with the reason). A tool that is missing (node, the npm packages of ``tests/node``,
java, openssl, curl, the SDKs) skips its test with the reason.

``OBSERVER_TEST_DOCS_ROOT=DIR`` reads the two documents from a copy in ``DIR`` instead (to watch a
test fail on a broken snippet without touching the checkout).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import REPO, ApiClient, ObserverProcess, free_port, port_open, wait_until
from tests.e2e.servers import NewRecords
from tests.e2e.upstream import (
    COMPLETE_TEXT,
    UpstreamExchange,
    UpstreamServer,
    compact,
    send_event,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DOCS = ("README.md", "docs/ca-install.md")
#: Where the documents are read (a copy, to try a broken snippet without touching the checkout).
DOC_ROOT = Path(os.environ.get("OBSERVER_TEST_DOCS_ROOT") or REPO)
BIN = Path(sys.executable).parent
NODE_DIR = REPO / "tests" / "node"
RUN_TIMEOUT = 90.0  # every subprocess of a snippet is bounded

# --------------------------------------------------------------------------------------------
# the blocks


@dataclass(frozen=True)
class Block:
    """One fenced code block: its file (relative to the checkout), the line of its opening
    fence (1-based), its info string and its text (without the fences)."""

    file: str
    line: int
    info: str
    text: str

    @property
    def key(self) -> str:
        return block_key(self.text)

    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.info or 'no info string'}) {self.key!r}"


_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def parse_blocks(text: str, file: str) -> list[Block]:
    """Every fenced code block of a Markdown text (CommonMark: an opening fence of 3 or more
    backticks or tildes, indented up to 3 spaces, a backtick fence's info string without
    backticks; closed by a fence of the same character, at least as long, with nothing after
    it; an unclosed block runs to the end). Content lines lose the opening fence's indentation."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i + 1
        body: list[str] = []
        i += 1
        while i < len(lines):
            close = re.match(r"^ {0,3}(`{3,}|~{3,})\s*$", lines[i])
            if close and close.group(1)[0] == fence[0] and len(close.group(1)) >= len(fence):
                break
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))) :])
            i += 1
        blocks.append(Block(file, start, m["info"].strip(), "\n".join(body) + "\n"))
        i += 1
    return blocks


def block_key(text: str) -> str:
    """The block's first line that is neither blank nor a comment (``#``, ``//``, ``::``,
    ``REM``), whitespace collapsed: stable while the block's other lines change."""
    for line in text.splitlines():
        s = line.strip()
        if s and not s.startswith(("#", "//", "::", "REM ")):
            return " ".join(s.split())
    return ""


def doc_blocks() -> list[Block]:
    out: list[Block] = []
    for name in DOCS:
        out.extend(parse_blocks((DOC_ROOT / name).read_text(encoding="utf-8"), name))
    return out


def block(file: str, key_prefix: str) -> Block:
    """The one block of ``file`` whose key starts with ``key_prefix`` (the test fails when
    there is none or more than one)."""
    found = [b for b in doc_blocks() if b.file == file and b.key.startswith(key_prefix)]
    assert len(found) == 1, f"{file}: expected one block starting {key_prefix!r}, found {[b.where() for b in found]}"
    return found[0]


# --------------------------------------------------------------------------------------------
# the registry: what runs each block, or why it is not run


@dataclass(frozen=True)
class Runs:
    """The block is run (as written, hosts/ports/paths replaced) by ``test``."""

    test: str


@dataclass(frozen=True)
class Checks:
    """The block cannot be run for real (``why``); ``test`` checks what it says instead."""

    test: str
    why: str


@dataclass(frozen=True)
class NotRun:
    """The block is not run at all, for this reason."""

    why: str


TRUST_STORE = "changes the machine's shared trust store (root; every other process on it would trust the test CA)"

#: (file, block key) -> what runs it. The key is ``block_key`` of the block as it is now.
REGISTRY: dict[tuple[str, str], Runs | Checks | NotRun] = {
    # README.md
    (
        "README.md",
        "make run # proxy on 127.0.0.1:8080, query API on 127.0.0.1:8081, store in ./observer.db",
    ): Checks(
        "test_readme_quick_start",
        "`make run` binds the fixed ports 8080/8081 and the checkout's own .observer/ and observer.db (a user's "
        "instance may be running); `make test` is the suite this test is part of",
    ),
    ("README.md", "CA=.observer/mitmproxy/mitmproxy-ca-cert.pem"): Runs("test_readme_curl_draft_request"),
    ("README.md", "export HTTPS_PROXY=http://127.0.0.1:8080 HTTP_PROXY=http://127.0.0.1:8080"): Runs(
        "test_readme_env_clients_and_openai_sdk"
    ),
    ("README.md", "import openai"): Runs("test_readme_env_clients_and_openai_sdk"),
    ("README.md", "TOKEN=$(cat .observer/api-token)"): Runs("test_readme_read_records"),
    (
        "README.md",
        "observer run [--proxy-port 8080] [--api-port 8081] [--db URL] [--<setting> VALUE ...]",
    ): Checks(
        "test_readme_command_synopsis",
        "a synopsis, not commands: every subcommand and option it names must be in `observer <cmd> --help`",
    ),
    ("README.md", "[[webhook]]"): Runs("test_readme_alerts_file"),
    ("README.md", "printf '%s\\n' \"$THE_API_KEY\" | observer key-owner add --owner alice --team ml-platform"): Runs(
        "test_readme_key_owner"
    ),
    (
        "README.md",
        "client ──▶ mitmproxy + observer.capture (mitmdump -s addons/llm_audit.py) ──▶ upstream LLM endpoint",
    ): Checks("test_readme_how_it_works", "a diagram: the modules and files it names must exist"),
    (
        "README.md",
        "observer export --out export-2026-06 --since 2026-06-01T00:00:00Z --until 2026-07-01T00:00:00Z",
    ): Runs("test_readme_export_commands"),
    (
        "README.md",
        "mitmdump -s addons/llm_audit.py -w flows.mitm --set store_streamed_bodies=true # or a plain mitmdump -w",
    ): Runs("test_readme_dump_and_ingest"),
    (
        "README.md",
        "make demo # a real model behind the observer: streamed tokens, then the stored record (~5 s after install)",
    ): Runs("test_readme_make_demo"),
    # docs/ca-install.md
    (
        "docs/ca-install.md",
        "openssl x509 -noout -subject -enddate -fingerprint -sha256 -in mitmproxy-ca-cert.pem",
    ): Runs("test_guide_ca_fingerprint"),
    (
        "docs/ca-install.md",
        "sudo install -m 0644 mitmproxy-ca-cert.pem /usr/local/share/ca-certificates/llm-stream-observer.crt",
    ): NotRun("Debian's update-ca-certificates " + TRUST_STORE),
    (
        "docs/ca-install.md",
        "sudo install -m 0644 mitmproxy-ca-cert.pem /etc/pki/ca-trust/source/anchors/llm-stream-observer.pem",
    ): NotRun("RHEL's update-ca-trust: another OS, and it " + TRUST_STORE),
    (
        "docs/ca-install.md",
        "sudo security add-trusted-cert -d -r trustRoot -k /Library/Keychains/System.keychain mitmproxy-ca-cert.pem",
    ): NotRun("macOS only (the System keychain)"),
    ("docs/ca-install.md", "certutil -addstore -f Root mitmproxy-ca-cert.cer"): NotRun(
        "Windows only (the machine's Trusted Root store)"
    ),
    (
        "docs/ca-install.md",
        "export HTTPS_PROXY=http://observer.corp.example:8080 # the proxy speaks plain HTTP; CONNECT carries the TLS",
    ): Runs("test_guide_proxy_variables"),
    ("docs/ca-install.md", 'var OBSERVER = "PROXY observer.corp.example:8080";'): Runs("test_guide_pac_file"),
    (
        "docs/ca-install.md",
        "export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt # RHEL: /etc/pki/tls/certs/ca-bundle.crt",
    ): Runs("test_guide_python_bundle"),
    ("docs/ca-install.md", "import openai"): Runs("test_guide_python_in_code"),
    ("docs/ca-install.md", 'import { setGlobalDispatcher, EnvHttpProxyAgent } from "undici";'): Runs(
        "test_guide_node_preload"
    ),
    ("docs/ca-install.md", "export HTTPS_PROXY=http://observer.corp.example:8080 NO_PROXY=localhost,127.0.0.1"): Runs(
        "test_guide_node_preload"
    ),
    ("docs/ca-install.md", 'import { setGlobalDispatcher, ProxyAgent } from "undici";'): Runs(
        "test_guide_node_in_code"
    ),
    (
        "docs/ca-install.md",
        "sudo keytool -importcert -cacerts -storepass changeit -noprompt -alias llm-stream-observer -file mitmproxy-ca-cert.pem",
    ): Runs("test_guide_java"),  # all but its first line (the JDK's own cacerts: TRUST_STORE)
    (
        "docs/ca-install.md",
        "openssl s_client -proxy observer.corp.example:8080 -connect api.openai.com:443 -servername api.openai.com </dev/null 2>/dev/null \\",
    ): Runs("test_guide_s_client"),
}


def test_parse_blocks() -> None:
    """The parser: both fence characters, a longer fence holding a shorter one, an info string,
    indentation, an unclosed block, inline code spans that are not fences."""
    md = textwrap.dedent(
        """\
        Text with ```inline``` code.

        ```sh
        # comment
        echo one
        ```

          ~~~~ toml
          a = 1
          ```
          not the end
          ~~~~

        ````
        ```inner```
        ````
        ```js
        // open to the end
        let x = 1;
        """
    )
    got = [(b.line, b.info, b.key, b.text) for b in parse_blocks(md, "x.md")]
    assert got == [
        (3, "sh", "echo one", "# comment\necho one\n"),
        (8, "toml", "a = 1", "a = 1\n```\nnot the end\n"),
        (14, "", "```inner```", "```inner```\n"),
        (17, "js", "let x = 1;", "// open to the end\nlet x = 1;\n"),
    ]


def test_every_block_is_accounted_for() -> None:
    """Every block of the README and the guide is in ``REGISTRY``, every entry names a block
    that exists (once) and a test of this module that exists."""
    blocks = doc_blocks()
    keys = [(b.file, b.key) for b in blocks]
    unknown = [b.where() for b in blocks if (b.file, b.key) not in REGISTRY]
    gone = [f"{f}: {k!r}" for f, k in REGISTRY if (f, k) not in keys]
    twice = sorted({f"{f}: {k!r}" for f, k in keys if keys.count((f, k)) > 1})
    missing_tests = sorted(
        {e.test for e in REGISTRY.values() if isinstance(e, Runs | Checks) and not callable(globals().get(e.test))}
    )
    problems = []
    if unknown:
        problems.append(
            "blocks that no test runs and no entry excuses (add them to REGISTRY):"
            + "".join(f"\n  {u}" for u in unknown)
        )
    if gone:
        problems.append("REGISTRY entries whose block is no longer in the docs:" + "".join(f"\n  {g}" for g in gone))
    if twice:
        problems.append(f"blocks with the same key (make their first lines differ): {twice}")
    if missing_tests:
        problems.append(f"REGISTRY names tests that do not exist: {missing_tests}")
    assert not problems, "\n".join(problems)
    assert {f for f, _ in keys} == set(DOCS)


# --------------------------------------------------------------------------------------------
# running a block


def subst(text: str, *pairs: tuple[str, str]) -> str:
    """``text`` with each ``old`` replaced by ``new``, in order; fails when an ``old`` is not
    in the text (the block changed: the test must not run it against a real host)."""
    for old, new in pairs:
        assert old in text, f"{old!r} is no longer in the block:\n{text}"
        text = text.replace(old, new)
    return text


_DROP_ENV = {
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "NODE_OPTIONS",
    "NODE_PATH",
    "GIT_SSL_CAINFO",
    "NIX_SSL_CERT_FILE",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "PYTHONPATH",
}


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's fresh shell on this machine: no proxy, CA, observer, SDK or
    runtime-option variables; ``HOME`` a temporary folder; the venv's ``bin`` first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k.upper() not in _DROP_ENV
        and not k.upper().endswith("_PROXY")
        and not k.startswith(("OBSERVER_", "OPENAI_", "ANTHROPIC_", "PYTEST_", "COV_CORE_"))
    }
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", LC_ALL="C.UTF-8", COLUMNS="200")
    env.update(extra)
    return env


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def ok(self, what: str = "the snippet") -> Ran:
        assert self.code == 0, (
            f"{what} exited {self.code}\n--- stdout:\n{self.out[-3000:]}\n--- stderr:\n{self.err[-3000:]}"
        )
        return self


def run_sh(script: str, cwd: Path, env: dict[str, str], timeout: float = RUN_TIMEOUT) -> Ran:
    """Runs ``script`` with ``bash -e`` (a failing command fails the run), bounded."""
    p = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Ran(p.returncode, p.stdout, p.stderr)


def need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"`{t}` is not installed on this machine")


def need_module(name: str) -> None:
    import importlib.util

    if importlib.util.find_spec(name) is None:
        pytest.skip(f"the Python package {name} is not installed (requirements-clients.lock: `make install`)")


def need_node_packages() -> None:
    need("node")
    missing = [p for p in ("undici", "openai", "@anthropic-ai/sdk") if not (NODE_DIR / "node_modules" / p).is_dir()]
    if missing:
        pytest.skip(
            f"tests/node/node_modules lacks {', '.join(missing)}: run `make install` "
            "(npm ci --prefix tests/node --no-audit --no-fund)"
        )


def loopback_alias() -> str:
    """A name of this machine, other than localhost, that resolves to 127.0.0.1 only (its host
    name, or another name /etc/hosts gives 127.0.0.1): the upstream's name where
    ``NO_PROXY=localhost,127.0.0.1`` must not exempt it. Skips the test when there is none."""
    candidates = [socket.gethostname()]
    with contextlib.suppress(OSError):
        for line in Path("/etc/hosts").read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if fields and fields[0] == "127.0.0.1":
                candidates += fields[1:]
    for name in candidates:
        if not name or name.lower().startswith("localhost") or name.endswith(".corp.example"):
            continue
        try:
            addrs = {ai[4][0] for ai in socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)}
        except OSError:
            continue
        if addrs == {"127.0.0.1"}:
            return name
    pytest.skip(
        f"no name of this machine but localhost resolves to 127.0.0.1 only (tried {candidates}): no second name of "
        "the loopback upstream that NO_PROXY=localhost,127.0.0.1 leaves to the proxy"
    )


# --------------------------------------------------------------------------------------------
# the upstream and the observer


DOCS_TEXT = ["Hello", " from", " the", " docs", " upstream."]


class DocsUpstream(UpstreamServer):
    """``UpstreamServer`` (``/v1/stream``: the draft's complete example) that also streams an
    OpenAI chat completion (``/v1/chat/completions``) and an Anthropic message (``/v1/messages``)
    naming the model the request asked for, 20 ms between events."""

    gap_s = 0.02

    async def _respond(self, ex: UpstreamExchange, w: Any) -> None:
        if ex.method != "POST" or ex.path not in ("/v1/chat/completions", "/v1/messages"):
            await super()._respond(ex, w)
            return
        try:
            req = json.loads(ex.body or b"{}")
        except ValueError:
            req = {}
        model = str(req.get("model") or "unknown-model")
        events = _openai_events(model) if ex.path == "/v1/chat/completions" else _anthropic_events(model)
        headers = [("content-type", "text/event-stream"), ("cache-control", "no-cache")]
        if ex.http_version == "HTTP/1.1":
            headers.append(("transfer-encoding", "chunked"))
        ex.status, ex.response_headers = 200, headers
        await w.send_headers(200, headers)
        for i, ev in enumerate(events):
            if i:
                await asyncio.sleep(self.gap_s)
            await send_event(w, ex, ev, ev)
        await w.end()
        ex.completed = True


def _openai_events(model: str) -> list[bytes]:
    base = {"id": "chatcmpl-docs", "object": "chat.completion.chunk", "created": 1749292800, "model": model}
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
    chunks += [{**base, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]} for t in DOCS_TEXT]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}})
    return [f"data: {compact(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


def _anthropic_events(model: str) -> list[bytes]:
    msg = {"id": "msg_docs", "type": "message", "role": "assistant", "content": [], "model": model}
    evs: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {**msg, "stop_reason": None, "usage": {"input_tokens": 9, "output_tokens": 1}},
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    evs += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}} for t in DOCS_TEXT]
    evs += [
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
        {"type": "message_stop"},
    ]
    return [f"event: {e['type']}\ndata: {compact(e)}\n\n".encode() for e in evs]


class DocsObserver(ObserverProcess):
    """``observer run`` laid out as ``make run`` leaves the checkout: ``WORK/.observer`` is its
    data folder (``api-token`` generated there, no ``OBSERVER_API_TOKEN``), ``.observer/mitmproxy``
    its CA, ``WORK/observer.db`` its store."""

    def __init__(self, work: Path, sets: dict[str, str]):
        super().__init__(
            workdir=str(work),
            sets=sets,
            db_url=f"sqlite:///{work / 'observer.db'}",
            extra_args=["--data-dir", str(work / ".observer")],
        )
        self.confdir = work / ".observer" / "mitmproxy"

    def build_env(self) -> dict[str, str]:
        env = super().build_env()
        env.pop("OBSERVER_API_TOKEN", None)
        return env

    def start(self, timeout: float = 45.0) -> DocsObserver:
        super().start(timeout)
        token_file = self.workdir / ".observer" / "api-token"
        self.token = wait_until(lambda: token_file.read_text().strip(), 10, what="the generated api-token")
        return self


@dataclass
class Lab:
    work: Path  # the "checkout": .observer/, observer.db
    home: Path  # HOME of every snippet
    upstream: DocsUpstream  # an LLM host (127.0.0.1, localhost and the alias at its TLS port)
    other: UpstreamServer  # a TLS server that is not an LLM host
    obs: DocsObserver
    api: ApiClient  # the query API, with the generated token

    @property
    def proxy_hostport(self) -> str:
        return f"127.0.0.1:{self.obs.proxy_port}"

    @property
    def api_hostport(self) -> str:
        return f"127.0.0.1:{self.obs.api_port}"

    @property
    def llm_origin(self) -> str:
        return f"https://127.0.0.1:{self.upstream.https_port}"

    @property
    def ca(self) -> Path:
        return Path(self.obs.ca_path)

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(self.home, **extra)

    def records(self) -> NewRecords:
        return NewRecords(self.api)

    def both_cas(self) -> Path:
        """The observer's CA and the upstreams' own: what a runtime trusts when the vendor's
        real certificate is publicly trusted (a direct connection then succeeds, as it would)."""
        p = self.work / "both-cas.pem"
        p.write_text(self.ca.read_text() + Path(self.upstream.ca_cert_path).read_text())
        return p


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    from tests.e2e.harness import observer_cli_available

    ok, why = observer_cli_available()
    if not ok:
        pytest.skip(f"observer CLI not available: {why}")
    root = tmp_path_factory.mktemp("docs-snippets")
    work, home = root / "checkout", root / "home"
    work.mkdir()
    home.mkdir()
    with DocsUpstream() as up, UpstreamServer() as other:
        names = ["127.0.0.1", "localhost"]
        with contextlib.suppress(pytest.skip.Exception):
            names.append(loopback_alias())
        # Only the upstream's TLS port is an LLM host: `other` (another port) is tunnelled.
        sets = {"observer_llm_hosts_extra": ",".join(f"{n}:{up.https_port}" for n in names)}
        obs = DocsObserver(work, sets)
        obs.start()
        api = obs.api()
        try:
            yield Lab(work, home, up, other, obs, api)
        finally:
            api.close()
            obs.stop()


def find_new(rec: NewRecords, n: int, what: str) -> list[dict[str, Any]]:
    recs = rec.wait(n, timeout=20)
    assert len(recs) == n, f"{what}: expected {n} new records, got {[(r['dialect'], r['path']) for r in recs]}"
    return recs


# --------------------------------------------------------------------------------------------
# README.md


def test_readme_quick_start(tmp_path: Path) -> None:
    """``make run`` / ``make test`` (not run: ``REGISTRY``): the targets exist and run what the
    README says, and the defaults ``observer config`` reports in an empty folder are the ports and
    store the comment names."""
    b = block("README.md", "make run")
    need("make")
    for target, command in (("run", ".venv/bin/observer run"), ("test", "-m pytest")):
        assert re.search(rf"^make {target}\b", b.text, re.M)
        dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0 and command in dry.stdout, (target, dry.stdout[-2000:], dry.stderr[-2000:])
    cfg = run_sh("observer config", tmp_path, clean_env(tmp_path)).ok("observer config")
    values = dict(re.findall(r"^(\w+) = (\S+)", cfg.out, re.M))
    claimed = re.search(r"proxy on (\S+), query API on (\S+), store in \./(\S+)", b.text)
    assert claimed is not None, b.text
    assert f"{values['proxy_host']}:{values['proxy_port']}" == claimed[1]
    assert f"{values['api_host']}:{values['api_port']}" == claimed[2]
    assert values["db"] == f"sqlite:///{claimed[3]}"


def test_readme_curl_draft_request(lab: Lab) -> None:
    """The README's curl request in the draft format, through the proxy to an LLM host: the
    client gets the stream, and its record appears in the API."""
    need("curl")
    b = block("README.md", "CA=.observer/mitmproxy/mitmproxy-ca-cert.pem")
    script = subst(
        b.text,
        ("http://127.0.0.1:8080", f"http://{lab.proxy_hostport}"),
        ("https://llm.example.internal/v1/stream", f"{lab.llm_origin}/v1/stream"),
    )
    rec = lab.records()
    out = run_sh(script, lab.work, lab.env()).ok("the README's curl request").out
    assert "event: stream.start" in out and "event: stream.end" in out, out
    [r] = find_new(rec, 1, "the curl request")
    assert (r["dialect"], r["request_model"], r["text"], r["outcome"]) == (
        "llm-stream-1.0",
        "example-model",
        COMPLETE_TEXT,
        "completed",
    ), r
    assert r["request"]["messages"] == [{"role": "user", "content": "What is the weather in Vienna?"}]
    assert r["scheme"] == "https" and r["port"] == lab.upstream.https_port


OPENAI_CALL = """
# (the test's call, after the snippet: one streamed chat completion with the client it made)
stream = client.chat.completions.create(
    model="gpt-4o", messages=[{"role": "user", "content": "Say hello (README openai snippet)"}], stream=True
)
print("openai:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
"""

ENV_CLIENTS = """
# (the test's calls after the exports: clients that take the proxy and the CA from them)
import json, sys, urllib.request
import httpx, requests

URL, TAG = sys.argv[1], sys.argv[2]
BODY = {"version": "1.0", "stream": True, "model": "example-model", "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"Content-Type": "application/llm-request+json"}
print("httpx:", httpx.post(URL + f"?tid={TAG}-httpx", json=BODY, headers=HEADERS, timeout=30).status_code)
print("requests:", requests.post(URL + f"?tid={TAG}-requests", json=BODY, headers=HEADERS, timeout=30).status_code)
req = urllib.request.Request(URL + f"?tid={TAG}-urllib", data=json.dumps(BODY).encode(), headers=HEADERS)
print("urllib:", urllib.request.urlopen(req, timeout=30).status)
"""


OPENAI_FROM_ENV = """
# (the test's call: the openai SDK without proxy or CA in code, after the exports)
import sys
import openai

client = openai.OpenAI(api_key="sk-test", base_url=sys.argv[1], max_retries=0)
stream = client.chat.completions.create(
    model="gpt-4o", messages=[{"role": "user", "content": "readme-openai-env"}], stream=True
)
print("openai from the variables:", "".join(c.choices[0].delta.content or "" for c in stream if c.choices))
"""


def test_readme_env_clients_and_openai_sdk(lab: Lab) -> None:
    """The README's exports, then clients that honour them (httpx, requests, urllib, curl, and
    the openai SDK, which "follows these variables too"), then the README's openai snippet as
    written with one streamed call: every request is recorded."""
    need_module("openai")
    need("curl")
    exports = subst(
        block("README.md", "export HTTPS_PROXY=").text, ("http://127.0.0.1:8080", f"http://{lab.proxy_hostport}")
    )
    snippet = subst(
        block("README.md", "import openai").text,
        ("https://llm.example.internal/v1", f"{lab.llm_origin}/v1"),
        ("http://127.0.0.1:8080", f"http://{lab.proxy_hostport}"),
    )
    (lab.work / "env_clients.py").write_text(ENV_CLIENTS)
    (lab.work / "openai_env.py").write_text(OPENAI_FROM_ENV)
    (lab.work / "openai_snippet.py").write_text(snippet + OPENAI_CALL)
    url = f"{lab.llm_origin}/v1/stream"
    curl = f"curl -sS -N -H 'Content-Type: application/llm-request+json' -d '{{}}' '{url}?tid=env-curl' >/dev/null"
    rec = lab.records()
    script = exports + textwrap.dedent(
        f"""
        python env_clients.py {url} env
        {curl}
        python openai_env.py {lab.llm_origin}/v1
        python openai_snippet.py
        """
    )
    out = run_sh(script, lab.work, lab.env()).ok("the README's exports, clients and openai snippet").out
    text = "".join(DOCS_TEXT)
    assert "httpx: 200" in out and "requests: 200" in out and "urllib: 200" in out, out
    assert f"openai from the variables: {text}" in out and f"openai: {text}" in out, out
    recs = find_new(rec, 6, "the clients after the exports")
    by_tid = {r["path"].partition("tid=")[2]: r for r in recs if "tid=" in r["path"]}
    assert sorted(by_tid) == ["env-curl", "env-httpx", "env-requests", "env-urllib"], [r["path"] for r in recs]
    assert all(r["dialect"] == "llm-stream-1.0" for r in by_tid.values())
    chats = [r for r in recs if r["dialect"] == "openai.chat"]
    assert [(r["model"], r["text"], r["outcome"]) for r in chats] == [("gpt-4o", text, "completed")] * 2, chats
    assert len(_tagged(chats, "readme-openai-env")) == 1 and len(_tagged(chats, "README openai snippet")) == 1


def _ensure_record(lab: Lab, model: str) -> None:
    """A recorded chat completion of ``model`` (the test's own traffic, through the proxy)."""
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hello"}]}
    ctx = ssl.create_default_context(cafile=str(lab.ca))
    with httpx.Client(proxy=lab.obs.proxy_url, verify=ctx, trust_env=False, timeout=20) as c:
        assert c.post(f"{lab.llm_origin}/v1/chat/completions", json=body).status_code == 200
    lab.api.wait_record(lambda r: r["model"] == model, timeout=20, what=f"a record of {model}")


def test_readme_read_records(lab: Lab) -> None:
    """The README's TOKEN and curl lines: the token file, the filtered list (every item of the
    model, since the time) and one record by its id."""
    need("curl")
    _ensure_record(lab, "gpt-4o")
    b = block("README.md", "TOKEN=$(cat .observer/api-token)")
    lines = b.text.splitlines()
    assert len(lines) == 3 and "<id>" in lines[2], lines
    listing = subst("\n".join(lines[:2]), ("127.0.0.1:8081", lab.api_hostport))  # TOKEN and the list query
    out = run_sh(listing, lab.work, lab.env()).ok("the README's list query").out
    page = json.loads(out)
    since = datetime.fromisoformat(re.search(r"since=([0-9TZ:-]+)", b.text)[1].replace("Z", "+00:00"))  # type: ignore[index]
    if datetime.now(timezone.utc) >= since:
        assert page["items"], page
    for item in page["items"]:
        assert item["model"] == "gpt-4o" and datetime.fromisoformat(item["started_at"].replace("Z", "+00:00")) >= since
    some_id = page["items"][0]["id"] if page["items"] else lab.api.list(limit=1)["items"][0]["id"]
    script = subst(b.text, ("127.0.0.1:8081", lab.api_hostport), ("<id>", some_id))
    out = run_sh(script, lab.work, lab.env()).ok("the README's TOKEN and curl lines").out
    dec = json.JSONDecoder()
    first, end = dec.raw_decode(out)
    second, _ = dec.raw_decode(out[end:].lstrip())
    assert all(item["model"] == "gpt-4o" for item in first["items"]) and bool(first["items"]) == bool(page["items"])
    assert second.get("id") == some_id and "request" in second and "blocks" in second, second


def test_readme_key_owner(lab: Lab) -> None:
    """The README's key-owner lines, as written, where ``observer run`` keeps its data: the key
    from ``$THE_API_KEY`` on standard input, then the list shows the owner and the fingerprint of
    that key under the run's own fingerprint key; the key is nowhere in the database."""
    from observer.identity import FingerprintKey

    b = block("README.md", "printf '%s\\n' \"$THE_API_KEY\" | observer key-owner add")
    api_key = "sk-docs-" + os.urandom(8).hex()
    out = run_sh(b.text, lab.work, lab.env(THE_API_KEY=api_key)).ok("the README's key-owner lines").out
    key = FingerprintKey.load_or_create(lab.work / ".observer" / "fingerprint-key")
    fingerprint = key.fingerprint(api_key)
    listed = [line for line in out.splitlines() if line.startswith(fingerprint)]
    assert listed and "alice" in listed[0] and "ml-platform" in listed[0], out
    raw = b"".join(p.read_bytes() for p in lab.work.glob("observer.db*"))
    assert api_key.encode() not in raw


def _help_options(cmd: list[str], env: dict[str, str], cwd: Path) -> set[str]:
    p = subprocess.run(
        [str(BIN / "observer"), *cmd, "--help"], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", p.stdout))


def _help_commands(cmd: list[str], env: dict[str, str], cwd: Path) -> set[str]:
    p = subprocess.run(
        [str(BIN / "observer"), *cmd, "--help"], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    section = p.stdout.split("Commands", 1)[1] if "Commands" in p.stdout else ""
    return set(re.findall(r"^[│|]\s+([a-z][a-z-]*)\s", section, re.M))


def test_readme_command_synopsis(tmp_path: Path) -> None:
    """Every ``observer ...`` line of the README's synopsis: its subcommand is listed by the
    ``--help`` of its parent, and every option it names is in its own ``--help``."""
    b = block("README.md", "observer run [--proxy-port 8080]")
    env = clean_env(tmp_path, TERM="dumb", NO_COLOR="1")
    commands: list[tuple[list[str], str]] = []
    for line in b.text.splitlines():
        code = line.split("  #", 1)[0].split(" # ", 1)[0]
        if code.startswith("observer "):
            commands.append((code.split()[1:], code))
        elif code.strip() and commands:
            words, text = commands[-1]
            commands[-1] = (words, text + " " + code.strip())
    assert len(commands) >= 10, commands
    problems = []
    for words, text in commands:
        sub = []
        for w in words:
            if not re.fullmatch(r"[a-z][a-z-]*", w):
                break
            sub.append(w)
        parent_cmds = _help_commands(sub[:-1], env, tmp_path)
        if sub[-1] not in parent_cmds:
            problems.append(f"`observer {' '.join(sub[:-1])} --help` does not list {sub[-1]!r}")
            continue
        opts = _help_options(sub, env, tmp_path)
        for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
            if opt not in opts:
                problems.append(f"`observer {' '.join(sub)} --help` has no {opt}")
        for placeholder in re.findall(r"--<(\w+)>", text):  # `--<setting> VALUE`: one per setting
            from observer.config import SPECS

            flags = {"--" + n.replace("_", "-") for n in SPECS}
            assert placeholder == "setting" and flags & opts, (placeholder, sorted(flags - opts)[:5])
    assert not problems, "\n".join(problems)


def test_readme_alerts_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's alerts TOML, read by the observer's own loader (``load_alert_config``); the
    rule kinds its comment lists are the loader's."""
    from observer.alerting.rules import RULE_KINDS, load_alert_config

    b = block("README.md", "[[webhook]]")
    path = tmp_path / "alerts.toml"
    path.write_text(b.text)
    monkeypatch.setenv("SECOPS_TOKEN", "Bearer from-the-environment")
    cfg = load_alert_config(path)
    assert [w.name for w in cfg.webhook] == ["secops", "chat"]
    assert cfg.webhook[0].resolved_headers() == {"Authorization": "Bearer from-the-environment"}
    assert cfg.webhook[1].format == "slack"
    rules = {r.name: r for r in cfg.rule}
    assert (rules["undeclared tool call"].severity, rules["undeclared tool call"].cooldown_s) == ("critical", 60)
    assert [w.name for w in cfg.targets(rules["undeclared tool call"])] == ["secops", "chat"]
    assert [w.name for w in cfg.targets(rules["errors"])] == ["chat"]
    assert (rules["errors"].limit, rules["errors"].window_s, rules["errors"].min_exchanges) == (0.2, 300, 20)
    comments = " ".join(line.partition("#")[2] for line in b.text.splitlines() if "when =" in line or "  #" in line)
    named = set(re.findall(r"\b([a-z]+_[a-z_]+)\b", comments)) - {"window_s", "min_exchanges"}
    assert named == set(RULE_KINDS), (sorted(named), RULE_KINDS)
    monkeypatch.delenv("SECOPS_TOKEN")
    from observer.errors import ConfigError

    with pytest.raises(ConfigError, match="SECOPS_TOKEN"):
        load_alert_config(path)  # "env:NAME is read from the environment": unset, it stops the start


def test_readme_how_it_works() -> None:
    """The diagram (not runnable): the modules, files and folders it names exist."""
    b = block("README.md", "client ──▶ mitmproxy")
    names = set(re.findall(r"\b((?:observer|addons)(?:[./][A-Za-z_]+)+(?:\.py)?)", b.text))
    assert len(names) >= 8, names
    missing = []
    for name in sorted(names):
        if name.endswith(".py") or "/" in name:
            ok = (REPO / name).exists() or (REPO / (name + ".py")).exists()
            mod, _, attr = name.rpartition(".")
            if not ok and "/" in mod and (REPO / (mod + ".py")).is_file():  # observer/response.assemble
                ok = re.search(rf"^def {attr}\(", (REPO / (mod + ".py")).read_text(), re.M) is not None
        else:  # a dotted module, or module.function
            parts = name.split(".")
            ok = any(
                (REPO / Path(*parts[:n])).with_suffix(".py").exists() or (REPO / Path(*parts[:n])).is_dir()
                for n in (len(parts), len(parts) - 1)
                if n
            )
        if not ok:
            missing.append(name)
    assert not missing, f"named in the diagram but not in the checkout: {missing}"


def test_readme_export_commands(lab: Lab) -> None:
    """The README's export lines as written (in the folder ``observer run`` keeps its data):
    both exports are written, the public key is made, ``export verify`` passes (exit 0)."""
    b = block("README.md", "observer export --out export-2026-06")
    _ensure_record(lab, "gpt-4o")
    for d in ("export-2026-06", "errors"):
        shutil.rmtree(lab.work / d, ignore_errors=True)
    ran = run_sh(b.text, lab.work, lab.env()).ok("the README's export commands")
    for d in ("export-2026-06", "errors"):
        manifest = json.loads((lab.work / d / "manifest.json").read_text())
        assert (lab.work / d / "manifest.sig").is_file()
        assert manifest["format"].startswith("llm-stream-observer export v"), manifest["format"]
    assert json.loads((lab.work / "errors" / "manifest.json").read_text())["file_format"] == "csv"
    assert "BEGIN PUBLIC KEY" in (lab.work / "exporter.pem").read_text()
    assert "verified" in (ran.out + ran.err).lower(), ran
    # and the check fails on a changed export (so exit 0 above meant something)
    (lab.work / "export-2026-06" / "extra.txt").write_text("added\n")
    bad = run_sh("observer export verify export-2026-06 --key exporter.pem", lab.work, lab.env())
    assert bad.code == 1 and "extra.txt" in bad.out + bad.err, bad


DRAFT_BODY = {
    "version": "1.0",
    "stream": True,
    "model": "example-model",
    "messages": [{"role": "user", "content": "What is the weather in Vienna?"}],
}


@contextlib.contextmanager
def background(command: str, cwd: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``command`` (one shell line, ``exec``-ed) in its own process group; SIGINT (Ctrl-C) at the
    end, then SIGKILL after 20 s."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            ["bash", "-c", "exec " + command],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def _summary_pattern(comment: str) -> re.Pattern[str]:
    """The README's example output line, numbers and the file's folder left open."""
    text = comment.strip().lstrip("#").strip()
    text = re.sub(r"(?<=: )/\S*/(?=flows\.mitm)", "@PATH@", text)
    pattern = re.sub(r"\d+", "@N@", re.escape(text))
    return re.compile(pattern.replace("@N@", r"(\d+)").replace("@PATH@", r"(?:\S*/)?"))


@pytest.mark.parametrize("variant", ["addon", "plain"])
def test_readme_dump_and_ingest(lab: Lab, tmp_path: Path, variant: str) -> None:
    """The README's ``mitmdump ... -w flows.mitm`` (with the observer's addon and
    ``store_streamed_bodies``, or the comment's plain ``mitmdump -w``) while one LLM exchange and
    one other request pass, then its ``observer ingest flows.mitm session.har`` (the HAR is
    mitmproxy's own export of the same dump): the summary lines have the documented shape, the
    LLM exchange is recorded from each file, and a second ingest stores nothing new."""
    b = block("README.md", "mitmdump -s addons/llm_audit.py -w flows.mitm")
    commands = [line for line in b.text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(commands) == 2, commands
    dump_line, ingest_line = commands
    dump_line, _, alternative = dump_line.partition("#")
    if variant == "plain":
        assert "a plain mitmdump -w" in alternative, alternative
        dump_line = subst(dump_line, ("-s addons/llm_audit.py ", ""), ("--set store_streamed_bodies=true", ""))
    port = int(lab.upstream.https_port)
    listen = free_port()
    dump_line = subst(
        dump_line,
        (
            "mitmdump ",
            f"{BIN / 'mitmdump'} --listen-host 127.0.0.1 -p {listen} --set ssl_insecure=true "
            + (
                f"--set observer_proxy_allow_loopback=true --set observer_llm_hosts_extra=127.0.0.1:{port} "
                * (variant == "addon")
            ),
        ),
        *([("addons/llm_audit.py", str(REPO / "addons" / "llm_audit.py"))] * (variant == "addon")),
    )
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = clean_env(home)
    ca = home / ".mitmproxy" / "mitmproxy-ca-cert.pem"  # mitmdump's default confdir
    with background(dump_line, work, env, tmp_path / "mitmdump.log") as proc:

        def exited() -> str | None:
            if proc.poll() is None:
                return None
            return f"mitmdump exited {proc.returncode}: {(tmp_path / 'mitmdump.log').read_text()[-2000:]}"

        wait_until(lambda: ca.exists() and port_open(listen), 30, interval=0.1, what="mitmdump", abort=exited)
        ctx = ssl.create_default_context(cafile=str(ca))
        with httpx.Client(proxy=f"http://127.0.0.1:{listen}", verify=ctx, trust_env=False, timeout=20) as c:
            r = wait_until(
                lambda: c.post(
                    f"https://127.0.0.1:{port}/v1/stream?tid=dump-{variant}",
                    json=DRAFT_BODY,
                    headers={"Content-Type": "application/llm-request+json"},
                ),
                20,
                interval=0.2,
                what="the LLM request through mitmdump",
            )
            assert r.status_code == 200 and "stream.end" in r.text, r.text
            assert c.get(f"http://127.0.0.1:{lab.upstream.http_port}/not-llm").status_code == 404
    assert proc.returncode is not None
    assert (work / "flows.mitm").stat().st_size > 0
    har = subprocess.run(
        [str(BIN / "mitmdump"), "-n", "-q", "-r", "flows.mitm", "--set", "hardump=session.har"],
        cwd=work,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert har.returncode == 0 and (work / "session.har").is_file(), har
    pattern = _summary_pattern(b.text.splitlines()[-1] if b.text.splitlines()[-1].startswith("#") else "")
    ingest = run_sh(ingest_line, work, env).ok("observer ingest")
    lines = (ingest.out + ingest.err).splitlines()
    # The addon recorded the exchange live into the same store: the dump's flow has the live
    # record's id, so it is "already stored" (a HAR entry has no flow id: it is a copy).
    expected = {
        "flows.mitm": [2, 0, 1, 1] if variant == "addon" else [2, 1, 0, 1],
        "session.har": [2, 1, 0, 1],
    }
    for name in ("flows.mitm", "session.har"):
        summary = [line for line in lines if f"{name}: " in line and "flows read" in line]
        assert len(summary) == 1, lines
        m = pattern.fullmatch(summary[0].replace("session.har", "flows.mitm"))
        assert m is not None, (summary[0], pattern.pattern)
        assert [int(n) for n in m.groups()] == expected[name], summary[0]  # flows, stored, again, other
    again = run_sh(ingest_line, work, env).ok("observer ingest, again")
    assert (
        again.out.count("0 records stored, 1 already stored") + again.err.count("0 records stored, 1 already stored")
        == 2
    )
    recs = _stored(f"sqlite:///{work / 'observer.db'}")  # the README's default store, in that folder
    mine = [r for r in recs if f"tid=dump-{variant}" in r["path"]]
    files = sorted((r["provenance"] or {}).get("file_format") or "live" for r in mine)
    # one record from each file, but the dump's flow is the live record when the addon ran
    assert files == (["har", "live"] if variant == "addon" else ["har", "mitmproxy"]), files
    for r in mine:
        assert (r["dialect"], r["text"], r["outcome"]) == ("llm-stream-1.0", COMPLETE_TEXT, "completed"), r


def _stored(url: str) -> list[dict[str, Any]]:
    import sqlalchemy as sa

    from observer.store.store import AuditStore

    store = AuditStore(url)
    try:
        with store.engine.connect() as conn:
            ids = conn.scalars(sa.text("SELECT id FROM exchanges ORDER BY started_at")).all()
        return [store.get(i) for i in ids]  # type: ignore[misc]
    finally:
        store.dispose()


@pytest.mark.timeout(300)
def test_readme_make_demo(tmp_path: Path) -> None:
    """``make demo`` as written, but with ``-o install`` (make must not pip-install from a test;
    the demo's own packages are checked first): exit 0, tokens streamed, the stored record's text
    equal to what the SDK printed."""
    b = block("README.md", "make demo")
    need("make")
    from tests.e2e.servers import llama_cpp_available

    ok, why = llama_cpp_available()
    if not ok:
        pytest.skip(f"make demo needs the model server: {why}")
    need_module("openai")
    command = subst(b.text.split("#", 1)[0].strip(), ("make demo", "make -o install demo"))
    ran = run_sh(command, REPO, clean_env(tmp_path), timeout=270).ok("make demo")  # the demo gives up at 240 s
    assert "record text == what the SDK printed: True" in ran.out, ran.out[-3000:]
    assert "[4/4] the stored record" in ran.out


# --------------------------------------------------------------------------------------------
# docs/ca-install.md

GUIDE = "docs/ca-install.md"
GUIDE_PROXY = "observer.corp.example:8080"


def _tagged(recs: list[dict[str, Any]], tag: str) -> list[dict[str, Any]]:
    """The records of requests carrying ``tag`` (in the path's tid or in the request)."""
    return [r for r in recs if tag in r["path"] or tag in json.dumps(r.get("request") or {})]


def _wait_tagged(api: Any, tags: dict[str, int], timeout: float = 20) -> dict[str, list[dict[str, Any]]]:
    """Waits until each tag has (at least) its count of records; returns them by tag."""

    def have() -> dict[str, list[dict[str, Any]]] | None:
        recs = [api.detail(i["id"]) for i in api.list(limit=200)["items"]]
        got = {t: _tagged(recs, t) for t in tags}
        return got if all(len(got[t]) >= n for t, n in tags.items()) else None

    return wait_until(have, timeout, interval=0.2, what=f"records tagged {tags}")


def test_guide_ca_fingerprint(lab: Lab, tmp_path: Path) -> None:
    """The fingerprint line: subject, end date and the SHA-256 fingerprint of the certificate
    (the one the observer made), from the file without the key."""
    need("openssl")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    b = block(GUIDE, "openssl x509 -noout")
    shutil.copy(lab.ca, tmp_path / "mitmproxy-ca-cert.pem")
    out = run_sh(b.text, tmp_path, lab.env()).ok("the fingerprint line").out
    cert = x509.load_pem_x509_certificate(lab.ca.read_bytes())
    want = cert.fingerprint(hashes.SHA256()).hex(":").upper()
    assert re.search(r"^subject=.*mitmproxy", out, re.M), out
    assert re.search(r"^notAfter=", out, re.M), out
    assert f"sha256 Fingerprint={want}" in out, out
    assert "PRIVATE KEY" not in lab.ca.read_text()  # the file to distribute holds no key
    assert "PRIVATE KEY" in (lab.ca.parent / "mitmproxy-ca.pem").read_text()  # the one never to distribute
    assert (lab.ca.parent / "mitmproxy-ca-cert.cer").read_text() == lab.ca.read_text()  # "the same PEM"


def test_guide_proxy_variables(lab: Lab) -> None:
    """Section 3's variables, with the CA trusted (section 2's stand-in: SSL_CERT_FILE and
    REQUESTS_CA_BUNDLE name it and the upstream's own CA): curl, wget and Python's urllib,
    requests and httpx go through the proxy and are recorded; a host in ``NO_PROXY`` is reached
    directly and is not."""
    need("curl")
    alias = loopback_alias()
    b = block(GUIDE, f"export HTTPS_PROXY=http://{GUIDE_PROXY} #")
    exports = subst(b.text, (GUIDE_PROXY, lab.proxy_hostport))
    (lab.work / "env_clients.py").write_text(ENV_CLIENTS)
    via = f"https://{alias}:{lab.upstream.https_port}/v1/stream"
    direct = f"{lab.llm_origin}/v1/stream"
    curl = "curl -sS -N -H 'Content-Type: application/llm-request+json' -d '{}'"
    script = exports + textwrap.dedent(
        f"""
        env | grep -i '_proxy=' | sort
        {curl} '{via}?tid=vars-curl' >/dev/null
        python env_clients.py {via} vars
        {curl} '{direct}?tid=vars-direct' >/dev/null
        """
    )
    tags = {"vars-curl": 1, "vars-httpx": 1, "vars-requests": 1, "vars-urllib": 1}
    if shutil.which("wget"):
        # wget (GnuTLS on Debian) reads the OS store, which the stand-in cannot change: its CA is given
        script += f"wget -q -O /dev/null --ca-certificate \"$SSL_CERT_FILE\" --header 'Content-Type: application/llm-request+json' --post-data '{{}}' '{via}?tid=vars-wget'\n"
        tags["vars-wget"] = 1
    both = str(lab.both_cas())
    out = run_sh(script, lab.work, lab.env(SSL_CERT_FILE=both, REQUESTS_CA_BUNDLE=both)).ok("section 3's variables").out
    variables = dict(re.findall(r"^(\w+)=(.*)$", out, re.M))
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
        assert variables[name.lower()] == variables[name], variables
    assert variables["NO_PROXY"] == "localhost,127.0.0.1,.corp.example"
    got = _wait_tagged(lab.api, tags)
    assert all(r["host"] == alias and r["dialect"] == "llm-stream-1.0" for rs in got.values() for r in rs), got
    assert lab.upstream.wait_exchange("vars-direct").completed  # reached directly ...
    assert not _tagged([lab.api.detail(i["id"]) for i in lab.api.list(limit=200)["items"]], "vars-direct")


PAC_SHIM = r"""
// The PAC helpers a browser provides (Netscape's definitions), then the file, then the checks.
const vm = require("vm");
const fs = require("fs");
const ctx = {
  dnsDomainIs: (host, domain) => host.length >= domain.length && host.endsWith(domain),
  shExpMatch: (str, exp) =>
    new RegExp("^" + exp.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".") + "$").test(str),
};
vm.createContext(ctx);
vm.runInContext(fs.readFileSync(process.argv[2], "utf8"), ctx);
const hosts = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
console.log(JSON.stringify({
  llm_hosts: ctx.LLM_HOSTS,
  observer: ctx.OBSERVER,
  results: Object.fromEntries(hosts.map((h) => [h, ctx.FindProxyForURL("https://" + h + "/v1/x", h)])),
}));
"""


def _example_host(pattern: str) -> str:
    """A concrete host a pattern matches: ``*.`` -> ``x.``, ``*`` in a label -> a region."""
    if pattern.startswith("*."):
        return "eastus-x." + pattern[2:]
    return pattern.replace("*", "us-east-1")


def test_guide_pac_file(tmp_path: Path) -> None:
    """The PAC file, evaluated by node with the standard helpers: its ``LLM_HOSTS`` are
    ``observer.hosts.DEFAULT_LLM_HOSTS``; every host the observer decrypts goes to the observer
    (no ``DIRECT`` fallback), other hosts go direct (over-matching only where ``*`` crosses a
    dot, as the guide says)."""
    need("node")
    from observer.hosts import DEFAULT_LLM_HOSTS, llm_hosts

    b = block(GUIDE, 'var OBSERVER = "PROXY')
    (tmp_path / "proxy.pac").write_text(b.text)
    (tmp_path / "shim.cjs").write_text(PAC_SHIM)
    llm = [_example_host(p) for p in DEFAULT_LLM_HOSTS]
    llm += [h.upper() for h in llm[:3]]
    other = ["example.com", "openai.com", "openai.azure.com", "api.openai.com.example.net", "www.googleapis.com"]
    other += ["s3.us-east-1.amazonaws.com", "substrate.office.com", "githubcopilot.com", "cursor.sh"]
    over = ["bedrock-runtime.a.b.amazonaws.com"]  # shExpMatch's * crosses dots: harmless (tunnelled)
    (tmp_path / "hosts.json").write_text(json.dumps(llm + other + over))
    p = subprocess.run(
        ["node", "shim.cjs", "proxy.pac", "hosts.json"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["llm_hosts"] == list(DEFAULT_LLM_HOSTS), "the PAC file's LLM_HOSTS differ from observer/hosts.py"
    proxy = got["observer"]
    assert proxy == f"PROXY {GUIDE_PROXY}" and "DIRECT" not in proxy
    observer = llm_hosts(None, None)
    for h in llm:
        assert observer.matches(h, 443), h
        assert got["results"][h] == proxy, (h, got["results"][h])
    for h in other:
        assert not observer.matches(h, 443), h
        assert got["results"][h] == "DIRECT", (h, got["results"][h])
    for h in over:
        assert not observer.matches(h, 443) and got["results"][h] == proxy, h


def _make_bundle(lab: Lab, cwd: Path) -> tuple[Ran, Path]:
    """Runs the guide's certifi bundle block (in ``cwd``, with the CA file there) and prints the
    resulting variables; returns the run and the bundle it made."""
    b = block(GUIDE, "export SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt")
    shutil.copy(lab.ca, cwd / "mitmproxy-ca-cert.pem")
    ran = run_sh(
        b.text + 'echo "SSL_CERT_FILE=$SSL_CERT_FILE"\necho "REQUESTS_CA_BUNDLE=$REQUESTS_CA_BUNDLE"\n', cwd, lab.env()
    )
    return ran, lab.home / ".config" / "llm-ca-bundle.pem"


def test_guide_python_bundle(lab: Lab, tmp_path: Path) -> None:
    """The certifi bundle lines, in a fresh home: the bundle holds certifi's roots and the
    observer's CA, both variables name it, and httpx, requests and urllib then go through the
    proxy (HTTPS_PROXY) and are recorded."""
    need_module("certifi")
    shutil.rmtree(lab.home / ".config", ignore_errors=True)  # a fresh home, as on a new machine
    ran, bundle = _make_bundle(lab, tmp_path)
    ran.ok("the certifi bundle lines")
    variables = dict(re.findall(r"^(\w+)=(.*)$", ran.out, re.M))
    assert variables == {"SSL_CERT_FILE": str(bundle), "REQUESTS_CA_BUNDLE": str(bundle)}, variables
    import certifi

    text = bundle.read_text()
    assert text.startswith(Path(certifi.where()).read_text()) and text.endswith(lab.ca.read_text())
    assert text.count("BEGIN CERTIFICATE") > 100
    (tmp_path / "env_clients.py").write_text(ENV_CLIENTS)
    env = lab.env(HTTPS_PROXY=lab.obs.proxy_url, SSL_CERT_FILE=str(bundle), REQUESTS_CA_BUNDLE=str(bundle))
    out = run_sh(f"python env_clients.py {lab.llm_origin}/v1/stream bundle", tmp_path, env).ok("clients").out
    assert "httpx: 200" in out and "requests: 200" in out and "urllib: 200" in out, out
    _wait_tagged(lab.api, {"bundle-httpx": 1, "bundle-requests": 1, "bundle-urllib": 1})


PY_IN_CODE_CALLS = """
# (the test's calls with the clients the snippet describes)
import anthropic, httpx2
print("openai:", "".join(
    c.choices[0].delta.content or ""
    for c in client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "py-in-code-openai"}], stream=True)
    if c.choices
))
PROXY = "http://@PROXY@"
"""


def test_guide_python_in_code(lab: Lab, tmp_path: Path) -> None:
    """The in-code Python snippet as written (BUNDLE: the bundle the guide's lines make), one
    streamed call recorded; and its comment's alternatives: anthropic's DefaultHttpxClient, and
    the generic client it names, for both SDKs."""
    need_module("openai")
    need_module("anthropic")
    ran, bundle = _make_bundle(lab, tmp_path)
    ran.ok("the certifi bundle lines")
    b = block(GUIDE, "import openai")
    snippet = subst(
        b.text,
        ("/etc/ssl/certs/ca-certificates.crt", str(bundle)),
        (f"http://{GUIDE_PROXY}", lab.obs.proxy_url),
    )
    comment = " ".join(line.lstrip("# ").strip() for line in b.text.splitlines() if line.startswith("#"))
    anthropic_ctor = re.search(r"anthropic\.Anthropic\(.*?\)\)", comment)
    generic = re.search(r"a plain (\w+)\.Client\(proxy=\.\.\., verify=BUNDLE\) works for both", comment)
    openai_only = re.search(r"an (\w+)\.Client only for openai \(anthropic refuses it with a (\w+)\)", comment)
    assert anthropic_ctor and generic and openai_only, comment
    code = snippet + PY_IN_CODE_CALLS.replace("@PROXY@", lab.proxy_hostport)
    code += textwrap.dedent(
        f"""
        a = {subst(anthropic_ctor[0], ("proxy=...", "proxy=PROXY"))}
        with a.messages.stream(model="claude-docs", max_tokens=16,
                               messages=[{{"role": "user", "content": "py-in-code-anthropic"}}]) as s:
            print("anthropic:", "".join(s.text_stream))
        import {generic[1]}, {openai_only[1]}
        for name, make in (("{generic[1]}", {generic[1]}.Client), ("{openai_only[1]}", {openai_only[1]}.Client)):
            o2 = openai.OpenAI(api_key="sk-test", http_client=make(proxy=PROXY, verify=BUNDLE))
            print(name, "openai:", "".join(
                c.choices[0].delta.content or ""
                for c in o2.chat.completions.create(
                    model="gpt-4o", messages=[{{"role": "user", "content": f"py-in-code-{{name}}-openai"}}], stream=True)
                if c.choices
            ))
        a2 = anthropic.Anthropic(http_client={generic[1]}.Client(proxy=PROXY, verify=BUNDLE))
        with a2.messages.stream(model="claude-docs", max_tokens=16,
                                messages=[{{"role": "user", "content": "py-in-code-{generic[1]}-anthropic"}}]) as s:
            print("{generic[1]} anthropic:", "".join(s.text_stream))
        try:
            anthropic.Anthropic(http_client={openai_only[1]}.Client(proxy=PROXY, verify=BUNDLE))
        except {openai_only[2]} as e:
            print("{openai_only[1]} anthropic: refused:", e)
        """
    )
    (tmp_path / "in_code.py").write_text(code)
    env = lab.env(
        OPENAI_BASE_URL=f"{lab.llm_origin}/v1",  # the snippet names no base URL: the vendor's, here the upstream
        ANTHROPIC_BASE_URL=lab.llm_origin,
        ANTHROPIC_API_KEY="sk-ant-test",
    )
    out = run_sh("python in_code.py", tmp_path, env).ok("the in-code Python snippet").out
    text = "".join(DOCS_TEXT)
    g, h = generic[1], openai_only[1]
    for what in ("openai", "anthropic", f"{g} openai", f"{h} openai", f"{g} anthropic"):
        assert f"\n{what}: {text}\n" in "\n" + out, (what, out)
    assert f"\n{h} anthropic: refused:" in "\n" + out, out
    tags = ("py-in-code-openai", "py-in-code-anthropic", f"py-in-code-{g}-openai", f"py-in-code-{h}-openai")
    got = _wait_tagged(lab.api, {t: 1 for t in (*tags, f"py-in-code-{g}-anthropic")})
    assert got["py-in-code-openai"][0]["dialect"] == "openai.chat"
    assert got["py-in-code-anthropic"][0]["dialect"] == "anthropic.messages"


NODE_CALLS = r"""
// calls.mjs (the test's): one request of each kind, tagged, with the clients it is given.
export async function calls(openai, anthropic) {
  const tag = process.env.DOCS_TAG;
  const out = {};
  const r = await fetch(`${process.env.DOCS_UPSTREAM}/v1/stream?tid=${tag}-fetch`, {
    method: "POST",
    headers: { "content-type": "application/llm-request+json" },
    body: JSON.stringify({ version: "1.0", stream: true, model: "example-model",
                           messages: [{ role: "user", content: `${tag}-fetch` }] }),
  });
  out.fetch = (await r.text()).includes("stream.end");
  const s = await openai.chat.completions.create({
    model: "gpt-4o", stream: true, messages: [{ role: "user", content: `${tag}-openai` }],
  });
  out.openai = "";
  for await (const c of s) out.openai += c.choices[0]?.delta?.content ?? "";
  const m = await anthropic.messages.create({
    model: "claude-docs", max_tokens: 32, stream: true, messages: [{ role: "user", content: `${tag}-anthropic` }],
  });
  out.anthropic = "";
  for await (const e of m) if (e.type === "content_block_delta" && e.delta.type === "text_delta") out.anthropic += e.delta.text;
  console.log(JSON.stringify(out));
}
"""

NODE_APP = """// app.js (the test's): an application that knows nothing of the proxy.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { calls } from "./calls.mjs";

await calls(new OpenAI(), new Anthropic());
"""


def _node_dir(tmp_path: Path) -> Path:
    """A folder for the Node files, where ``undici`` and the SDKs resolve (``node_modules``: a
    link to ``tests/node/node_modules``) and ``.js`` files are ES modules."""
    d = tmp_path / "node-app"
    d.mkdir()
    (d / "node_modules").symlink_to(NODE_DIR / "node_modules", target_is_directory=True)
    (d / "package.json").write_text('{"type": "module", "private": true}\n')
    (d / "calls.mjs").write_text(NODE_CALLS)
    (d / "app.js").write_text(NODE_APP)
    return d


def _node_env(lab: Lab, origin: str, tag: str, **extra: str) -> dict[str, str]:
    """What the app needs besides the proxy: where the vendor is (the SDKs read their base URL
    and key from the environment) and the test's tag."""
    return lab.env(
        DOCS_UPSTREAM=origin,
        DOCS_TAG=tag,
        OPENAI_API_KEY="sk-test",
        OPENAI_BASE_URL=f"{origin}/v1",
        ANTHROPIC_API_KEY="sk-ant-test",
        ANTHROPIC_BASE_URL=origin,
        **extra,
    )


def _node_result(ran: Ran) -> dict[str, Any]:
    lines = [line for line in ran.out.splitlines() if line.startswith("{")]
    assert lines, ran
    return json.loads(lines[-1])


NODE_KINDS = {"fetch": "llm-stream-1.0", "openai": "openai.chat", "anthropic": "anthropic.messages"}


def _assert_recorded(lab: Lab, tag: str, kinds: tuple[str, ...] = tuple(NODE_KINDS)) -> None:
    got = _wait_tagged(lab.api, {f"{tag}-{k}": 1 for k in kinds})
    for k in kinds:
        [r] = got[f"{tag}-{k}"]
        assert (r["dialect"], r["outcome"]) == (NODE_KINDS[k], "completed"), r


def _assert_not_recorded(lab: Lab, tag: str, kinds: tuple[str, ...]) -> None:
    """Called once a later exchange's record is there (records are stored in order): the
    upstream got these requests, and none was recorded."""
    for k in kinds:
        if k == "fetch":
            assert lab.upstream.wait_exchange(f"{tag}-fetch").completed
    recs = [lab.api.detail(i["id"]) for i in lab.api.list(limit=200)["items"]]
    leaked = [f"{tag}-{k}" for k in kinds if _tagged(recs, f"{tag}-{k}")]
    assert not leaked, f"recorded, though the guide says these bypass the proxy: {leaked}"


def test_guide_node_preload(lab: Lab, tmp_path: Path) -> None:
    """``proxy-setup.mjs`` and the lines that use it, as written, with an app that knows nothing
    of the proxy (fetch, openai, @anthropic-ai/sdk): recorded with ``node --import``, and with
    the comment's ``NODE_OPTIONS``. The pitfall the guide describes: the same app with only
    ``HTTPS_PROXY`` (and a CA it trusts) succeeds and goes direct, unrecorded; and the preload
    without ``NODE_EXTRA_CA_CERTS`` fails (the CA is not trusted)."""
    need_node_packages()
    alias = loopback_alias()
    d = _node_dir(tmp_path)
    (d / "proxy-setup.mjs").write_text(
        block(GUIDE, 'import { setGlobalDispatcher, EnvHttpProxyAgent } from "undici";').text
    )
    b = block(GUIDE, f"export HTTPS_PROXY=http://{GUIDE_PROXY} NO_PROXY=localhost,127.0.0.1")
    lines = subst(
        b.text,
        (GUIDE_PROXY, lab.proxy_hostport),
        ("/etc/llm-stream-observer/mitmproxy-ca-cert.pem", str(lab.ca)),
        ("/abs/path/proxy-setup.mjs", str(d / "proxy-setup.mjs")),
    )
    via = f"https://{alias}:{lab.upstream.https_port}"  # a name NO_PROXY leaves to the proxy
    text = "".join(DOCS_TEXT)
    ok = {"fetch": True, "openai": text, "anthropic": text}

    # the pitfall first: Node 20's fetch and the SDKs ignore HTTPS_PROXY (no NO_PROXY here)
    pitfall = run_sh(
        "node app.js",
        d,
        _node_env(
            lab, lab.llm_origin, "node-direct", HTTPS_PROXY=lab.obs.proxy_url, NODE_EXTRA_CA_CERTS=str(lab.both_cas())
        ),
    )
    assert _node_result(pitfall.ok("the app with HTTPS_PROXY only")) == ok

    as_written = run_sh(lines, d, _node_env(lab, via, "node-import")).ok("the guide's node --import lines")
    assert _node_result(as_written) == ok
    _assert_recorded(lab, "node-import")
    _assert_not_recorded(lab, "node-direct", tuple(NODE_KINDS))

    command = [line for line in lines.splitlines() if line.startswith("node --import ./proxy-setup.mjs app.js")]
    assert len(command) == 1, lines
    alternative = re.search(r'# or (NODE_OPTIONS="--import=[^"]+")', command[0])
    assert alternative is not None, command[0]
    exports = "\n".join(line for line in lines.splitlines() if line.startswith("export "))
    via_options = run_sh(f"{exports}\n{alternative[1]} node app.js", d, _node_env(lab, via, "node-options"))
    assert _node_result(via_options.ok("the NODE_OPTIONS alternative")) == ok
    _assert_recorded(lab, "node-options")

    no_ca = "\n".join(line for line in lines.splitlines() if not line.startswith("export NODE_EXTRA_CA_CERTS="))
    failed = run_sh(no_ca, d, _node_env(lab, via, "node-no-ca"))
    assert failed.code != 0 and "fetch failed" in failed.err, failed


def test_guide_node_in_code(lab: Lab, tmp_path: Path) -> None:
    """The in-code undici snippet as written (global dispatcher and per-client dispatchers):
    fetch, openai and @anthropic-ai/sdk are recorded. Its "one client at a time" half alone:
    the two SDKs are recorded, the process's plain fetch goes direct."""
    need_node_packages()
    d = _node_dir(tmp_path)
    b = block(GUIDE, 'import { setGlobalDispatcher, ProxyAgent } from "undici";')
    tail = '\nimport { calls } from "./calls.mjs";\nawait calls(openai, anthropic);\n'
    (d / "in-code.mjs").write_text(b.text + tail)
    global_line = "setGlobalDispatcher(new ProxyAgent(process.env.HTTPS_PROXY));\n"
    (d / "per-client.mjs").write_text(subst(b.text, (global_line, "")) + tail)
    text = "".join(DOCS_TEXT)
    env = {"HTTPS_PROXY": lab.obs.proxy_url, "NODE_EXTRA_CA_CERTS": str(lab.both_cas())}

    per_client = run_sh("node per-client.mjs", d, _node_env(lab, lab.llm_origin, "node-per-client", **env))
    assert _node_result(per_client.ok("the per-client half")) == {"fetch": True, "openai": text, "anthropic": text}
    _assert_recorded(lab, "node-per-client", ("openai", "anthropic"))
    _assert_not_recorded(lab, "node-per-client", ("fetch",))

    whole = run_sh("node in-code.mjs", d, _node_env(lab, lab.llm_origin, "node-in-code", **env))
    assert _node_result(whole.ok("the in-code snippet")) == {"fetch": True, "openai": text, "anthropic": text}
    _assert_recorded(lab, "node-in-code")


JAVA_PROBE = """
import java.net.ProxySelector;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

// Probe.java (the test's "app.jar"): one POST with java.net.http.HttpClient, built with
// .proxy(ProxySelector.getDefault()) as the guide says; prints the status and the body.
public class Probe {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newBuilder().proxy(ProxySelector.getDefault()).build();
        HttpRequest request = HttpRequest.newBuilder(URI.create(args[0]))
            .header("Content-Type", "application/llm-request+json")
            .POST(HttpRequest.BodyPublishers.ofString(args[1]))
            .build();
        HttpResponse<String> response = client.send(request, HttpResponse.BodyHandlers.ofString());
        System.out.println("status " + response.statusCode());
        System.out.println(response.body());
    }
}
"""


def _java_home() -> str:
    p = subprocess.run(["java", "-XshowSettings:properties", "-version"], capture_output=True, text=True, timeout=60)
    m = re.search(r"^\s*java\.home = (.+)$", p.stderr, re.M)
    assert m is not None, p.stderr[-2000:]
    return m[1].strip()


def test_guide_java(lab: Lab, tmp_path: Path) -> None:
    """The Java lines but the first (``sudo keytool -cacerts`` changes the JDK's own trust store,
    shared by the machine): a copy of ``cacerts`` with the CA imported, then ``java`` with the
    proxy properties (an HttpClient program instead of ``app.jar``): recorded. The target is a
    name of the loopback (the JDK never proxies 127.* or localhost)."""
    need("java", "keytool", "javac")  # a JDK: the source launcher (Probe.java) needs its compiler
    alias = loopback_alias()
    b = block(GUIDE, "sudo keytool -importcert -cacerts")
    lines = b.text.splitlines()
    assert lines[1].startswith("sudo keytool -importcert -cacerts"), lines[:2]
    rest = "\n".join(lines[2:]) + "\n"  # without the comment and the `sudo keytool -cacerts` line
    url = f"https://{alias}:{lab.upstream.https_port}/v1/stream?tid=java-httpclient"
    body = json.dumps({**DRAFT_BODY, "messages": [{"role": "user", "content": "java"}]})
    script = subst(
        rest,
        ("-Dhttps.proxyHost=observer.corp.example", "-Dhttps.proxyHost=127.0.0.1"),
        ("-Dhttps.proxyPort=8080 \\", f"-Dhttps.proxyPort={lab.obs.proxy_port} \\"),
        ("-jar app.jar", f"Probe.java '{url}' '{body}'"),
    )
    shutil.copy(lab.ca, tmp_path / "mitmproxy-ca-cert.pem")
    (tmp_path / "Probe.java").write_text(JAVA_PROBE)
    out = run_sh(script, tmp_path, lab.env(JAVA_HOME=_java_home()), timeout=180).ok("the guide's Java lines").out
    assert "status 200" in out and "stream.end" in out, out
    [r] = _wait_tagged(lab.api, {"java-httpclient": 1})["java-httpclient"]
    assert (r["host"], r["dialect"], r["text"]) == (alias, "llm-stream-1.0", COMPLETE_TEXT), r


def test_guide_s_client(lab: Lab) -> None:
    """The check of section 5: through the proxy, an LLM host shows a certificate issued by the
    observer's CA (the issuer the comment shows), any other host its own."""
    need("openssl")
    b = block(GUIDE, f"openssl s_client -proxy {GUIDE_PROXY}")
    llm, other = f"localhost:{lab.upstream.https_port}", f"localhost:{lab.other.https_port}"
    script = subst(
        b.text,
        (GUIDE_PROXY, lab.proxy_hostport),
        ("-connect api.openai.com:443", f"-connect {llm}"),
        ("-servername api.openai.com", "-servername localhost"),
        ("-connect example.com:443", f"-connect {other}"),
        ("-servername example.com", "-servername localhost"),
    )
    out = run_sh(script, lab.work, lab.env()).ok("the s_client check").out
    issuers = [line.strip() for line in out.splitlines() if line.startswith("issuer=")]
    claimed = re.search(r"#\s*(issuer=.+)$", b.text, re.M)
    assert claimed is not None, b.text
    assert issuers == [claimed[1].strip(), "issuer=CN = e2e upstream test CA"], out
