"""Which upstream addresses the proxy refuses to connect its clients to.

A forward proxy runs next to things its clients must not reach: its own host's loopback
services (trial finding: ``CONNECT 127.0.0.1:5432`` through the proxy reached the audit
database and changed a record; the API was reachable the same way), link-local addresses and
the cloud metadata service (credentials of the machine's role). The proxy refuses, by default:

- loopback (``127.0.0.0/8``, ``::1``) and unspecified (``0.0.0.0``, ``::``: Linux connects those
  to the local host) addresses, unless ``proxy_allow_loopback`` (labs, tests);
- link-local addresses (``169.254.0.0/16``, ``fe80::/10``) and the cloud metadata addresses
  (AWS/GCP/Azure ``169.254.169.254``, AWS IPv6 ``fd00:ec2::254``, Alibaba ``100.100.100.200``),
  always;
- the observer's own ports (its proxy, its API, its database), always, on any address of this
  host and at the database's own address: ``proxy_allow_loopback`` never opens them.

``UpstreamGuard.refusal`` decides from addresses already resolved (pure); ``resolve`` does the
blocking part (name resolution, whether an address is this host's) and runs off the event loop.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from observer.hosts import parse_patterns

if TYPE_CHECKING:
    from observer.config import Settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)
_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


@dataclass(frozen=True, slots=True)
class Resolved:
    """A destination as resolved: every address its name gave (``addresses``) and, per address,
    whether it is one of this host's own (``local``)."""

    host: str
    port: int
    addresses: tuple[IPAddress, ...]
    local: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class UpstreamGuard:
    """The refusal policy. ``protected_ports``: ports never reachable on this host's addresses
    (the proxy's and the API's); ``protected``: ``(address, port)`` pairs never reachable at all
    (the database, resolved)."""

    allow_loopback: bool = False
    protected_ports: frozenset[int] = frozenset()
    protected: frozenset[tuple[IPAddress, int]] = field(default_factory=frozenset)

    def refusal(self, dest: Resolved) -> str | None:
        """Why the proxy refuses ``dest``, or ``None``: the first address that is not allowed
        decides (a name resolving to a public and a loopback address is refused: the connection
        may use either)."""
        for address, local in zip(dest.addresses, dest.local, strict=True):
            why = self._refuse_address(address, local, dest.port)
            if why is not None:
                shown = dest.host if str(address) == dest.host else f"{dest.host} ({address})"
                return f"the audit proxy does not connect to {shown}:{dest.port}: {why}"
        return None

    def _refuse_address(self, address: IPAddress, local: bool, port: int) -> str | None:
        address = _unmapped(address)
        if (address, port) in self.protected:
            return "the observer's own database"
        own_host = local or address.is_loopback or address.is_unspecified
        if own_host and port in self.protected_ports:
            return "a protected port of this host (the observer's own, or protected_upstreams)"
        if address in METADATA_ADDRESSES:
            return "the cloud metadata service"
        if any(address in net for net in _LINK_LOCAL):
            return "a link-local address"
        if (address.is_loopback or address.is_unspecified) and not self.allow_loopback:
            return "a loopback address of the proxy's host (observer setting proxy_allow_loopback)"
        return None


def _unmapped(address: IPAddress) -> IPAddress:
    """``::ffff:127.0.0.1`` as ``127.0.0.1``: an IPv4-mapped address reaches the IPv4 one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def literal(host: str) -> IPAddress | None:
    """``host`` as an IP address (brackets allowed), else ``None``."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def resolve(host: str, port: int) -> Resolved:
    """Resolves ``host`` (a name or an address) as the proxy's connection will (``getaddrinfo``,
    TCP) and tells which addresses are this host's (an address this process can bind is one of
    its own). Blocking: call it off the event loop. A name that does not resolve gives no
    addresses (the proxy's own connection attempt then fails and says so)."""
    ip = literal(host)
    if ip is not None:
        addresses = [ip]
    else:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            infos = []
        addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0].split("%", 1)[0]) for info in infos))
    return Resolved(host, port, tuple(addresses), tuple(is_local(a) for a in addresses))


def is_local(address: IPAddress) -> bool:
    """True when ``address`` is assigned to this host (it can be bound), or is loopback or
    unspecified. (With ``net.ipv4.ip_nonlocal_bind`` set, every address binds and counts as
    local: only the observer's own ports are refused more often, never fewer.)"""
    address = _unmapped(address)
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((str(address), 0))
        return True
    except OSError:
        return False


def protected_pairs(targets: Iterable[tuple[str, int]]) -> frozenset[tuple[IPAddress, int]]:
    """The ``(address, port)`` pairs of ``targets`` (names resolved, blocking)."""
    pairs = set()
    for host, port in targets:
        for address in resolve(host, port).addresses:
            pairs.add((_unmapped(address), port))
    return frozenset(pairs)


def build_guard(settings: Settings, listen_ports: frozenset[int]) -> UpstreamGuard:
    """The upstream guard of ``settings`` (blocking: resolves the protected names). Protected:
    the proxy's own ports (``listen_ports``), the database of ``db`` (PostgreSQL; a local one's
    port on every address of this host), and ``protected_upstreams`` (observer run adds its API):
    each one's port on every address of this host when it is local, else its own address."""
    targets = [*_db_address(settings.db), *_host_ports(settings.protected_upstreams)]
    local_ports = set(listen_ports)
    remote = []
    for host, port in targets:
        dest = resolve(host, port)
        if not dest.addresses or any(dest.local):
            local_ports.add(port)  # (a name that does not resolve now: its port, everywhere here)
        if not all(dest.local):
            remote.append((host, port))
    return UpstreamGuard(
        allow_loopback=settings.proxy_allow_loopback,
        protected_ports=frozenset(local_ports),
        protected=protected_pairs(remote),
    )


def _db_address(url: str) -> list[tuple[str, int]]:
    """``(host, port)`` of a PostgreSQL URL (default ``localhost:5432``; a socket folder is no
    TCP address), else ``[]`` (SQLite is a file)."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:
        return []
    if not parsed.drivername.startswith("postgresql"):
        return []
    host = parsed.host or "localhost"
    return [] if host.startswith("/") else [(host, parsed.port or 5432)]


def _host_ports(text: str | None) -> list[tuple[str, int]]:
    return [(p.host, p.port) for p in parse_patterns(text or "") if p.port is not None]


__all__ = [
    "METADATA_ADDRESSES",
    "Resolved",
    "UpstreamGuard",
    "build_guard",
    "is_local",
    "literal",
    "protected_pairs",
    "resolve",
]
