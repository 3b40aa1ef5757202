"""The report contract: what a verification measured, what it concluded and what it did not verify."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from engine.blockers import Blocker, GateName, safe_text

CheckKind = Literal["bit-exact", "reproduced", "bounded"]


class TensorRow(BaseModel):
    """One GGUF tensor against its source."""

    model_config = ConfigDict(extra="forbid")

    gguf_name: str
    source_names: list[str]
    transform: str | None
    gguf_type: str
    source_dtype: str
    shape: list[int]
    check: CheckKind
    reproducer: str | None = None
    input_precision: str | None = None
    max_abs: float
    rel_l2: float
    mismatched: int
    ties_forgiven: int = 0
    not_finite: int = 0
    signed_zero_flips: int = 0
    bound: str | None = None
    bound_violations: int | None = None
    reader_crosscheck: Literal["agree", "disagree"] | None = None
    blocks: int | None = None  # quantized: blocks compared (`mismatched` counts blocks then)
    sampled_from: int | None = None  # reproduction sampled `blocks` of this many (policy reproduce_sample)
    not_reproduced: str | None = None  # why a tensor the policy wanted reproduced could not be
    data_sha256: str | None = None  # sha256 of the tensor's bytes as stored: a recipient checks tensor by tensor
    result: Literal["ok", "fail"]


class MetadataCheck(BaseModel):
    key: str
    expected: Any
    actual: Any
    origin: str
    result: Literal["ok", "fail"]


class GateResult(BaseModel):
    name: GateName
    status: Literal["passed", "failed", "not_run"]
    seconds: float = 0.0
    details: dict[str, Any] = Field(default_factory=dict)


class Control(BaseModel):
    """One negative control: a defect planted in memory in a copy of what a gate measured, judged by that
    gate's own comparison. A ruler that cannot fail on this very artifact makes its passes worthless."""

    model_config = ConfigDict(extra="forbid")

    gate: GateName
    check: str  # the comparison exercised: tensor values, tokenizer ids, embeddings, logits, release digest
    defect: str  # what was planted, in words
    location: str | None = None  # where: tensor and byte, text and position
    outcome: Literal["detected", "not_detected", "not_applicable"]
    detected_by: list[str] = Field(default_factory=list)  # blocker codes the planted copy raised
    why: str | None = None  # why a control was not applicable
    seconds: float


class FileDigest(BaseModel):
    uri: str
    sha256: str
    size: int


def printable(value: Any) -> Any:
    """`value` with every string (dict keys too) safe to encode as UTF-8: GGUF strings that were not
    valid UTF-8 are kept with surrogate escapes for comparison, and written as backslash escapes."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value


class SignatureCheck(BaseModel):
    """A publisher's signature that verified with a trusted key and covered every file read of its input."""

    of: Literal["source", "artifact"]
    uri: str
    sha256: str  # of the signature file
    signer: str  # sha256 of the signing key (SubjectPublicKeyInfo PEM)
    files: int  # the files it was checked to cover


class Report(BaseModel):
    """The JSON report. `verdict` is GO only when `blockers` is empty and every requested gate ran.

    It always serialises: free-form details may hold strings read from hostile files."""

    verdict: Literal["GO", "NO-GO"]
    blockers: list[Blocker]
    gates: dict[str, GateResult]
    policy: dict[str, Any]
    artifact: FileDigest | None
    files: list[FileDigest]
    not_verified: list[str]
    environment: dict[str, str]
    timings: dict[str, float]
    controls: list[Control] = Field(default_factory=list)  # the negative controls run before trusting a GO
    signatures: list[SignatureCheck] = Field(default_factory=list)  # publishers' signatures that verified

    @model_serializer(mode="wrap")
    def _printable(self, handler: SerializerFunctionWrapHandler) -> Any:
        return printable(handler(self))
