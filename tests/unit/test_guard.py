"""The upstream guard (``observer.capture.guard``): which destinations the proxy refuses.

Expected refusals are written by hand from the module's rules (issue 14 item 9: loopback,
link-local, the cloud metadata address and the observer's own ports; RFC 6890 special-purpose
address ranges)."""

from __future__ import annotations

import ipaddress

import pytest

from observer.capture.guard import Resolved, UpstreamGuard, build_guard, is_local, resolve
from observer.config import Settings


def dest(host: str, port: int, *addresses: str, local: bool | None = None) -> Resolved:
    ips = tuple(ipaddress.ip_address(a) for a in (addresses or (host,)))
    flags = tuple(local if local is not None else (ip.is_loopback or ip.is_unspecified) for ip in ips)
    return Resolved(host, port, ips, flags)


STRICT = UpstreamGuard(protected_ports=frozenset({8080, 8081}))
LAB = UpstreamGuard(allow_loopback=True, protected_ports=frozenset({8080, 8081, 5432}))


@pytest.mark.parametrize(
    ("guard", "target", "why"),
    [
        (STRICT, dest("api.openai.com", 443, "162.159.140.245"), None),
        (STRICT, dest("10.0.0.5", 8000), None),
        (STRICT, dest("127.0.0.1", 5432), "a loopback address of the proxy's host"),
        (STRICT, dest("127.0.0.2", 80), "a loopback address of the proxy's host"),
        (STRICT, dest("::1", 443), "a loopback address of the proxy's host"),
        (STRICT, dest("::ffff:127.0.0.1", 443), "a loopback address of the proxy's host"),
        (STRICT, dest("0.0.0.0", 22), "a loopback address of the proxy's host"),
        (STRICT, dest("localtest.me", 5432, "127.0.0.1"), "a loopback address of the proxy's host"),
        (STRICT, dest("dual.example", 443, "93.184.216.34", "127.0.0.1"), "a loopback address"),
        (STRICT, dest("169.254.169.254", 80), "the cloud metadata service"),
        (STRICT, dest("metadata.google.internal", 80, "169.254.169.254"), "the cloud metadata service"),
        (STRICT, dest("fd00:ec2::254", 80), "the cloud metadata service"),
        (STRICT, dest("100.100.100.200", 80), "the cloud metadata service"),
        (STRICT, dest("169.254.10.1", 80), "a link-local address"),
        (STRICT, dest("fe80::1", 80), "a link-local address"),
        (STRICT, dest("127.0.0.1", 8081), "a protected port of this host"),
        (STRICT, dest("10.1.2.3", 8081, local=True), "a protected port of this host"),
        (STRICT, dest("10.1.2.3", 8081, local=False), None),
        (LAB, dest("127.0.0.1", 40123), None),
        (LAB, dest("localhost", 40123, "127.0.0.1", "::1"), None),
        (LAB, dest("127.0.0.1", 8081), "a protected port of this host"),
        (LAB, dest("127.0.0.1", 5432), "a protected port of this host"),
        (LAB, dest("0.0.0.0", 8080), "a protected port of this host"),
        (LAB, dest("169.254.169.254", 80), "the cloud metadata service"),
        (LAB, dest("fe80::1", 80), "a link-local address"),
        (STRICT, Resolved("no-such-host.invalid", 443, (), ()), None),  # the proxy's own connect fails
    ],
)
def test_refusals(guard, target, why):
    got = guard.refusal(target)
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got
        assert got.startswith(f"the audit proxy does not connect to {target.host}")


def test_a_remote_database_is_refused_at_its_own_address_only():
    guard = UpstreamGuard(protected=frozenset({(ipaddress.ip_address("10.0.0.9"), 5432)}))
    assert "the observer's own database" in guard.refusal(dest("db.internal", 5432, "10.0.0.9"))
    assert guard.refusal(dest("10.0.0.9", 5433)) is None
    assert guard.refusal(dest("10.0.0.8", 5432)) is None


def test_the_guard_of_the_settings_protects_the_proxy_the_api_and_the_database():
    """``build_guard``: a database on this host protects its port on every address here; the
    API's address (``observer run`` adds it to ``protected_upstreams``) too; the proxy's own
    listening ports; a remote upstream only at its own address."""
    settings = Settings.model_construct(
        db="postgresql+psycopg://u@127.0.0.1:6543/audit",
        protected_upstreams="127.0.0.1:8081,192.0.2.10:9000",
        proxy_allow_loopback=True,
    )
    guard = build_guard(settings, frozenset({8080}))
    assert guard.allow_loopback is True
    assert guard.protected_ports == frozenset({8080, 8081, 6543})
    assert guard.protected == frozenset({(ipaddress.ip_address("192.0.2.10"), 9000)})
    sqlite = build_guard(Settings.model_construct(db="sqlite:///x.db", protected_upstreams=None), frozenset())
    assert sqlite.protected_ports == frozenset() and sqlite.protected == frozenset()
    default_pg = build_guard(
        Settings.model_construct(db="postgresql://u@/audit", protected_upstreams=None), frozenset()
    )
    assert default_pg.protected_ports == frozenset({5432})  # localhost:5432, libpq's default


def test_resolve_and_is_local():
    assert resolve("127.0.0.1", 80) == Resolved("127.0.0.1", 80, (ipaddress.ip_address("127.0.0.1"),), (True,))
    assert resolve("[::1]", 80).addresses == (ipaddress.ip_address("::1"),)
    assert ipaddress.ip_address("127.0.0.1") in resolve("localhost", 80).addresses
    assert resolve("no-such-host.invalid", 80).addresses == ()
    assert is_local(ipaddress.ip_address("0.0.0.0"))
    assert not is_local(ipaddress.ip_address("192.0.2.1"))  # TEST-NET-1: never this host's
