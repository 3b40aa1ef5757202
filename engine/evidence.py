"""The gates' evidence as its readers see it: typed models of what the CLI summary, the Markdown report and
model card, and the attestation statement read from a gate's `details`.

A report's `details` stays the JSON each gate writes (its bytes are what attestations sign and auditors
compare, `tests/integration/golden/`); these models are how every reader gets at it, so a reader names a
field once, with its type, and a figure a gate may leave out is optional here rather than a KeyError in
one reader (top-1 agreement is not written when no position is decisive). Unknown fields are kept
(`extra="allow"`): a reader sees what it declared, and the report keeps what the gate wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.report import FileDigest


class _Evidence(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ImatrixUse(_Evidence):
    format: str
    sha256: str
    tensors_weighted: int


class Sampling(_Evidence):
    super_blocks_reproduced: int
    super_blocks_total: int
    fraction: float
    seed: str
    detection_probability: dict[str, float]


class TensorFigures(_Evidence):
    """A tensor's row as the readers need it; lenient where `engine.report.TensorRow` is strict, so a report
    stored by an earlier version (no per-tensor digest yet) still reads."""

    gguf_name: str
    gguf_type: str | None = None
    reproducer: str | None = None
    ties_forgiven: int = 0
    data_sha256: str | None = None


class MetadataFigures(_Evidence):
    key: str
    result: str


class StorageDetails(_Evidence):
    """Gate 1: every tensor's row, how each type was checked, the metadata keys, the importance matrix used."""

    check_kinds: dict[str, dict[str, int]] = Field(default_factory=dict)  # GGUF type -> check kind -> tensors
    tensors: list[TensorFigures] = Field(default_factory=list)
    metadata: list[MetadataFigures] = Field(default_factory=list)
    metadata_not_verified: list[str] = Field(default_factory=list)
    imatrix: ImatrixUse | None = None
    sampling: Sampling | None = None


class TokenizerFigures(_Evidence):
    per_combination: dict[str, int] = Field(default_factory=dict)  # flag combination -> texts with equal ids
    normalizer: list[str] = Field(default_factory=list)
    diagnosis: str | None = None


class Retrieval(_Evidence):
    agreement: float


class EmbeddingFigures(_Evidence):
    """Embeddings against the reference; the figures are absent when no text could be compared."""

    per_text: list[Any] = Field(default_factory=list)
    min_cosine: float | None = None
    retrieval: Retrieval | None = None
    pooling: str | None = None
    normalize: bool = False
    diagnosis: str | None = None


class LogitsSummary(_Evidence):
    """The figures over every position compared; empty ({}) when no position could be (non-finite logits)."""

    nmse: float | None = None
    kl_mean: float | None = None
    kl_p99: float | None = None
    kl_max: float | None = None
    positions: int = 0
    top1_agreement_raw: float | None = None
    decisive_positions: int = 0
    top1_agreement: float | None = None  # over the decisive positions; absent when none was decisive


class LogitsFigures(_Evidence):
    summary: LogitsSummary | None = None
    per_text: list[Any] = Field(default_factory=list)

    def measured(self) -> LogitsSummary | None:
        """The summary, when it holds figures."""
        return self.summary if self.summary is not None and self.summary.nmse is not None else None


class RelevanceFigures(_Evidence):
    per_pair: list[Any] = Field(default_factory=list)


class SliceFigures(_Evidence):
    """One slice's cost against the source: the logits figures of a causal LM or the cosines of embeddings."""

    kl_mean: float | None = None
    kl_percentiles: dict[str, float] = Field(default_factory=dict)
    same_top: float | None = None
    delta_p_rms: float | None = None
    ppl_ratio: float | None = None
    min_cosine: float | None = None
    texts: int | None = None


class QualityFigures(_Evidence):
    precision_class: str
    slices: dict[str, SliceFigures] = Field(default_factory=dict)


class RuntimeDetails(_Evidence):
    """Gate 2: the texts, the tokenizer, the kind's correctness comparison, and the cost against the source."""

    texts: list[Any] = Field(default_factory=list)
    tokenizer: TokenizerFigures | None = None
    embeddings: EmbeddingFigures | None = None
    logits: LogitsFigures | None = None
    relevance: RelevanceFigures | None = None
    compute_classes: list[str] = Field(default_factory=list)
    thresholds: dict[str, float] = Field(default_factory=dict)  # the correctness thresholds applied
    quality: QualityFigures | None = None
    not_covered: list[str] = Field(default_factory=list)  # input kinds the texts did not hold
    skipped_texts: list[str] = Field(default_factory=list)  # texts longer than the context


class ReleaseDetails(_Evidence):
    """Gate 3: the release package's files as re-read."""

    package: list[FileDigest] = Field(default_factory=list)


def storage_details(details: Mapping[str, Any]) -> StorageDetails:
    return StorageDetails.model_validate(details)


def runtime_details(details: Mapping[str, Any]) -> RuntimeDetails:
    return RuntimeDetails.model_validate(details)


def release_details(details: Mapping[str, Any]) -> ReleaseDetails:
    return ReleaseDetails.model_validate(details)


def gate_details(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """A stored report's gate `name`'s details ({} when the gate is absent or wrote none)."""
    return ((report.get("gates") or {}).get(name) or {}).get("details") or {}
