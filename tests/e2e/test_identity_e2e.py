"""Who sent it (issue 16, item 3), end to end: ``observer run`` requiring proxy authentication
(mitmproxy's ``proxyauth``, ``--set proxyauth=user:pass``), a client sending an API key through
it to a local upstream, then ``observer key-owner add`` with that key on standard input, and the
API's ``proxy_user`` / ``key_owner`` / ``key_fingerprint`` filters.

The expected fingerprint is computed by ``openssl dgst -mac HMAC`` from the key file the run made
(``DATA_DIR/fingerprint-key``), not by the observer's code. Checked too: neither the API key nor
the proxy password is anywhere in the database file, and a request without proxy credentials is
answered 407 by the proxy and not recorded.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.harness import ObserverProcess, stream_request, tool
from tests.e2e.upstream import UpstreamServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def _draft_request(tid: str) -> dict[str, Any]:
    return {
        "version": "1.0",
        "model": "example-model-latest",
        "stream": True,
        "messages": [{"role": "user", "content": "Hello"}],
        "metadata": {"session_id": tid},
    }


def _openssl_hmac(key_hex: str, data: bytes) -> str:
    out = subprocess.run(
        ["openssl", "dgst", "-sha256", "-mac", "HMAC", "-macopt", f"hexkey:{key_hex}"],
        input=data,
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    return out.strip().rsplit(" ", 1)[-1]


def _openssl_fingerprint(key_file: Path, credential: str) -> str:
    """HMAC(K_f, credential), K_f = HMAC(secret, "llm-stream-observer:key-fingerprint") (observer.identity)."""
    k_f = _openssl_hmac(key_file.read_text().strip(), b"llm-stream-observer:key-fingerprint")
    return "hmac-sha256:" + _openssl_hmac(k_f, credential.encode())[:32]


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    workdir = tmp_path_factory.mktemp("e2e-identity")
    proc = ObserverProcess(workdir=str(workdir), sets={"proxyauth": "alice:pw-never-stored-7f3a"})
    proc.start(timeout=45)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_proxy_user_key_fingerprint_and_key_owner(authed: ObserverProcess) -> None:
    api = authed.api()
    api_key = "sk-e2e-" + uuid.uuid4().hex
    tid = "e2e-" + uuid.uuid4().hex[:12]
    with UpstreamServer() as upstream:
        proxied = authed.proxy_url.replace("http://", "http://alice:pw-never-stored-7f3a@")
        res = stream_request(
            upstream.url(f"/v1/stream?tid={tid}&gap_ms=10"),
            proxy=proxied,
            json_body=_draft_request(tid),
            headers={"Authorization": f"Bearer {api_key}"},
        )
        assert res.error is None, res.error
        rec = api.wait_tid(tid)
        # no proxy credentials: the proxy answers 407 and nothing reaches the upstream or the store
        refused_tid = "e2e-" + uuid.uuid4().hex[:12]
        with httpx.Client(proxy=authed.proxy_url, trust_env=False, timeout=10) as client:
            refused = client.post(upstream.url(f"/v1/stream?tid={refused_tid}"), json=_draft_request(refused_tid))
        assert refused.status_code == 407
    expected_fp = _openssl_fingerprint(authed.workdir / "data" / "fingerprint-key", api_key)
    assert (rec["proxy_user"], rec["client_address"], rec["key_fingerprint"]) == ("alice", "127.0.0.1", expected_fp)
    assert rec["key_owner"] is None

    cli = [tool("observer"), "key-owner"]
    common = ["--db", authed.db_url]
    env_data = {"OBSERVER_DATA_DIR": str(authed.workdir / "data")}
    added = subprocess.run(
        [*cli, "add", "--owner", "alice", "--team", "ml-platform", *common],
        input=f"{api_key}\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), **env_data},
    )
    assert added.returncode == 0, added.stderr
    assert expected_fp in added.stdout
    printed = subprocess.run(
        [*cli, "fingerprint", *common],
        input=api_key,
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), **env_data},
    )
    assert printed.stdout.strip() == expected_fp
    again = subprocess.run(
        [*cli, "add", "--owner", "bob", *common],
        input=api_key,
        capture_output=True,
        text=True,
        timeout=60,
        env={**_env(), **env_data},
    )
    assert again.returncode == 2 and "alice" in again.stderr and "--replace" in again.stderr

    assert api.get(rec["id"])["key_owner"] == {"owner": "alice", "team": "ml-platform"}
    for params, found in (
        ({"proxy_user": "alice"}, True),
        ({"proxy_user": "bob"}, False),
        ({"key_owner": "ml-platform"}, True),
        ({"key_owner": "alice"}, True),
        ({"key_owner": "nobody"}, False),
        ({"key_fingerprint": expected_fp}, True),
    ):
        r = api.request("/v1/exchanges", params=params)
        assert r.status_code == 200, r.text
        ids = [i["id"] for i in r.json()["items"]]
        assert (rec["id"] in ids) is found, (params, ids)
    assert api.request("/v1/exchanges", params={"proxy_user": "a\x00"}).status_code == 400

    assert not any(refused_tid in str(i.get("path")) for i in api.all_items())
    db_file = Path(authed.db_url.removeprefix("sqlite:///"))
    raw = b"".join(p.read_bytes() for p in db_file.parent.glob(db_file.name + "*"))
    assert api_key.encode() not in raw and b"pw-never-stored-7f3a" not in raw


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("OBSERVER_")}
