"""Vercel AI SDK UI message stream v5 and the v4 data stream.

Placeholder: recognises nothing yet (being written).
"""

from __future__ import annotations

from observer.dialects.base import DialectBase, RequestView


class VercelUIDialect(DialectBase):
    """Vercel AI SDK UI message stream v5 and the v4 data stream."""

    name = "vercel.ui"

    def matches(self, request: RequestView) -> bool:
        return False
