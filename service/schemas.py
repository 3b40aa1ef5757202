"""API request and response bodies."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from engine.formats.gguf_split import shard_name
from engine.gates.runtime.labelled_retrieval import LabelledSetDocument
from engine.policy import Policy
from service.lifecycle import State
from service.persistence.clock import in_utc

SHA256 = r"^[0-9a-f]{64}$"
GateNumber = Literal[1, 2, 3]
ALL_GATES: tuple[GateNumber, ...] = (1, 2, 3)
# Input limits: a request body is at most Settings.max_body_bytes (1 MiB by default, else 413);
# inside it, gate 2's texts are bounded in count, length and total size (else 422).
MAX_TEXTS = 1000
MAX_SUBMITTED_SHARDS = 1024  # a 70B F16 in 5 GB shards is ~30; a split is at most 65535 (split.count is a u16)
MAX_TEXT_CHARS = 8192
MAX_TEXTS_BYTES = 512 * 1024
# No control characters (NUL cannot be stored in Postgres text, and none belongs in a URI or a name).
# pydantic refuses a lone surrogate before matching any pattern (it is not Unicode), so each pattern
# refuses those as well: every string field has one.
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
# A URI as RFC 3986 writes it: no whitespace or control character, and `%` only as a well-formed escape of
# a byte other than NUL (`%00` decodes to a NUL in a path, which no file system call accepts). Stored URIs
# hold no whitespace, which edge.redact relies on to find their end in a message.
URI = r"^(?:[^%\s\x00-\x1f\x7f-\x9f]|%(?:0[1-9A-Fa-f]|[1-9A-Fa-f][0-9A-Fa-f]))+$"
UriText = Annotated[str, Field(min_length=1, max_length=4096, pattern=URI,
                               description="no whitespace or control characters; '%' only as a %XX escape other "
                               "than %00")]
Sha256Text = Annotated[str, Field(min_length=64, max_length=64, pattern=SHA256)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=r"^[^\x00]*$")]


def _not_probe(name: str) -> str:
    """`probe:*` slices are gate 2's own pre-tokenizer probe; a set may not pass for one."""
    if name.startswith("probe"):
        raise ValueError("a text set's name may not start with 'probe'")
    return name


SetName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9_-]+$"), AfterValidator(_not_probe)]
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _iso_only(value: object) -> object:
    """A query time is ISO 8601 as documented; pydantic alone would also read `0` as the Unix epoch."""
    if isinstance(value, str) and not ISO_DATE.match(value):
        raise ValueError("expected an ISO 8601 date-time, e.g. 2026-11-30T12:00:00Z")
    return value


def _representable(value: datetime) -> datetime:
    """The instant in UTC, which every column holds; a valid date whose offset carries it outside year
    1..9999 in UTC (`9999-12-31T23:59:59-23:59`) is refused here, not met as an OverflowError later."""
    try:
        return in_utc(value)
    except OverflowError:
        raise ValueError("the instant, in UTC, is outside the years 1 to 9999") from None


Moment = Annotated[datetime, BeforeValidator(_iso_only), AfterValidator(_representable)]


class SubmitRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source_uri: UriText = Field(description="model directory: file://, or hf://owner/repo@<40-hex commit>")
    artifact_uri: UriText = Field(description="the GGUF: file://, https:// or hf://owner/repo@<commit>/path")
    artifact_sha256: Sha256Text = Field(description="expected sha256 of the artifact (a split's first shard)")
    artifact_shard_sha256: list[Sha256Text] | None = Field(
        None, min_length=2, max_length=MAX_SUBMITTED_SHARDS,
        description="a gguf-split artifact: every shard's expected sha256 in order, the first's (artifact_sha256) "
        "included. artifact_uri names the first shard (...-00001-of-0000n.gguf); the others are fetched from "
        "beside it under their published names")
    kind: Literal["auto", "embedding", "causal-lm"] = "auto"
    policy: Annotated[str, Field(max_length=63, pattern=PRINTABLE)] | Policy = Field(
        "default", description="a policy name configured by the operator, or an inline policy (role policy-author; "
        "its version is prefixed 'inline-' and the verdict is marked inline)")
    gates: list[GateNumber] = Field(default_factory=lambda: list(ALL_GATES), min_length=1)
    texts: list[Text] | None = Field(
        None, max_length=MAX_TEXTS,
        description=f"at most {MAX_TEXTS} texts of at most {MAX_TEXT_CHARS} characters, {MAX_TEXTS_BYTES} bytes "
        "of UTF-8 in all")
    text_sets: dict[SetName, list[Text]] | None = Field(
        None, max_length=32, description="named text sets (a language, a domain): gate 2 reports its measures per "
        "set and a policy may budget each; counted with `texts` in the limits above")
    labelled_set: LabelledSetDocument | None = Field(
        None, description="embeddings: a labelled retrieval set (passages; queries with their relevant passage ids "
        "and hard negatives) gate 2 measures instead of its built-in one; the request body's size limit applies")
    release_files: list[UriText] = Field(default_factory=list, max_length=100,
                                         description="other files of the release package (file:// URIs)")
    imatrix_uri: UriText | None = Field(None, description="the importance matrix the artifact was quantized with "
                                        "(llama.cpp GGUF or legacy .dat), fetched like the artifact")
    imatrix_sha256: Sha256Text | None = Field(None, description="its expected sha256 (with imatrix_uri)")
    source_signature_uri: UriText | None = Field(
        None, description="the source publisher's OpenSSF Model Signing signature (a bundle JSON), fetched like the "
        "artifact; it must verify with a key the operator trusts and cover every source file read")
    source_signature_sha256: Sha256Text | None = Field(None, description="its expected sha256 (with the URI)")
    artifact_signature_uri: UriText | None = Field(
        None, description="the artifact publisher's OpenSSF Model Signing signature, checked the same way")
    artifact_signature_sha256: Sha256Text | None = Field(None, description="its expected sha256 (with the URI)")
    artifact_size: int | None = Field(None, ge=1, le=1 << 50, description="the artifact's size in bytes, if known: "
                                      "on Kubernetes, gate 1 of a large artifact is split over several pods")
    callback_url: UriText | None = Field(None, description="POSTed the verification's summary on a terminal state, "
                                         "signed with the submitter's callback secret (POST /v1/callback-secret); "
                                         "checked by the artifacts' URI policy (https, public addresses)")
    fresh: bool = Field(False, description="run even when an identical pinned submission already has a verdict "
                                           "(otherwise that verdict is returned at once, marked reused_from)")

    @model_validator(mode="after")
    def _imatrix_with_digest(self) -> SubmitRequest:
        for name in ("imatrix", "source_signature", "artifact_signature"):
            if (getattr(self, f"{name}_uri") is None) != (getattr(self, f"{name}_sha256") is None):
                raise ValueError(f"{name}_uri and {name}_sha256 go together")
        return self

    @model_validator(mode="after")
    def _split_pinned_whole(self) -> SubmitRequest:
        """A split is submitted by its first shard's URI and every shard's digest: a shard nobody pinned is
        never fetched, and a URI that names shard 2 of 3 is not where llama.cpp starts."""
        name = shard_name(PurePosixPath(urlsplit(self.artifact_uri).path))
        shards = self.artifact_shard_sha256
        if shards is None:
            if name is not None and name.count > 1:
                raise ValueError(f"artifact_uri names shard {name.number} of a {name.count}-shard split: submit the "
                                 "first shard's URI with every shard's sha256 in artifact_shard_sha256")
            return self
        if name is None or name.number != 1 or name.count != len(shards):
            raise ValueError(f"with {len(shards)} shard digests, artifact_uri names the first shard: "
                             f"...-00001-of-{len(shards):05d}.gguf")
        if shards[0].lower() != self.artifact_sha256.lower():
            raise ValueError("artifact_shard_sha256 starts with the first shard's sha256, artifact_sha256")
        return self

    @model_validator(mode="after")
    def _texts_total(self) -> SubmitRequest:
        """Every text, loose or in a set, counts towards one budget of count and bytes."""
        every = [*(self.texts or ()), *(t for members in (self.text_sets or {}).values() for t in members)]
        if len(every) > MAX_TEXTS:
            raise ValueError(f"more than {MAX_TEXTS} texts in all")
        if sum(len(t.encode("utf-8", "surrogatepass")) for t in every) > MAX_TEXTS_BYTES:
            raise ValueError(f"texts hold more than {MAX_TEXTS_BYTES} bytes of UTF-8 in all")
        return self


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
    policy_origin: str = Field(description="'configured:<name>', 'inline', or 'unrecorded' (before the origin was "
                               "stored): only 'configured:…' verdicts were held to the operator's thresholds")
    policy_version: str | None = None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: dict[str, Any] | None
    reason: str | None
    reason_code: str | None = Field(None, description="why, as a code: service.lifecycle.Reason")
    cluster_status: str | None = None
    queue_position: int | None = None
    verdict: str | None
    blockers: list[str] | None = None
    reused_from: str | None = Field(None, description="the verification whose run produced this verdict, when it "
                                    "was reused without a Job")
    links: dict[str, str]


class VerificationList(BaseModel):
    items: list[VerificationOut]
    next_cursor: str | None


class ListQuery(BaseModel):
    """GET /v1/verifications's query: the auditor's filters and the page (`service.api.declared`)."""

    artifact_sha256: Annotated[str | None, Field(pattern=SHA256)] = None
    source_uri: Annotated[str | None, Field(max_length=4096, pattern=PRINTABLE)] = None
    verdict: Literal["GO", "NO-GO"] | None = None
    state: State | None = None
    submitted_by: Annotated[str | None, Field(max_length=128, pattern=PRINTABLE)] = None
    policy_origin: Literal["configured", "inline", "unrecorded"] | None = Field(
        None, description="configured: held to a policy the operator configured; inline: to a caller's own")
    policy: str | None = Field(None, max_length=63, pattern=PRINTABLE, description="the name of a configured policy")
    since: Moment | None = None
    until: Moment | None = None
    limit: int = Field(50, ge=1, le=500)
    cursor: Annotated[str | None, Field(max_length=256)] = None


class AccessLogEntry(BaseModel):
    id: int
    at: datetime
    principal: str
    role: str
    action: str
    verification_id: str | None
    path: str
    query: dict[str, Any]


class AccessLogPage(BaseModel):
    items: list[AccessLogEntry]
    next_cursor: str | None


class ErrorOut(BaseModel):
    """Every 4xx: a message, or (422 for malformed input) the list of what was wrong, and its stable code."""

    detail: str | list[dict[str, Any]]
    code: str = Field(description="stable and dotted, e.g. submission.refused or auth.unauthenticated: branch on "
                                  "this, not on the message")


class EventOut(BaseModel):
    at: datetime
    from_state: str | None
    to_state: str
    attempt: int
    message: str


class CallbackSecretOut(BaseModel):
    secret: str = Field(description="the HMAC-SHA256 key callbacks are signed with; shown only now")
    created_at: datetime


class CallbackDeliveryOut(BaseModel):
    attempt: int
    delivery_id: str
    at: datetime
    status_code: int | None
    error: str | None
    next_retry_at: datetime | None


class CallbacksOut(BaseModel):
    callback_url: str | None = Field(description="redacted")
    state: Literal["pending", "delivered", "failed"] | None
    deliveries: list[CallbackDeliveryOut]


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
    submitted_by: str | None = None
    artifact_uri: str | None = None
    source_uri: str | None = None
    wait_seconds: float | None = Field(None, description="from submission until its worker started (or now)")
    run_seconds: float | None = Field(None, description="since its worker started; none before")
    estimated_start_seconds: float | None = Field(
        None, description="a waiting one's expected start, in seconds from now (see `estimate`); none once started, "
        "or with no finished run to learn from")
    estimated_start_at: datetime | None = None


class QueueEstimate(BaseModel):
    """What the start estimates stand on: the median run time of the latest finished runs (and, when their
    sizes say how size matters, run time = fixed + per GiB of artifact), how many are assumed to run at once
    (as many as run now under Kueue's quota, or the local pool's workers), and how far off the estimator
    was on a replay of the latest finished runs (service/queue_replay.py)."""

    runs: int
    median_run_seconds: float | None
    parallel: int
    fixed_seconds: float | None = None
    seconds_per_gib: float | None = None
    replayed_runs: int = Field(0, description="finished runs the estimator was replayed on")
    median_abs_error_seconds: float | None = Field(None, description="median |estimated - observed| start")
    p90_abs_error_seconds: float | None = Field(None, description="90th percentile |estimated - observed| start")


class QueueOut(BaseModel):
    counts: dict[str, int]
    oldest_waiting: QueueItem | None
    active: list[QueueItem]
    dispatcher: str
    estimate: QueueEstimate | None = None
