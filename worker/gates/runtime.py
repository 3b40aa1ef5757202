"""Gate 2 — runtime: does llama.cpp give an outside user what the Hugging Face model gives?

Tokenizer parity first (every text, every flag combination), then embeddings (encoder or decoder
embedding models, by the source's sentence-transformers pooling) or logits (causal LMs).
The measurements gate 3 re-checks on the released file are returned alongside. A gate that
measured nothing (every text longer than the context, no logits position compared) is `not_run`
with a `gate.not_run` blocker: 0 == 0 agreements and a NaN cosine are not a pass.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from worker.blockers import Blocker
from worker.errors import CodedError, ReferenceMissingError, SourceError
from worker.formats.gguf_structure import GGUFLayout
from worker.formats.source import SourceModel
from worker.gates.embedding_parity import check_embeddings
from worker.gates.layer_divergence import locate_divergence
from worker.gates.logits_parity import check_logits
from worker.gates.relevance_parity import measure_relevance
from worker.gates.runtime_evidence import (
    EmbeddingEvidence,
    LogitsEvidence,
    Recorded,
    RuntimeEvidence,
    TokenizerEvidence,
)
from worker.gates.tokenizer_parity import check_tokenizer
from worker.policy import Policy
from worker.progress import Progress, no_progress
from worker.quant.precision import PrecisionClass, precision_class, type_mix
from worker.report import GateResult
from worker.runtime.hf_reference import HFModel, HFTokenizer
from worker.runtime.llama_candidate import CandidateLoadError, LlamaCandidate
from worker.runtime.sentence_config import SentenceConfig, sentence_config
from worker.texts import DEFAULT_TEXTS, Text, near_context_texts, uncovered_inputs
from worker.thresholds import RuntimeThresholds

ModelKind = Literal["embedding", "causal-lm", "reranker"]


@dataclass(frozen=True, slots=True)
class RuntimeMeasurements:
    """What gate 2 measured on the candidate, for gate 3 to re-measure on the released file."""

    kind: ModelKind
    n_ctx: int
    retrieval_top1: tuple[int, ...] = ()
    logits_text: str | None = None
    logits_top1: tuple[int, ...] = ()
    rerank_orders: tuple[tuple[int, ...], ...] = ()
    rerank_scores: tuple[tuple[float, ...], ...] = ()
    evidence: RuntimeEvidence | None = None  # what the negative controls replay


def is_reranker(config: Mapping[str, Any]) -> bool:
    """A sequence classifier with one output: a cross-encoder scoring (query, document) pairs."""
    architectures = config.get("architectures") or []
    labels = config.get("id2label")
    n_labels = len(labels) if isinstance(labels, dict) else config.get("num_labels")
    return any(str(a).endswith("ForSequenceClassification") for a in architectures) and n_labels == 1


def model_kind(source: SourceModel, sentence: SentenceConfig, requested: str = "auto") -> ModelKind | None:
    if requested in ("embedding", "causal-lm", "reranker"):
        return requested  # type: ignore[return-value]
    if sentence.is_embedding_model:
        return "embedding"
    if is_reranker(source.config):
        return "reranker"
    architectures = source.config.get("architectures") or []
    return "causal-lm" if any(str(a).endswith("ForCausalLM") for a in architectures) else None


def context_size(layout: GGUFLayout, policy: Policy) -> int:
    """The context the runtime gates use: the GGUF's, capped by the policy (512 when absent)."""
    arch = layout.metadata.get("general.architecture")
    value = layout.metadata.get(f"{arch}.context_length", 512)
    if type(value) is not int or value <= 0:
        raise CodedError("metadata.wrong_type", f"{arch}.context_length is {str(value)[:40]!r}, not a positive integer")
    return min(value, policy.max_context_tokens)


def text_set(user_texts: tuple[str, ...] | None, hf: HFTokenizer, candidate: LlamaCandidate,
             n_ctx: int) -> tuple[tuple[Text, ...], list[str]]:
    """The texts to measure (user's or default + one near the context limit) and those skipped
    because either tokenizer makes them longer than the context."""
    def count(text: str) -> int:
        return max(len(hf.encode(text, add_special=True, parse_special=False)),
                   len(candidate.tokenize(text, add_special=True, parse_special=False)))

    if user_texts is not None:
        candidates = tuple(Text(f"line-{i + 1}", text) for i, text in enumerate(user_texts))
    else:
        candidates = DEFAULT_TEXTS + near_context_texts(n_ctx, count)
    kept = tuple(t for t in candidates if count(t.text) <= n_ctx - 4)
    skipped = [t.label for t in candidates if t not in kept]
    return kept, skipped


def _measure_embeddings(
    texts: tuple[Text, ...], hf: HFTokenizer, model: HFModel, candidate: LlamaCandidate, sentence: SentenceConfig,
    ids_equal: dict[str, bool], policy: Policy, thresholds: RuntimeThresholds, n_ctx: int,
) -> tuple[list[Blocker], dict[str, Any], RuntimeMeasurements]:
    pooling = sentence.pooling or "mean"

    def embed_reference(text: str):
        return model.embed(hf.encode(text, add_special=True, parse_special=False), pooling)

    reference, embed = Recorded(embed_reference), Recorded(candidate.embed)
    result = check_embeddings(texts, reference, embed, sentence, ids_equal, policy, thresholds)
    details = {"min_cosine": result.min_cosine, "per_text": result.per_text, "retrieval": result.retrieval,
               "diagnosis": result.diagnosis, "pooling": pooling, "normalize": sentence.normalize}
    evidence = EmbeddingEvidence(reference=reference, candidate=embed, sentence=sentence, ids_equal=dict(ids_equal),
                                 policy=policy, thresholds=thresholds, per_text=tuple(result.per_text),
                                 blockers=tuple(result.blockers))
    measured = RuntimeMeasurements("embedding", n_ctx, retrieval_top1=tuple(result.retrieval["candidate_top1"]),
                                   evidence=RuntimeEvidence(texts=texts, embeddings=evidence))
    return result.blockers, details, measured


def _measure_logits(
    texts: tuple[Text, ...], model: HFModel, candidate: LlamaCandidate, policy: Policy,
    thresholds: RuntimeThresholds, n_ctx: int,
) -> tuple[list[Blocker], dict[str, Any], RuntimeMeasurements]:
    def llama_ids(text: str) -> list[int]:
        return candidate.tokenize(text, add_special=True, parse_special=False)

    tokenize, reference = Recorded(llama_ids), Recorded(model.logits, keep=1)
    logits = Recorded(candidate.logits, keep=1)
    result = check_logits(texts, tokenize, reference, logits, policy, thresholds)
    first = result.per_text[0] if result.per_text else None
    evidence = LogitsEvidence(tokenize=tokenize, reference=reference, candidate=logits, policy=policy,
                              thresholds=thresholds)
    measured = RuntimeMeasurements(
        "causal-lm", n_ctx, logits_text=next((t.text for t in texts if first and t.label == first["label"]), None),
        logits_top1=tuple(first["candidate_top1"]) if first else (),
        evidence=RuntimeEvidence(texts=texts, logits=evidence),
    )
    return result.blockers, {"summary": result.summary, "per_text": result.per_text}, measured


def _fail(started: float, blocker: Blocker, **details: Any) -> tuple[GateResult, list[Blocker], None]:
    result = GateResult(name="runtime", status="failed", seconds=time.perf_counter() - started, details=details)
    return result, [blocker], None


def _not_run(started: float, why: str, details: dict[str, Any],
             blockers: list[Blocker]) -> tuple[GateResult, list[Blocker], None]:
    """Nothing was measured: never a pass, whatever else was (not) found."""
    result = GateResult(name="runtime", status="not_run", seconds=time.perf_counter() - started,
                        details={**details, "why": why})
    return result, [*blockers, Blocker(code="gate.not_run", gate="runtime", why=why)], None


def nothing_measured(details: dict[str, Any]) -> str | None:
    """Why the embeddings or logits comparison measured nothing, or None when it measured something."""
    if "embeddings" in details and not details["embeddings"]["per_text"]:
        return "no text's embedding could be compared with the reference"
    if "relevance" in details and not details["relevance"]["per_pair"]:
        return "no (query, document) pair could be scored"
    if "logits" in details and not details["logits"]["per_text"]:
        return "no logits position could be compared with the reference"
    return None


@dataclass(frozen=True)
class _Compared:
    """The two sides gate 2 compares and what it compares them on."""

    texts: tuple[Text, ...]
    hf: HFTokenizer
    model: HFModel
    candidate: LlamaCandidate
    n_ctx: int


def _measure_kind(kind: ModelKind, sides: _Compared, sentence: SentenceConfig, default_ids_equal: dict[str, bool],
                  policy: Policy, precision: PrecisionClass,
                  details: dict[str, Any]) -> tuple[list[Blocker], RuntimeMeasurements]:
    """Gate 2's comparison for the model's kind: relevance scores, embeddings or logits (into `details`)."""
    thresholds = policy.thresholds(precision)
    if kind == "reranker":
        found, details["relevance"], (orders, scores) = measure_relevance(sides.hf, sides.model, sides.candidate,
                                                                          policy.rerank[precision])
        return found, RuntimeMeasurements("reranker", sides.n_ctx, rerank_orders=orders, rerank_scores=scores)
    if kind == "embedding":
        found, details["embeddings"], measured = _measure_embeddings(
            sides.texts, sides.hf, sides.model, sides.candidate, sentence, default_ids_equal, policy, thresholds,
            sides.n_ctx)
        return found, measured
    found, details["logits"], measured = _measure_logits(sides.texts, sides.model, sides.candidate, policy,
                                                         thresholds, sides.n_ctx)
    return found, measured


def run_runtime_gate(
    artifact: Path,
    layout: GGUFLayout,
    source: SourceModel,
    policy: Policy,
    user_texts: tuple[str, ...] | None = None,
    requested_kind: str = "auto",
    progress: Progress = no_progress,
) -> tuple[GateResult, list[Blocker], RuntimeMeasurements | None]:
    started = time.perf_counter()
    sentence = sentence_config(source)
    kind = model_kind(source, sentence, requested_kind)
    if kind is None:
        return _fail(started, Blocker(code="runtime.unknown_model_kind", gate="runtime",
                                      why="no sentence-transformers pooling and no *ForCausalLM architecture"))
    try:
        n_ctx = context_size(layout, policy)
    except CodedError as exc:
        return _fail(started, Blocker(code=exc.code, gate="runtime", why=exc.why,
                                      key=f"{layout.metadata.get('general.architecture')}.context_length"))
    try:
        hf = HFTokenizer(source.root / "tokenizer.json")
        progress("runtime", 0, 3)
        candidate = LlamaCandidate(artifact, embedding=kind == "embedding", n_ctx=n_ctx, rank=kind == "reranker")
    except ReferenceMissingError as exc:
        return _fail(started, Blocker(code="verifier.reference_missing", gate="verifier", why=str(exc)))
    except CandidateLoadError as exc:
        return _fail(started, Blocker(code="runtime.load_failed", gate="runtime", why=str(exc)))
    except SourceError as exc:
        return _fail(started, Blocker(code=exc.code, gate="runtime", why=exc.why))
    try:
        texts, skipped = text_set(user_texts, hf, candidate, n_ctx)
        if not texts:
            why = f"every text is longer than the context ({n_ctx} tokens): nothing was measured"
            return _not_run(started, why, {"kind": kind, "n_ctx": n_ctx, "texts": [], "skipped_texts": skipped}, [])
        hf_ids, llama_ids = Recorded(hf.encode), Recorded(candidate.tokenize)
        tokens = check_tokenizer(texts, hf_ids, llama_ids, hf.raw, dict(layout.metadata), policy.token_ids_exact)
        progress("runtime", 1, 3)
        blockers = list(tokens.blockers)
        precision = precision_class(layout)
        thresholds = policy.thresholds(precision)
        details: dict[str, Any] = {
            "kind": kind, "n_ctx": n_ctx, "precision_class": precision, "type_mix": type_mix(layout),
            "thresholds": thresholds.model_dump(), "texts": [t.label for t in texts], "skipped_texts": skipped,
            "not_covered": uncovered_inputs(texts), "tokenizer": tokens.details(),
        }
        model = HFModel(source.root, causal=kind == "causal-lm", classifier=kind == "reranker")
        found, measured = _measure_kind(kind, _Compared(texts, hf, model, candidate, n_ctx), sentence,
                                        tokens.default_ids_equal, policy, precision, details)
        blockers.extend(locate_divergence(found, details, texts=texts, model=model, candidate=candidate,
                                          architecture=str(layout.metadata.get("general.architecture")),
                                          precision=precision))
        progress("runtime", 3, 3)
        tokenizer = TokenizerEvidence(hf=hf_ids, llama=llama_ids, tokenizer_json=hf.raw,
                                      metadata=dict(layout.metadata), ids_exact=policy.token_ids_exact,
                                      default_ids_equal=dict(tokens.default_ids_equal),
                                      blockers=tuple(tokens.blockers))
        measured = replace(measured, evidence=replace(measured.evidence or RuntimeEvidence(texts=texts),
                                                      tokenizer=tokenizer))
        if empty := nothing_measured(details):
            return _not_run(started, empty, details, blockers)
    except ReferenceMissingError as exc:
        return _fail(started, Blocker(code="verifier.reference_missing", gate="verifier", why=str(exc)))
    except SourceError as exc:
        return _fail(started, Blocker(code=exc.code, gate="input", why=exc.why))
    finally:
        candidate.close()
    status = "failed" if blockers else "passed"
    result = GateResult(name="runtime", status=status, seconds=time.perf_counter() - started, details=details)
    return result, blockers, measured
