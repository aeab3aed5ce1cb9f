"""Offline ingest (``observer ingest FILE...``): saved captures run through the capture path
into the audit store.

- ``observer.ingest.captures``: the files: a mitmproxy flow dump (``mitmdump -w``) or a HAR
  file, recognised by their bytes, hashed, read flow by flow;
- ``observer.ingest.replay``: each flow through the real addon (``observer.capture.hooks.LLMAudit``)
  in the order of the live hooks, so that what is recorded, and how, is decided as live;
- ``observer.ingest.writer``: the records into the store, a chain of their own per run, with
  signed checkpoints;
- ``observer.ingest.run``: the three together, per file, with the counts ``observer ingest``
  reports.
"""

from __future__ import annotations

from observer.ingest.captures import Capture, IngestError, NotACapture, open_capture
from observer.ingest.run import FileReport, ingest_file, record_id

__all__ = ["Capture", "FileReport", "IngestError", "NotACapture", "ingest_file", "open_capture", "record_id"]
