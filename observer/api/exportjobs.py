"""Export jobs started over the API (``POST /v1/exports``): each runs ``observer.store.export``
in a thread of the API process into ``<exports_dir>/<job id>/``.

State: the jobs this process started are known with their progress (``ExportJobs``, kept on
``app.state``, never module-level); an export finished earlier or by another process is
found by its folder (a folder with a manifest is a finished export; ``export`` removes its
files on failure, so a folder without one is a job running elsewhere or one cut off by a
crash: ``incomplete``). At most ``MAX_RUNNING`` jobs run at once (more: 409 ``busy``): an export
reads the whole range and the API must keep answering.

Files are served only by the names the manifest lists (plus the manifest and its signature),
so no request can name another path.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from observer.shape import rfc3339
from observer.store.checkpoint import CheckpointKey
from observer.store.exportjobs import error_text
from observer.store.manifest import MANIFEST, SIGNATURE
from observer.store.reader import RecordFilter
from observer.store.store import AuditStore

log = logging.getLogger(__name__)

MAX_RUNNING = 2


class Busy(Exception):
    """``MAX_RUNNING`` exports are running."""


@dataclass
class Job:
    """One export job: ``status`` is ``running``, ``done``, ``failed`` or ``incomplete``."""

    id: str
    format: str
    filter: dict[str, Any]
    created_at: datetime
    created_by: str
    status: str = "running"
    total: int | None = None
    done: int = 0
    error: str | None = None
    files: list[dict[str, Any]] = field(default_factory=list)
    records: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "format": self.format,
            "filter": self.filter,
            "created_at": rfc3339(self.created_at),
            "created_by": self.created_by,
            "total": self.total,
            "done": self.done,
            "records": self.records,
            "error": self.error,
            "files": self.files,
        }


class ExportJobs:
    """The export jobs of one API process over ``directory``."""

    def __init__(self, store: AuditStore, key: CheckpointKey, directory: Path) -> None:
        self.store = store
        self.key = key
        self.directory = directory
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, f: RecordFilter, file_format: str, actor: str) -> Job:
        """Starts a job in a thread; raises ``Busy``."""
        with self._lock:
            if sum(j.status == "running" for j in self._jobs.values()) >= MAX_RUNNING:
                raise Busy(f"{MAX_RUNNING} exports are running; try again when one is done")
            job = Job(str(uuid.uuid4()), file_format, f.as_dict(), datetime.now(timezone.utc), actor)
            self._jobs[job.id] = job
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        thread = threading.Thread(target=self._run, args=(job, f), name=f"export-{job.id[:8]}", daemon=True)
        thread.start()
        return job

    def _run(self, job: Job, f: RecordFilter) -> None:
        from observer.store.export import export

        def total(n: int) -> None:
            job.total = n

        def progress(n: int) -> None:
            job.done += n

        try:
            manifest = export(
                self.store, f, job.format, self.directory / job.id, self.key, total=total, progress=progress
            )
        except Exception as exc:  # noqa: BLE001 - any failure is the job's outcome, told to its caller
            job.error = error_text(exc)[:2000]  # one line: a driver's, never its statement
            job.status = "failed"
            log.warning("audit API: export %s failed: %s", job.id, job.error)
            return
        job.files = _files(manifest)
        job.records = _records(manifest)
        job.status = "done"

    def get(self, job_id: str) -> Job | None:
        """The job, from memory or from its folder; ``None`` when neither knows it."""
        with self._lock:
            job = self._jobs.get(job_id)
        if job is not None:
            return job
        try:
            uuid.UUID(job_id)
        except ValueError:
            return None
        return _from_folder(self.directory / job_id)

    def list(self) -> list[Job]:
        """Every job known, newest first."""
        with self._lock:
            jobs = dict(self._jobs)
        if self.directory.is_dir():
            for folder in self.directory.iterdir():
                if folder.name not in jobs and folder.is_dir():
                    found = _from_folder(folder)
                    if found is not None:
                        jobs[found.id] = found
        return sorted(jobs.values(), key=lambda j: j.created_at, reverse=True)

    def file(self, job: Job, name: str) -> Path | None:
        """The path of a finished job's file ``name`` (a listed file, the manifest or its
        signature), or ``None``."""
        if job.status != "done":
            return None
        allowed = {f["name"] for f in job.files} | {MANIFEST, SIGNATURE}
        if name not in allowed:
            return None
        path = self.directory / job.id / name
        return path if path.is_file() else None


def _files(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: f.get(k) for k in ("name", "holds", "rows", "bytes", "sha256")} for f in manifest.get("files", [])]


def _records(manifest: dict[str, Any]) -> int | None:
    records = (manifest.get("totals") or {}).get("records")
    return records if isinstance(records, int) else None


def _from_folder(folder: Path) -> Job | None:
    try:
        job_id = str(uuid.UUID(folder.name))
    except ValueError:
        return None
    if not folder.is_dir():
        return None
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_bytes())
    except FileNotFoundError:
        created = datetime.fromtimestamp(folder.stat().st_mtime, timezone.utc)
        return Job(job_id, "?", {}, created, "?", status="incomplete")
    except (OSError, ValueError):
        return None
    created = manifest.get("created_at")
    try:
        from observer.shape import parse_rfc3339

        created_at = parse_rfc3339(created) if isinstance(created, str) else datetime.now(timezone.utc)
    except ValueError:
        created_at = datetime.now(timezone.utc)
    return Job(
        job_id,
        str(manifest.get("file_format", "?")),
        manifest.get("filters") or {},
        created_at,
        "?",
        status="done",
        files=_files(manifest),
        records=_records(manifest),
    )
