"""One leading UTF-8 byte order mark, stripped once even when it arrives split across chunks.

Shared by the framers: WHATWG "UTF-8 decode" strips exactly one leading BOM (SSE, HTML
§9.2.5); RFC 8259 §8.1 lets a JSON parser ignore one (NDJSON, JSON array). A later BOM is
ordinary data.
"""

from __future__ import annotations

BOM = b"\xef\xbb\xbf"


class LeadingBOM:
    """Strips one BOM at the start of a byte stream: ``feed`` returns the data with it removed,
        holding up to 2 bytes (returning ``b""``) while they could still begin one; ``flush`` at end
        of stream returns held bytes that turned out to be content. ``stripped`` says whether a BOM
        was removed; ``held_bytes`` how many bytes are held (for buffer accounting); ``settled`` whether
    the question is decided (then ``feed`` is the identity)."""

    __slots__ = ("_held", "stripped")

    def __init__(self) -> None:
        self._held: bytes | None = b""
        self.stripped = False

    @property
    def settled(self) -> bool:
        """True once the first bytes decided the BOM question: ``feed`` then returns its input."""
        return self._held is None

    @property
    def held_bytes(self) -> int:
        return len(self._held) if self._held else 0

    def feed(self, data: bytes) -> bytes:
        if self._held is None:
            return data
        head = self._held + data
        if len(head) < len(BOM) and BOM.startswith(head):
            self._held = head
            return b""
        self._held = None
        if head.startswith(BOM):
            self.stripped = True
            return head[len(BOM) :]
        return head

    def flush(self) -> bytes:
        held, self._held = self._held, None
        return held or b""
