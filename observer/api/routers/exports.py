"""``/v1/exports``: start an export job, follow its progress, download its files and signed
manifest (``observer.api.exportjobs``; the files are those of ``observer export``, checked
offline with ``observer export verify``). Needs the ``export`` permission."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field

from observer.api.access import note
from observer.api.auth import Principal, require
from observer.api.errors import APIError
from observer.api.exportjobs import Busy, ExportJobs
from observer.api.filters import time_value
from observer.api.routers import actor_of
from observer.api.schemas import ErrorResponse, ExportJobOut
from observer.store.exportfiles import parquet_available
from observer.store.reader import RecordFilter

router = APIRouter(prefix="/exports", tags=["exports"], dependencies=[Depends(require("export"))])


class ExportCreate(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"format": "jsonl", "since": "2026-11-01T00:00:00Z", "until": "2026-12-01T00:00:00Z", "user": ["alice"]}
            ]
        },
    )
    format: Literal["jsonl", "csv", "parquet"] = "jsonl"
    since: str | None = Field(default=None, description="Records started at or after (RFC 3339)")
    until: str | None = Field(default=None, description="Records started before (RFC 3339)")
    model: list[str] = Field(default_factory=list, max_length=100, description="gen_ai.response or request model")
    host: list[str] = Field(default_factory=list, max_length=100)
    user: list[str] = Field(default_factory=list, max_length=100, description="enduser.id")
    dialect: list[str] = Field(default_factory=list, max_length=100)
    outcome: list[str] = Field(default_factory=list, max_length=100)


def get_jobs(request: Request) -> ExportJobs:
    jobs: ExportJobs | None = request.app.state.exports
    if jobs is None:
        raise APIError(503, "exports_unavailable", "this API has no export folder or checkpoint key")
    return jobs


JobsDep = Annotated[ExportJobs, Depends(get_jobs)]


@router.post(
    "",
    response_model=ExportJobOut,
    status_code=status.HTTP_202_ACCEPTED,
    summary="Start an export job",
    responses={status.HTTP_409_CONFLICT: {"model": ErrorResponse, "description": "Too many exports running"}},
)
def start_export(
    request: Request,
    jobs: JobsDep,
    principal: Annotated[Principal, Depends(require("export"))],
    body: ExportCreate,
) -> dict[str, Any]:
    """The chain over the range is verified first (a break fails the job, nothing is signed)."""
    note(request, body=body.model_dump())
    if body.format == "parquet" and not parquet_available():
        raise APIError(status.HTTP_400_BAD_REQUEST, "invalid_parameter", "the parquet format needs pyarrow")
    for name in ("model", "host", "user", "dialect", "outcome"):
        if any("\x00" in v or len(v) > 500 for v in getattr(body, name)):
            raise APIError(status.HTTP_400_BAD_REQUEST, "invalid_parameter", f"{name}: at most 500 characters, no NUL")
    since, until = time_value("since", body.since), time_value("until", body.until)
    if since is not None and until is not None and until <= since:
        raise APIError(status.HTTP_400_BAD_REQUEST, "invalid_parameter", "until must be after since")
    f = RecordFilter(
        since=since,
        until=until,
        models=tuple(body.model),
        hosts=tuple(body.host),
        users=tuple(body.user),
        dialects=tuple(body.dialect),
        outcomes=tuple(body.outcome),
    )
    try:
        job = jobs.start(f, body.format, actor_of(principal))
    except Busy as exc:
        raise APIError(status.HTTP_409_CONFLICT, "busy", str(exc)) from None
    note(request, rows=1, ids=[job.id])
    return job.to_dict()


@router.get("", response_model=list[ExportJobOut], summary="List export jobs, newest first")
def list_exports(request: Request, jobs: JobsDep) -> list[dict[str, Any]]:
    items = [j.to_dict() for j in jobs.list()]
    note(request, rows=len(items), ids=[i["id"] for i in items])
    return items


@router.get(
    "/{job_id}",
    response_model=ExportJobOut,
    summary="An export job's progress and files",
    responses={status.HTTP_404_NOT_FOUND: {"model": ErrorResponse}},
)
def get_export(request: Request, jobs: JobsDep, job_id: Annotated[str, Path()]) -> dict[str, Any]:
    job = jobs.get(job_id)
    if job is None:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", "no such export")
    note(request, rows=1, ids=[job.id])
    return job.to_dict()


@router.get(
    "/{job_id}/files/{name}",
    summary="Download a file of a finished export (its data files, manifest.json, its signature)",
    response_class=FileResponse,
    responses={status.HTTP_404_NOT_FOUND: {"model": ErrorResponse}},
)
def download(
    request: Request, jobs: JobsDep, job_id: Annotated[str, Path()], name: Annotated[str, Path()]
) -> FileResponse:
    job = jobs.get(job_id)
    path = None if job is None else jobs.file(job, name)
    if job is None or path is None:
        raise APIError(status.HTTP_404_NOT_FOUND, "not_found", "no such file of a finished export")
    note(request, rows=1, ids=[job.id])
    return FileResponse(path, filename=name, media_type="application/octet-stream")
