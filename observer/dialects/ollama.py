"""Ollama native ``/api/chat`` and ``/api/generate`` (NDJSON).

Placeholder: recognises nothing yet (being written).
"""

from __future__ import annotations

from observer.dialects.base import DialectBase, RequestView


class OllamaDialect(DialectBase):
    """Ollama native ``/api/chat`` and ``/api/generate`` (NDJSON)."""

    name = "ollama"

    def matches(self, request: RequestView) -> bool:
        return False
