"""Saved captures: which kind a file is, its SHA-256, and its flows as mitmproxy ``HTTPFlow``
objects.

Two kinds, told apart by their first bytes (a UTF-8 BOM and leading whitespace skipped):

- ``mitmproxy``: a flow dump (``mitmdump -w FILE``, mitmproxy's "save"): tnetstring records,
  each starting with its length in ASCII digits, read with mitmproxy's own ``FlowReader`` (which
  migrates dumps of older versions). An empty file is an empty dump (``mitmdump -w`` makes one
  when no flow passed). Bodies are the content-encoded bytes (``raw_content``) as the proxy kept
  them; a body the proxy streamed is not in the dump (``raw_content`` ``None``) unless it ran
  with ``--set store_streamed_bodies=true``.
- ``har``: an HTTP Archive 1.2 (JSON, ``log.entries``), each entry made a flow by mitmproxy's
  HAR reader (``mitmproxy.io.har.request_to_flow``: ``response.content.text`` decoded from
  base64 when ``encoding`` says so, the body then content-decoded). Here in addition: a
  ``postData`` with ``encoding: base64`` is decoded; a response without ``content.text`` has no
  body (``raw_content`` ``None``, as a streamed one in a dump); status 0 (no response: blocked,
  failed; Chrome's ``_error`` says why) is a flow with an error and no response.

Errors (``IngestError``, one line each, never a traceback): ``NotACapture`` for a file that is
neither (or a dump whose first flow cannot be read); ``DamagedCapture`` for a dump that cannot
be read on after some flows (those were yielded); an unreadable HAR entry is a ``SavedFlow``
with ``unreadable`` set, the others are read on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mitmproxy import flow as mitmflow
from mitmproxy import http
from mitmproxy.io import FlowReader
from mitmproxy.io.har import request_to_flow

from observer.errors import ObserverError

DUMP = "mitmproxy"
HAR = "har"
#: Bytes hashed per read.
READ_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"


class IngestError(ObserverError):
    """A capture that cannot be ingested (read), said in one line."""

    code = "ingest_error"


class NotACapture(IngestError):
    """The file is neither a mitmproxy flow dump nor a HAR file."""

    code = "not_a_capture"


class DamagedCapture(IngestError):
    """A flow dump that cannot be read on after ``flows_read`` flows."""

    code = "damaged_capture"

    def __init__(self, message: str, flows_read: int) -> None:
        super().__init__(message)
        self.flows_read = flows_read


@dataclass(frozen=True, slots=True)
class Capture:
    """A capture file: ``path`` (absolute), ``sha256`` (hex, of its bytes when opened),
    ``file_format`` (``DUMP`` or ``HAR``), ``size_bytes``."""

    path: Path
    sha256: str
    file_format: str
    size_bytes: int


@dataclass(slots=True)
class SavedFlow:
    """One flow of a capture: ``flow_id`` (the dump's flow id; ``entry-<n>``, 0-based, in a HAR),
    the ``flow`` (``None``: not an HTTP flow, or an unreadable HAR entry), ``kind`` (the flow's
    type, e.g. ``tcp``, when it is not HTTP), ``unreadable`` (why a HAR entry could not be
    read) and ``offset_bytes`` (how far into the file its end is, for progress; a HAR's
    entries share its bytes out evenly)."""

    flow_id: str
    flow: http.HTTPFlow | None
    kind: str = "http"
    unreadable: str | None = None
    offset_bytes: int = 0


def open_capture(path: str | Path) -> Capture:
    """The capture at ``path``: hashed (SHA-256 of every byte) and its kind told from its first
    bytes. Raises ``IngestError`` when it cannot be read, ``NotACapture`` when it is neither kind."""
    given = Path(path)
    digest = hashlib.sha256()
    head = b""
    size = 0
    try:
        with open(given, "rb") as f:
            while chunk := f.read(READ_BYTES):
                if len(head) < 64:
                    head += chunk[: 64 - len(head)]
                digest.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise IngestError(f"cannot read {given}: {exc.strerror or exc}") from None
    start = head.removeprefix(_BOM).lstrip()
    if start.startswith(b"{"):
        kind = HAR
    elif not start or start[:1].isdigit():
        kind = DUMP
    else:
        raise NotACapture(f"{given}: not a mitmproxy flow dump or HAR file (it begins {head[:16]!r})")
    capture = Capture(given.resolve(), digest.hexdigest(), kind, size)
    _probe(capture)
    return capture


def _probe(capture: Capture) -> None:
    """Raises ``NotACapture`` now for a file whose first bytes looked right but which is not a
    capture (JSON without ``log.entries``, a dump whose first flow does not read), so that
    ``observer ingest`` refuses it before it makes or migrates a store (trial finding). A HAR
    file is parsed here and again when read; a dump only to its first flow."""
    if capture.file_format == HAR:
        next(_har_flows(capture.path), None)
    else:
        next(_dump_flows(capture.path), None)


def read_flows(capture: Capture) -> Iterator[SavedFlow]:
    """The capture's flows in file order (see the module docstring for the errors raised)."""
    if capture.file_format == HAR:
        yield from _har_flows(capture.path)
    else:
        yield from _dump_flows(capture.path)


def _dump_flows(path: Path) -> Iterator[SavedFlow]:
    read = 0
    try:
        with open(path, "rb") as f:
            for saved in FlowReader(f).stream():
                read += 1
                if isinstance(saved, http.HTTPFlow):
                    yield SavedFlow(saved.id, saved, offset_bytes=f.tell())
                else:
                    yield SavedFlow(saved.id, None, kind=saved.type, offset_bytes=f.tell())
    except OSError as exc:
        raise IngestError(f"cannot read {path}: {exc.strerror or exc}") from None
    except Exception as exc:  # noqa: BLE001 - mitmproxy's reader raises several kinds for a bad file
        reason = str(exc) or type(exc).__name__
        if read == 0:
            raise NotACapture(f"{path}: not a mitmproxy flow dump or HAR file ({reason})") from None
        raise DamagedCapture(f"{path}: damaged after flow {read}, the rest is not read ({reason})", read) from None


def _har_flows(path: Path) -> Iterator[SavedFlow]:
    try:
        raw = path.read_bytes()
        archive = json.loads(raw.decode("utf-8-sig"))
    except OSError as exc:
        raise IngestError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise NotACapture(f"{path}: not a mitmproxy flow dump or HAR file (not JSON: {exc})") from None
    log = archive.get("log") if isinstance(archive, dict) else None
    entries = log.get("entries") if isinstance(log, dict) else None
    if not isinstance(entries, list):
        raise NotACapture(f"{path}: JSON, but not a HAR file (no log.entries list)")
    for n, entry in enumerate(entries):
        flow_id, offset = f"entry-{n}", len(raw) * (n + 1) // len(entries)
        try:
            flow = har_flow(entry)
        except Exception as exc:  # noqa: BLE001 - a malformed entry: reported, the others read on
            yield SavedFlow(flow_id, None, unreadable=f"{type(exc).__name__}: {exc}", offset_bytes=offset)
            continue
        yield SavedFlow(flow_id, flow, offset_bytes=offset)


def har_flow(entry: dict[str, Any]) -> http.HTTPFlow:
    """The flow of one HAR entry (module docstring). Raises ``KeyError``, ``TypeError``,
    ``ValueError`` (and what mitmproxy's reader raises) for a malformed entry."""
    if not isinstance(entry, dict):
        raise TypeError(f"an entry is an object, not {type(entry).__name__}")
    flow = request_to_flow(entry)
    post = entry["request"].get("postData") or {}
    if post.get("encoding") == "base64":
        try:
            flow.request.content = base64.b64decode(post.get("text") or "", validate=True)
        except binascii.Error as exc:
            raise ValueError(f"request.postData.text is not base64: {exc}") from None
    response = entry["response"]
    content = response.get("content") or {}
    if not response.get("status"):
        reason = response.get("_error") or entry.get("_error") or "no response (HAR status 0)"
        flow.response = None
        flow.error = mitmflow.Error(str(reason), timestamp=flow.request.timestamp_end or flow.request.timestamp_start)
    elif "text" not in content:
        flow.response.raw_content = None  # type: ignore[union-attr]
    return flow


__all__ = [
    "DUMP",
    "HAR",
    "Capture",
    "DamagedCapture",
    "IngestError",
    "NotACapture",
    "SavedFlow",
    "har_flow",
    "open_capture",
    "read_flows",
]
