"""API request and response bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.policy import Policy

SHA256 = r"^[0-9a-f]{64}$"
GateNumber = Literal[1, 2, 3]
ALL_GATES: tuple[GateNumber, ...] = (1, 2, 3)


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source_uri: str = Field(description="model directory: file://, or hf://owner/repo@<40-hex commit>")
    artifact_uri: str = Field(description="the GGUF: file://, https:// or hf://owner/repo@<commit>/path")
    artifact_sha256: str = Field(pattern=SHA256, description="expected sha256 of the artifact")
    kind: Literal["auto", "embedding", "causal-lm"] = "auto"
    policy: str | Policy = Field("default", description="a policy name known to the server, or an inline policy")
    gates: list[GateNumber] = Field(default_factory=lambda: list(ALL_GATES), min_length=1)
    texts: list[str] | None = Field(None, max_length=1000)
    release_files: list[str] = Field(default_factory=list, max_length=100,
                                     description="other files of the release package (file:// URIs)")


class VerificationOut(BaseModel):
    id: str
    state: str
    attempt: int
    failed_attempts: int = 0
    max_attempts: int
    submitted_by: str
    source_uri: str
    artifact_uri: str
    artifact_sha256: str
    policy_sha256: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, Any] | None
    reason: str | None
    cluster_status: str | None = None
    queue_position: int | None = None
    verdict: str | None
    blockers: list[str] | None = None
    links: dict[str, str]


class VerificationList(BaseModel):
    items: list[VerificationOut]
    next_cursor: str | None


class EventOut(BaseModel):
    at: datetime
    from_state: str | None
    to_state: str
    attempt: int
    message: str


class QueueItem(BaseModel):
    id: str
    state: str
    attempt: int
    failed_attempts: int = 0
    age_seconds: float
    reason: str | None = None
    progress: dict[str, Any] | None
    worker: str | None
    cluster_status: str | None = None
    queue_position: int | None = None


class QueueOut(BaseModel):
    counts: dict[str, int]
    oldest_waiting: QueueItem | None
    active: list[QueueItem]
    dispatcher: str
