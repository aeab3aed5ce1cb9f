"""Anthropic Messages (``/v1/messages``).

Placeholder: recognises nothing yet (being written).
"""

from __future__ import annotations

from observer.dialects.base import DialectBase, RequestView


class AnthropicDialect(DialectBase):
    """Anthropic Messages (``/v1/messages``)."""

    name = "anthropic.messages"

    def matches(self, request: RequestView) -> bool:
        return False
