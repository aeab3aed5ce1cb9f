"""LLM API hosts: the patterns that decide which traffic the proxy decrypts and records.

A pattern is ``host`` or ``host:port`` (IPv6 in brackets: ``[::1]:8000``); without a port it
matches every port. The host part is a name or an IP address, compared case-insensitively
without a trailing dot, or a glob:

- ``*.example.com``: every name under ``example.com`` (one label or more), not the name itself;
- ``*`` elsewhere stands for part of one label: ``*-aiplatform.googleapis.com`` (Vertex AI's
  regional hosts), ``bedrock-runtime.*.amazonaws.com`` (one region label);
- ``*`` alone: every host (a lab's "record everything").

Pure: no I/O, no globals that change. Matching costs a dictionary lookup per label of the host
plus one precompiled regular expression when the list has globs of the second kind.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

#: The built-in LLM API hosts (``llm_hosts`` replaces them, ``llm_hosts_extra`` adds to them).
#: Sources: each vendor's API reference (base URLs); the Copilot, Cursor and Windsurf hosts from
#: shared reference "binary-formats" §3 and §5. Left out on purpose: hosts that mostly carry other
#: traffic (``substrate.office.com``: all of Microsoft 365, where M365 Copilot's hub also lives),
#: which an operator adds knowingly (README "Which traffic is decrypted").
DEFAULT_LLM_HOSTS: tuple[str, ...] = (
    # OpenAI, Azure OpenAI / AI Foundry, GitHub Models
    "api.openai.com",
    "*.openai.azure.com",
    "*.cognitiveservices.azure.com",
    "*.services.ai.azure.com",
    "models.inference.ai.azure.com",
    "models.github.ai",
    # Anthropic
    "api.anthropic.com",
    # Google AI Studio (Gemini API) and Vertex AI (global and regional endpoints)
    "generativelanguage.googleapis.com",
    "aiplatform.googleapis.com",
    "*-aiplatform.googleapis.com",
    # AWS Bedrock runtime (regional, FIPS)
    "bedrock-runtime.*.amazonaws.com",
    "bedrock-runtime-fips.*.amazonaws.com",
    "bedrock-agent-runtime.*.amazonaws.com",
    # Other inference APIs
    "api.mistral.ai",
    "codestral.mistral.ai",
    "api.cohere.com",
    "api.cohere.ai",
    "api.groq.com",
    "openrouter.ai",
    "api.together.xyz",
    "api.together.ai",
    "api.fireworks.ai",
    "api.deepseek.com",
    "api.x.ai",
    "api.perplexity.ai",
    # Coding assistants and Copilot
    "api.githubcopilot.com",
    "*.githubcopilot.com",
    "copilot-proxy.githubusercontent.com",
    "copilot.microsoft.com",
    "sydney.bing.com",
    "*.cursor.sh",
    "server.codeium.com",
    "inference.codeium.com",
    "server.self-serve.windsurf.com",
)

_LABEL = re.compile(r"^[a-z0-9_*]([a-z0-9_*-]*[a-z0-9_*])?$")


@dataclass(frozen=True, slots=True)
class HostPattern:
    """One parsed pattern: ``host`` lower-cased (IPv6 without brackets, compressed), ``port``
    (``None``: any), and its kind: ``exact``, ``suffix`` (``*.``), ``glob`` or ``any``."""

    host: str
    port: int | None
    kind: str

    @classmethod
    def parse(cls, text: str) -> HostPattern:
        """Parses one pattern; raises ``ValueError`` saying what is wrong (empty, a bad port, a
        scheme or path given, a character a host name cannot have)."""
        raw = text.strip()
        if not raw:
            raise ValueError("an empty host pattern")
        if "/" in raw or "@" in raw:
            raise ValueError(f"{raw!r} is not a host pattern (give the host, e.g. api.example.com, not a URL)")
        host, port = _split_port(raw)
        host = host.lower().rstrip(".")
        if host == "*":
            return cls("*", port, "any")
        try:
            return cls(str(ipaddress.ip_address(host)), port, "exact")
        except ValueError:
            pass
        labels = host.split(".")
        if not host or not all(_LABEL.match(label) for label in labels):
            raise ValueError(f"{raw!r} is not a host name, IP address or host pattern")
        if "*" not in host:
            return cls(host, port, "exact")
        if labels[0] == "*" and len(labels) > 1 and "*" not in ".".join(labels[1:]):
            return cls(".".join(labels[1:]), port, "suffix")
        return cls(host, port, "glob")

    def __str__(self) -> str:
        host = {"any": "*", "suffix": f"*.{self.host}"}.get(self.kind, self.host)
        if self.port is None:
            return host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def _split_port(raw: str) -> tuple[str, int | None]:
    """``(host, port)`` of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; a bare IPv6
    address (several colons) has no port. Raises ``ValueError`` for a port outside 1-65535."""
    if raw.startswith("["):
        host, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{raw!r}: an IPv6 address is written [address] or [address]:port")
        return host, _port(raw, rest[1:]) if rest else None
    if raw.count(":") == 1:
        host, _, port = raw.partition(":")
        return host, _port(raw, port)
    return raw, None


def _port(raw: str, text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"{raw!r}: the port must be 1-65535")
    return int(text)


def parse_patterns(text: str | Iterable[str]) -> list[HostPattern]:
    """The patterns of a comma- (or whitespace-) separated list, or of an iterable of them.
    Raises ``ValueError`` naming the first bad one."""
    items = re.split(r"[,\s]+", text) if isinstance(text, str) else list(text)
    return [HostPattern.parse(item) for item in items if item.strip()]


class HostList:
    """A set of host patterns, matched against a connection's ``host`` (a name or an IP
    address, as the client gave it) and ``port``."""

    __slots__ = ("_any", "_exact", "_glob", "_patterns", "_suffix")

    def __init__(self, patterns: Iterable[HostPattern]) -> None:
        self._patterns = tuple(dict.fromkeys(patterns))
        self._exact: dict[str, set[int | None]] = {}
        self._suffix: dict[str, set[int | None]] = {}
        self._any: set[int | None] = set()
        globs: list[str] = []
        for p in self._patterns:
            if p.kind == "exact":
                self._exact.setdefault(p.host, set()).add(p.port)
            elif p.kind == "suffix":
                self._suffix.setdefault(p.host, set()).add(p.port)
            elif p.kind == "any":
                self._any.add(p.port)
            else:
                body = "[^.]*".join(re.escape(part) for part in p.host.split("*"))
                globs.append(f"{body}:{p.port}" if p.port is not None else f"{body}:[0-9]*")
        self._glob = re.compile("|".join(f"(?:{g})" for g in globs)) if globs else None

    @property
    def patterns(self) -> tuple[HostPattern, ...]:
        return self._patterns

    def __bool__(self) -> bool:
        return bool(self._patterns)

    def matches(self, host: str, port: int | None) -> bool:
        """True when ``host`` (any case, a trailing dot ignored; IPv6 with or without brackets)
        at ``port`` is on the list (``port`` ``None``: only a pattern without a port matches)."""
        if self._any and (None in self._any or port in self._any):
            return True
        name = host.lower().rstrip(".").strip("[]")
        if ":" in name:  # IPv6: compare in one spelling
            try:
                name = str(ipaddress.ip_address(name))
            except ValueError:
                return False
        ports = self._exact.get(name)
        if ports is not None and (None in ports or port in ports):
            return True
        if self._suffix:
            rest = name
            while "." in rest:
                rest = rest.split(".", 1)[1]
                ports = self._suffix.get(rest)
                if ports is not None and (None in ports or port in ports):
                    return True
        return self._glob is not None and self._glob.fullmatch(f"{name}:{port if port is not None else ''}") is not None


def llm_hosts(replace: str | None, extra: str | None) -> HostList:
    """The LLM host list of the settings: ``replace`` (``llm_hosts``) instead of the built-in
    list when given, plus ``extra`` (``llm_hosts_extra``). Raises ``ValueError`` for a bad
    pattern."""
    base = parse_patterns(replace) if replace is not None else parse_patterns(DEFAULT_LLM_HOSTS)
    return HostList([*base, *parse_patterns(extra or "")])


__all__ = ["DEFAULT_LLM_HOSTS", "HostList", "HostPattern", "llm_hosts", "parse_patterns"]
