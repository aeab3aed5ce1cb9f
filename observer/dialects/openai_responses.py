"""OpenAI Responses (``/v1/responses``).

Placeholder: recognises nothing yet (being written).
"""

from __future__ import annotations

from observer.dialects.base import DialectBase, RequestView


class OpenAIResponsesDialect(DialectBase):
    """OpenAI Responses (``/v1/responses``)."""

    name = "openai.responses"

    def matches(self, request: RequestView) -> bool:
        return False
