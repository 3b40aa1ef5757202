"""The in-toto Statement v1 a verdict is attested by, and its convgate predicate.

The schema is strict (unknown fields refused, digests lowercase sha256 hex): a recipient validates a
statement with these same models, so anything a forger adds or bends fails here even when it carries
a valid signature. Built from the stored report (a JSON dict): the report model refuses fields it
does not know, and a stored report must attest as it was written."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.evidence import TensorFigures, gate_details, storage_details

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://convgate.dev/verification/v1"
NOT_RECORDED = "not recorded in the report"
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
GateStatus = Literal["passed", "failed", "not_run"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # by alias only: `_type`, `llama.cpp`


class Digest(_Strict):
    sha256: Sha256Hex


class Subject(_Strict):
    name: Annotated[str, Field(min_length=1)]
    digest: Digest


class PolicyRef(_Strict):
    sha256: str
    values: dict[str, Any]
    origin: str  # configured:<name>, inline or unrecorded: whose thresholds the verdict was held to


class Versions(_Strict):
    """What measured: the verifier and the references it trusted."""

    convgate: str
    llama_cpp: str = Field(alias="llama.cpp")
    transformers: str
    gguf: str


class Predicate(_Strict):
    verification_id: Annotated[str, Field(min_length=1, max_length=64)]
    reused_from: str | None  # the verification whose run produced this verdict, when it was reused (no run)
    verdict: Literal["GO", "NO-GO"]
    verdict_at: str  # ISO 8601, UTC
    blocker_codes: list[str]
    gates: dict[str, GateStatus]
    policy: PolicyRef
    not_verified: list[str]
    versions: Versions
    tensor_data_sha256: dict[str, Sha256Hex]  # GGUF tensor name -> sha256 of its stored bytes
    tensors_without_digest: list[str]  # rows the report gave no digest for (older reports)
    # the quantization cost gate 2 measured against the source: slice -> figures (KL and its percentiles, Δp,
    # same top token, perplexity ratio; min cosine for embeddings); empty when gate 2 did not measure it
    quality: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # the publishers' OMS signatures that verified with a trusted key and covered every file read
    # ({of, uri, sha256 of the signature file, signer, files}); empty when none was given
    input_signatures: list[dict[str, Any]] = Field(default_factory=list)
    signing_keyid: Sha256Hex


class Statement(_Strict):
    type: Literal["https://in-toto.io/Statement/v1"] = Field(alias="_type")
    subject: Annotated[list[Subject], Field(min_length=1)]
    predicateType: Literal["https://convgate.dev/verification/v1"]  # noqa: N815 - the in-toto field name
    predicate: Predicate


@dataclass(frozen=True, kw_only=True)
class Attested:
    """What a statement is built from: a stored verdict's report and the verification it belongs to."""

    verification_id: str
    report: dict[str, Any]
    verdict_at: datetime
    policy_origin: str
    artifact_uri: str  # the submission's, named when the report has no artifact (it was never fetched)
    artifact_sha256: str
    reused_from: str | None = None


def _subjects(attested: Attested) -> list[Subject]:
    """The artifact first, then every file the report digested, each once."""
    report = attested.report
    artifact = report.get("artifact") or {"uri": attested.artifact_uri, "sha256": attested.artifact_sha256}
    subjects: dict[str, Subject] = {}
    for entry in (artifact, *(report.get("files") or ())):
        subjects.setdefault(entry["uri"], Subject(name=entry["uri"], digest=Digest(sha256=entry["sha256"])))
    return list(subjects.values())


def _tensor_rows(report: dict[str, Any]) -> list[TensorFigures]:
    return storage_details(gate_details(report, "storage")).tensors


def _versions(environment: dict[str, str]) -> Versions:
    llama = environment.get("llama.cpp")
    if llama is None and "llama-cpp-python" in environment:
        llama = f"llama-cpp-python {environment['llama-cpp-python']}"  # the binding vendors llama.cpp
    return Versions.model_validate({"convgate": environment.get("convgate", NOT_RECORDED),
                                    "llama.cpp": llama or NOT_RECORDED,
                                    "transformers": environment.get("transformers", NOT_RECORDED),
                                    "gguf": environment.get("gguf", NOT_RECORDED)})


def _quality(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every slice's figures as gate 2 wrote them, in their order: the statement carries them whole, unread."""
    return dict((gate_details(report, "runtime").get("quality") or {}).get("slices") or {})


def build_statement(attested: Attested, keyid: str) -> Statement:
    """The statement for one verdict; tensor digests sorted by name, so the GGUF header's order does not matter."""
    report = attested.report
    rows = _tensor_rows(report)
    digests = {row.gguf_name: row.data_sha256 for row in rows if row.data_sha256}
    policy = report.get("policy") or {}
    predicate = Predicate(
        verification_id=attested.verification_id, reused_from=attested.reused_from, verdict=report["verdict"],
        verdict_at=attested.verdict_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        blocker_codes=[blocker["code"] for blocker in report.get("blockers") or ()],
        gates={name: gate["status"] for name, gate in (report.get("gates") or {}).items()},
        policy=PolicyRef(sha256=policy.get("sha256", NOT_RECORDED), values=policy.get("values") or {},
                         origin=attested.policy_origin),
        not_verified=list(report.get("not_verified") or ()),
        versions=_versions(report.get("environment") or {}),
        tensor_data_sha256=dict(sorted(digests.items())),
        tensors_without_digest=sorted(row.gguf_name for row in rows if not row.data_sha256),
        quality=_quality(report), input_signatures=list(report.get("signatures") or ()), signing_keyid=keyid)
    return Statement.model_validate({"_type": STATEMENT_TYPE, "subject": _subjects(attested),
                                     "predicateType": PREDICATE_TYPE, "predicate": predicate})


def statement_json(statement: _Strict) -> dict[str, Any]:
    """Any statement (convgate's, or the SLSA summary) as its JSON, by its field aliases (`_type`)."""
    return statement.model_dump(mode="json", by_alias=True)
