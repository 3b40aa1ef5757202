"""The one policy object: every threshold a verdict depends on, fixed before measuring.

A policy is frozen, versioned and hashed; the hash goes into every report so an auditor can tell
exactly which thresholds a verdict was held to. Gate 2 asks two questions with two kinds of rule:
correctness (llama.cpp against transformers on the artifact's own weights), held to the compute path's
own noise per compute class (`engine/thresholds.py`); and quality (llama.cpp against the source's
weights), held to a budget per precision class and, where the policy names one, per slice of the text
set (`engine/quality_budgets.py`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from engine.errors import UsageError
from engine.quality_budgets import DEFAULT_QUALITY_BUDGETS, QualityBudget
from engine.quant.compute import COMPUTE_CLASSES, ComputeClass
from engine.quant.precision import PRECISION_CLASSES, PrecisionClass
from engine.rerank_thresholds import DEFAULT_RERANK_THRESHOLDS, RerankThresholds
from engine.thresholds import DEFAULT_RUNTIME_THRESHOLDS, RuntimeThresholds, thresholds_for

VERSION_MAX_CHARS = 64
# Printable text on one line: no C0 or C1 control character, DEL or Unicode line break (a version is shown in
# reports, logs and CSV exports). A lone surrogate cannot match: pydantic refuses a string that is not
# valid Unicode before matching it against a pattern.
# The line separators are written as themselves: the chart's values schema carries this pattern, and Go's
# regexp (helm validates the schema with it) has no \\u escape.
PRINTABLE_LINE = "^[^\\x00-\\x1f\\x7f-\\x9f\u2028\u2029]+$"
SliceName = Annotated[str, Field(min_length=1, max_length=64, pattern=PRINTABLE_LINE)]


# fields added after policies were first stored, with the default that asks for nothing new
NEUTRAL_WHEN_ADDED: dict[str, object] = {"require_source_signature": False, "embedding_widths": None,
                                          "labelled_retrieval": True}


class Policy(BaseModel):
    """Verification thresholds. Defaults: token ids exact, every top-1 equal, gate 2 correctness per compute
    class, quality budgets per precision class. Every number is finite (a NaN compares false with every
    threshold, so it would pass anything, and it is not JSON: a stored one broke the verdict export)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    version: str = Field(
        "2026.12-1", min_length=1, max_length=VERSION_MAX_CHARS, pattern=PRINTABLE_LINE,
        description=f"at most {VERSION_MAX_CHARS} printable characters on one line; an inline policy's version is "
        "stored prefixed 'inline-', and the prefix counts towards the limit")
    # inputs
    require_source_signature: bool = Field(
        False, description="NO-GO unless the source comes with an OpenSSF Model Signing signature by a key the "
        "operator trusts that covers every source file read")
    # gate 1
    reproduce_quantized: bool = Field(
        True, description="re-quantize deterministic types and require identical bytes (else per-type bound)"
    )
    tie_ulps: int = Field(4, ge=0, le=16, description="max ulps a source value may sit from a rounding tie")
    reproduce_sample: float = Field(
        1.0, gt=0.0, le=1.0, description="share of K-quant super-blocks re-quantized, drawn from the artifact's "
        "sha256 (1 = every block; below 1, a single corrupted block is caught with this probability)",
    )
    reader_crosscheck_rows: int = Field(
        4, ge=2, le=64, description="rows per tensor dequantized by both readers"
    )
    # Quants that do not reproduce for a non-defect reason (see engine/acceptance.py). "no-go" keeps
    # them NO-GO; "gate2" lets gate 2's logits/embedding measurements vouch for them, and only when
    # gate 2 ran and passed and nothing else blocks (the per-type bounds and both readers included).
    without_imatrix: Literal["no-go", "gate2"] = Field(
        "no-go", description="imatrix quants given without their imatrix: NO-GO, or GO on a passing gate 2"
    )
    other_quantizer: Literal["no-go", "gate2"] = Field(
        "no-go", description="systematic difference from our quantizer build: NO-GO, or GO on a passing gate 2"
    )
    systematic_fraction: float = Field(
        0.5, ge=0.5, le=1.0, description="share of a tensor's blocks that must differ for it to count as systematic"
    )
    # gate 2: tokenizer and embeddings
    token_ids_exact: bool = True
    require_top1_equal: bool = True
    contradiction_high_cosine: float = Field(0.999, ge=-1, le=1,
                                             description="ids differ yet cosine >= this: contradiction")
    contradiction_low_cosine: float = Field(0.9, ge=-1, le=1, description="ids equal yet cosine < this: contradiction")
    max_context_tokens: int = Field(2048, ge=16, description="cap on the context the runtime gates use")
    max_logit_positions: int = Field(256, ge=1, description="first positions of each text compared for logits")
    long_context_tokens: int | None = Field(
        None, ge=16, description="length of gate 2's built-in long text for causal LMs (compared past every "
        "sliding window, the original context and at its end); default: the smaller of the trained context and "
        "what the pod affords (docs/gate2.md), never short of the widest window")
    labelled_retrieval: bool = Field(
        True, description="embeddings: run the built-in labelled retrieval set (~250 texts on each side; off for "
        "a model too large to embed them in the pod's time: only the texts' cosine and the built-in top-1)")
    embedding_widths: tuple[int, ...] | None = Field(
        None, max_length=16, description="embedding widths a platform serves (truncate, then normalise), each "
        "compared besides the full width; default: the model's declared Matryoshka dimensions")
    # gate 2 correctness: thresholds per compute class of the artifact's matrices (see engine/thresholds.py)
    runtime: dict[ComputeClass, RuntimeThresholds] = Field(default_factory=lambda: dict(DEFAULT_RUNTIME_THRESHOLDS))
    # gate 2 for rerankers: relevance-score thresholds per compute class (see engine/rerank_thresholds.py)
    rerank: dict[ComputeClass, RerankThresholds] = Field(default_factory=lambda: dict(DEFAULT_RERANK_THRESHOLDS))
    # gate 2 quality: the gap to the source model, budgeted per precision class and per named slice
    quality: dict[PrecisionClass, QualityBudget] = Field(default_factory=lambda: dict(DEFAULT_QUALITY_BUDGETS))
    quality_slices: dict[SliceName, QualityBudget] = Field(
        default_factory=dict, max_length=64,
        description="budgets for named slices of the text set, each applied to its slice alone")

    @field_validator("runtime", "rerank")
    @classmethod
    def _every_compute_class(cls, value: dict[ComputeClass, Any]) -> dict[ComputeClass, Any]:
        missing = [name for name in COMPUTE_CLASSES if name not in value]
        if missing:
            raise ValueError(f"thresholds missing for compute classes {missing}")
        return {name: value[name] for name in COMPUTE_CLASSES}

    @field_validator("quality")
    @classmethod
    def _every_precision_class(cls, value: dict[PrecisionClass, Any]) -> dict[PrecisionClass, Any]:
        missing = [name for name in PRECISION_CLASSES if name not in value]
        if missing:
            raise ValueError(f"quality budgets missing for precision classes {missing}")
        return {name: value[name] for name in PRECISION_CLASSES}

    def thresholds(self, classes: Sequence[ComputeClass]) -> RuntimeThresholds:
        """What a file whose matrices run in `classes` is held to: the loosest of their thresholds."""
        return thresholds_for(self.runtime, classes)

    def rerank_thresholds(self, classes: Sequence[ComputeClass]) -> RerankThresholds:
        return RerankThresholds(max_score_abs_diff=max(self.rerank[name].max_score_abs_diff for name in classes))

    @model_serializer(mode="wrap")
    def _without_neutral_additions(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A field added with a default that asks for nothing new is left out while it has that default,
        so every policy that does not use it serialises, and hashes, as it did: a stored verdict is still
        found for an identical submission, and an auditor's pinned hash still matches the stored values."""
        values = handler(self)
        for name, neutral in NEUTRAL_WHEN_ADDED.items():
            if values.get(name) == neutral:
                del values[name]
        return values

    def sha256(self) -> str:
        canonical = json.dumps(json.loads(self.model_dump_json()), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def load_policy(path: Path | None) -> Policy:
    """The default policy, or one read from a JSON file (unknown keys are refused)."""
    if path is None:
        return Policy()
    try:
        return Policy.model_validate_json(path.read_bytes())  # pydantic decodes (and checks) the UTF-8
    except OSError as exc:
        raise UsageError(f"cannot read policy {path}: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise UsageError(f"invalid policy {path}: {exc}") from exc
