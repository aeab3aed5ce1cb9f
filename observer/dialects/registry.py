"""The dialect registry: the one place that chooses a dialect for a request.

Adding a vendor is adding one module and one entry in ``default_registry`` — no provider
``if/else`` anywhere else.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping

from observer.dialects.base import Dialect, RequestView

DEFAULT_REGISTRY = "observer.dialects.registry:default_registry"  # see ``load_registry``


class DialectRegistry:
    """An ordered list of dialects; the first whose ``matches`` is true wins (the standard
    media type is checked first, then vendor formats)."""

    def __init__(self, dialects: Iterable[Dialect]) -> None:
        self._dialects = tuple(dialects)
        names = [d.name for d in self._dialects]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate dialect names: {names}")

    @property
    def names(self) -> tuple[str, ...]:
        """Registered dialect names in match order."""
        return tuple(d.name for d in self._dialects)

    def classify(self, request: RequestView, llm_host: bool = True) -> Dialect | None:
        """The dialect for ``request``, or ``None`` for traffic that is not LLM inference.
        ``llm_host``: the request goes to an LLM host (``observer.hosts``); when it does not,
        only a dialect that identifies itself on any host (``any_host``: the draft's media type,
        draft §4.1) can match, never one known by its path alone."""
        for dialect in self._dialects:
            if (llm_host or getattr(dialect, "any_host", False)) and dialect.matches(request):
                return dialect
        return None

    def classify_response(
        self, request: RequestView, response_headers: Mapping[str, str], current: Dialect | None, llm_host: bool = True
    ) -> Dialect | None:
        """The dialect the response headers (lower-case names) reveal, else ``current``: a
        response can show a dialect its request did not (e.g. an AI SDK UI stream answering an
        app-defined ``POST /api/chat``). ``llm_host`` as for ``classify``."""
        for dialect in self._dialects:
            if (llm_host or getattr(dialect, "any_host", False)) and dialect.matches_response(
                request, response_headers
            ):
                return dialect
        return current

    def classify_websocket(self, request: RequestView, llm_host: bool = True) -> Dialect | None:
        """The socket dialect (one with ``matches_websocket`` and ``new_session``) for the
        WebSocket upgrade ``request``, or ``None``; only on an LLM host (``observer.hosts``)."""
        if not llm_host:
            return None
        for dialect in self._dialects:
            matches = getattr(dialect, "matches_websocket", None)
            if matches is not None and matches(request):
                return dialect
        return None

    def get(self, name: str) -> Dialect:
        """The dialect called ``name``; ``KeyError`` if there is none."""
        for dialect in self._dialects:
            if dialect.name == name:
                return dialect
        raise KeyError(name)


def default_registry() -> DialectRegistry:
    """The registry with every built-in dialect in match order: the standard media type first
    (draft §4.1: it identifies LLM traffic without heuristics), then vendor formats by path
    (vendor-wire-formats §1 "practical detection order"); the AI SDK UI stream is recognised by
    its response header."""
    from observer.dialects.anthropic import AnthropicDialect
    from observer.dialects.bedrock import BedrockConverseDialect, BedrockInvokeDialect
    from observer.dialects.connect import CursorDialect, UnknownConnectDialect, WindsurfDialect
    from observer.dialects.copilot import CopilotChatDialect, CopilotDialect
    from observer.dialects.gemini import GeminiDialect
    from observer.dialects.ollama import OllamaDialect
    from observer.dialects.openai_chat import OpenAIChatDialect
    from observer.dialects.openai_responses import OpenAIResponsesDialect
    from observer.dialects.standard import StandardDialect
    from observer.dialects.vercel import VercelUIDialect

    return DialectRegistry(
        [
            StandardDialect(),
            OpenAIChatDialect(),
            OpenAIResponsesDialect(),
            AnthropicDialect(),
            GeminiDialect(),
            OllamaDialect(),
            VercelUIDialect(),
            BedrockConverseDialect(),
            BedrockInvokeDialect(),
            CopilotDialect(),
            CopilotChatDialect(),
            CursorDialect(),
            WindsurfDialect(),
            UnknownConnectDialect(),  # any other Connect/gRPC stream on an LLM host: last
        ]
    )


def load_registry(factory: str = DEFAULT_REGISTRY) -> DialectRegistry:
    """The registry that ``factory`` (``"package.module:function"``, a function of no arguments
    returning a ``DialectRegistry``) builds. The proxy and its worker process both build theirs
    this way, from the same string, so they always have the same dialects. Raises ``ValueError``
    for a malformed name or a function that raises or returns something else, ``ImportError`` /
    ``AttributeError`` for one that does not exist."""
    module_name, sep, attr = factory.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"a dialect registry is named 'package.module:function', got {factory!r}")
    factory_fn = getattr(importlib.import_module(module_name), attr)
    try:
        registry = factory_fn()
    except (Exception, SystemExit) as exc:  # a function that is not a factory (``sys:exit``) must not end the proxy
        raise ValueError(f"{factory} raised {type(exc).__name__}: {exc}") from None
    if not isinstance(registry, DialectRegistry):
        raise ValueError(f"{factory} returned {type(registry).__name__}, not a DialectRegistry")
    return registry
