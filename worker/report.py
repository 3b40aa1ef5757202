"""The report contract: what a verification measured, what it concluded and what it did not verify."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from worker.blockers import Blocker, safe_text

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
    result: Literal["ok", "fail"]


class MetadataCheck(BaseModel):
    key: str
    expected: Any
    actual: Any
    origin: str
    result: Literal["ok", "fail"]


class GateResult(BaseModel):
    name: Literal["storage", "runtime", "release"]
    status: Literal["passed", "failed", "not_run"]
    seconds: float = 0.0
    details: dict[str, Any] = Field(default_factory=dict)


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

    @model_serializer(mode="wrap")
    def _printable(self, handler: SerializerFunctionWrapHandler) -> Any:
        return printable(handler(self))
