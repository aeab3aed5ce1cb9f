"""OpenAI Chat Completions (``/v1/chat/completions`` and compatible servers).

Placeholder: recognises nothing yet (being written).
"""

from __future__ import annotations

from observer.dialects.base import DialectBase, RequestView


class OpenAIChatDialect(DialectBase):
    """OpenAI Chat Completions (``/v1/chat/completions`` and compatible servers)."""

    name = "openai.chat"

    def matches(self, request: RequestView) -> bool:
        return False
