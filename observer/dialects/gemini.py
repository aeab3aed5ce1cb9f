"""Google Gemini ``:streamGenerateContent`` / ``:generateContent``.

Placeholder: recognises nothing yet (being written).
"""

from __future__ import annotations

from observer.dialects.base import DialectBase, RequestView


class GeminiDialect(DialectBase):
    """Google Gemini ``:streamGenerateContent`` / ``:generateContent``."""

    name = "gemini"

    def matches(self, request: RequestView) -> bool:
        return False
