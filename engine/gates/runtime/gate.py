"""Gate 2 — runtime: does llama.cpp run this file as transformers runs these weights, and what does the
file cost against its source?

Two questions, two references. Correctness: llama.cpp against transformers running the artifact's own
weights (dequantized, the converter's transforms undone), so only llama.cpp's compute path may differ and
is held to its own measured noise per compute class; a GO means llama.cpp runs this file as transformers
runs these weights, not that a quant is as close to its source as some other model's quants were.
Quality: llama.cpp against transformers on the source's weights, the quantization cost (KL, Δp, same top
token, perplexity ratio; cosine and retrieval for embeddings) per slice of the text set, budgeted by the
policy (`quality.*`).

Tokenizer parity comes first (every text, the pre-tokenizer probe included, every flag combination),
then the chat template as a runtime applies it (causal LMs with a template), then embeddings (by the
source's sentence-transformers pooling), relevance scores (rerankers) or logits (causal LMs). llama.cpp
runs in a child process: a crash is `runtime.crashed`, a NO-GO, never a lost verdict. A file whose
metadata contradicts its tensors is not loaded at all. A gate that measured nothing is `not_run` with a
`gate.not_run` blocker: 0 == 0 agreements and a NaN cosine are not a pass.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from engine.blockers import Blocker
from engine.controls.planted import not_applicable
from engine.errors import CodedError, ReferenceMissingError, SourceError
from engine.evidence import runtime_details
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel
from engine.gates.contract import ControlInputs, GateContext, GateName, GateOutcome, Plant
from engine.gates.runtime.chat_template import check_chat_template
from engine.gates.runtime.compute_noise import rounding_of
from engine.gates.runtime.controls import embedding_control, logits_control, tokenizer_control
from engine.gates.runtime.evidence import Recorded, RuntimeEvidence, TokenizerEvidence
from engine.gates.runtime.labelled_measure import declared_widths
from engine.gates.runtime.labelled_retrieval import LabelledSet
from engine.gates.runtime.layer_divergence import locate_divergence
from engine.gates.runtime.loadable import refusal, vocabulary_size
from engine.gates.runtime.measures import (
    ModelKind,
    RuntimeMeasurements,
    Sides,
    measure_embeddings,
    measure_logits,
    measure_reranker,
)
from engine.gates.runtime.positions import long_context_tokens, marks, position_gaps
from engine.gates.runtime.references import references
from engine.gates.runtime.tokenizer_parity import TokenizerResult, check_tokenizer
from engine.gates.storage.parts import StoragePart
from engine.policy import Policy
from engine.progress import Progress, no_progress
from engine.quant.compute import compute_classes
from engine.quant.precision import precision_class, type_mix
from engine.report import GateResult, TensorRow
from engine.runtime.hf_reference import REFERENCE_LIBRARIES, HFTokenizer
from engine.runtime.llama_candidate import CandidateLoadError, decode_batch
from engine.runtime.llama_process import LlamaCrashedError, LlamaProcess
from engine.runtime.sentence_config import SentenceConfig, sentence_config
from engine.texts import (
    DEFAULT_TEXTS,
    PROBE_CLASSES,
    PROBE_TEXTS,
    Text,
    long_context_texts,
    near_context_texts,
    submitted_texts,
    uncovered_inputs,
)

__all__ = ["RUNTIME", "ModelKind", "RuntimeMeasurements", "context_size", "model_kind", "run_runtime_gate"]


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


def declared_context(layout: GGUFLayout) -> int:
    """The context the GGUF declares (512 when absent)."""
    arch = layout.metadata.get("general.architecture")
    value = layout.metadata.get(f"{arch}.context_length", 512)
    if type(value) is not int or value <= 0:
        raise CodedError("metadata.wrong_type", f"{arch}.context_length is {str(value)[:40]!r}, not a positive integer")
    return value


def context_size(layout: GGUFLayout, policy: Policy) -> int:
    """The context the runtime gates use for their short texts: the GGUF's, capped by the policy."""
    return min(declared_context(layout), policy.max_context_tokens)


def long_tokens(kind: ModelKind, layout: GGUFLayout, source: SourceModel, policy: Policy) -> int | None:
    """How long a causal LM's built-in long text is (positions.py); None for other kinds, and when the
    length afforded would not reach past the first positions every text is compared at (the text near the
    context limit is read instead, as for other kinds)."""
    if kind != "causal-lm":
        return None
    declared = declared_context(layout)
    tokens = long_context_tokens(source.config, declared, policy.long_context_tokens,
                                 decode_batch(vocabulary_size(layout), declared))
    return tokens if tokens > policy.max_logit_positions else None


def text_set(submitted: tuple[Text, ...], hf: HFTokenizer, candidate: LlamaProcess,
             n_ctx: int, long: int | None = None) -> tuple[tuple[Text, ...], list[str]]:
    """The texts to measure: the submitter's (or the default set, with one near the context limit unless a
    long text is measured), a causal LM's long text of `long` tokens, then the pre-tokenizer probe, always;
    and the labels of those skipped because either tokenizer makes them longer than the context."""
    def count(text: str) -> int:
        return max(len(hf.encode(text, add_special=True, parse_special=False)),
                   len(candidate.tokenize(text, add_special=True, parse_special=False)))

    near = () if long else near_context_texts(n_ctx, count)
    candidates = (submitted or DEFAULT_TEXTS + near) + (long_context_texts(long, count) if long else ()) + PROBE_TEXTS
    kept = tuple(t for t in candidates if count(t.text) <= n_ctx - 4)
    skipped = [t.label for t in candidates if t not in kept]
    return kept, skipped


def crashed_blocker(exc: LlamaCrashedError, gate: Literal["runtime", "release"]) -> Blocker:
    """A llama.cpp child that died is a NO-GO naming how: the same file would take a user's runtime down."""
    return Blocker(code="runtime.crashed", gate=gate, why=str(exc))


def _fail(started: float, *blockers: Blocker) -> tuple[GateResult, list[Blocker], None]:
    result = GateResult(name="runtime", status="failed", seconds=time.perf_counter() - started, details={})
    return result, list(blockers), None


def _not_run(started: float, why: str, details: dict[str, Any],
             blockers: list[Blocker]) -> tuple[GateResult, list[Blocker], None]:
    """Nothing was measured: never a pass, whatever else was (not) found."""
    result = GateResult(name="runtime", status="not_run", seconds=time.perf_counter() - started,
                        details={**details, "why": why})
    return result, [*blockers, Blocker(code="gate.not_run", gate="runtime", why=why)], None


def nothing_measured(details: dict[str, Any]) -> str | None:
    """Why the embeddings or logits comparison measured nothing, or None when it measured something."""
    figures = runtime_details(details)
    if figures.embeddings is not None and not figures.embeddings.per_text:
        return "no text's embedding could be compared with the reference"
    if figures.relevance is not None and not figures.relevance.per_pair:
        return "no (query, document) pair could be scored"
    if figures.logits is not None and not figures.logits.per_text:
        return "no logits position could be compared with the reference"
    return None


def _measure(kind: ModelKind, sides: Sides, sentence: SentenceConfig, tokens_equal: dict[str, bool],
             policy: Policy, classes: Sequence[Any], details: dict[str, Any]) -> tuple[list[Blocker],
                                                                                     RuntimeMeasurements]:
    """The kind's correctness comparison (into `details`), its quality measured alongside into `sides.gap`."""
    if kind == "reranker":
        found, details["relevance"], measured = measure_reranker(sides, policy.rerank_thresholds(classes))
    elif kind == "embedding":
        found, details["embeddings"], measured = measure_embeddings(sides, sentence, tokens_equal, policy,
                                                                    policy.thresholds(classes))
    else:
        found, details["logits"], measured = measure_logits(sides, policy, policy.thresholds(classes),
                                                             rounding_of(classes))
        details["not_covered"].extend(position_gaps(details["logits"]["positions"]))
    return found, measured


def _quality(sides: Sides, layout: GGUFLayout, policy: Policy, details: dict[str, Any],
             traced: bool) -> list[Blocker]:
    """The gap to the source per slice, and the policy's budget for the file's precision class on it; a float
    file over budget is traced against the source unless a correctness failure was already traced."""
    precision = precision_class(layout)
    summary = sides.gap.summary()
    budget = policy.quality[precision]
    details["quality"] = {"against": "transformers on the source's own weights", "precision_class": precision,
                          "budget": budget.model_dump(exclude_none=True), "slices": summary,
                          "slice_budgets": {k: v.model_dump(exclude_none=True)
                                            for k, v in policy.quality_slices.items()},
                          "retrieval_top1_equal_to_source": sides.gap.retrieval_top1_equal}
    over_budget = sides.gap.judge(summary, budget, policy.quality_slices)
    if over_budget and not traced and precision == "float":
        return _locate_source_gap(over_budget, details, sides, layout)
    return over_budget


def _locate_source_gap(over_budget: list[Blocker], details: dict[str, Any], sides: Sides,
                       layout: GGUFLayout) -> list[Blocker]:
    """A float file's weights are the source's up to rounding, so its gap to the source is not a
    quantization cost but a defect (gate 1 names the tensor when it ran): trace where it starts."""
    return locate_divergence(over_budget, details, texts=sides.texts, model=sides.source, candidate=sides.candidate,
                             architecture=str(layout.metadata.get("general.architecture")),
                             classes=compute_classes(layout), against="the source's weights")


def _described(kind: ModelKind, n_ctx: int, texts: tuple[Text, ...], skipped: list[str], layout: GGUFLayout,
               policy: Policy, tokens: TokenizerResult) -> dict[str, Any]:
    """What gate 2 measures and holds it to, for the report."""
    classes = compute_classes(layout)
    not_covered = uncovered_inputs(texts)
    if tokens.probe_divergences:
        not_covered.append(f"built-in texts {', '.join(tokens.probe_divergences)}: llama.cpp's "
                           f"{tokens.gguf_flags['model']} tokenizer splits them unlike the HF normaliser, which no "
                           "GGUF key governs (not a defect of this file); their outputs are not compared")
    return {"kind": kind, "n_ctx": n_ctx, "compute_classes": list(classes), "type_mix": type_mix(layout),
            "thresholds": policy.thresholds(classes).model_dump(), "texts": [t.label for t in texts],
            "slices": sorted({t.slice for t in texts}), "skipped_texts": skipped,
            "probe_classes": [name for name in PROBE_CLASSES if f"probe-{name}" in {t.label for t in texts}],
            "not_covered": not_covered, "tokenizer": tokens.details()}


def _sides(artifact: Path, layout: GGUFLayout, source: SourceModel, kind: ModelKind,
           storage_rows: Mapping[str, TensorRow] | None, details: dict[str, Any],
           measuring: tuple[tuple[Text, ...], HFTokenizer, LlamaProcess, int]) -> Sides:
    """llama.cpp and the references it is compared with (one pass when gate 1 proved the weights equal), and
    the report's account of them."""
    chosen = references(artifact, layout, source, kind, storage_rows)
    details["reference"] = {"correctness": "transformers on the artifact's own weights (dequantized, the "
                            "converter's transforms undone)", "notes": chosen.notes, "passes": chosen.passes,
                            "passes_why": chosen.one_pass_why}
    texts, hf, candidate, n_ctx = measuring
    return Sides(texts, hf, chosen.correct, chosen.source, candidate, n_ctx, marks=marks(source.config),
                 declared_widths=declared_widths(source) if kind == "embedding" else ())


def error_blocker(exc: ReferenceMissingError | CandidateLoadError | LlamaCrashedError | CodedError) -> Blocker:
    """The one mapping of what stops gate 2 to its blocker: a missing reference is the verifier's, a defect
    of the source an input's (as gate 1 and the engine file it), everything else the runtime's."""
    if isinstance(exc, ReferenceMissingError):
        return Blocker(code="verifier.reference_missing", gate="verifier", why=str(exc))
    if isinstance(exc, CandidateLoadError):
        return Blocker(code="runtime.load_failed", gate="runtime", why=str(exc))
    if isinstance(exc, LlamaCrashedError):
        return crashed_blocker(exc, "runtime")
    return Blocker(code=exc.code, gate="input" if isinstance(exc, SourceError) else "runtime", why=exc.why)


def run_runtime_gate(
    artifact: Path,
    layout: GGUFLayout,
    source: SourceModel,
    policy: Policy,
    submitted: tuple[Text, ...] = (),
    requested_kind: str = "auto",
    progress: Progress = no_progress,
    storage_rows: Mapping[str, TensorRow] | None = None,
    labelled: LabelledSet | None = None,
) -> tuple[GateResult, list[Blocker], RuntimeMeasurements | None]:
    """`storage_rows`: gate 1's row of every tensor when it checked them all in this process (one reference
    pass then serves correctness and quality if they prove the weights equal to the source's). `labelled`: the
    submitter's labelled retrieval set, measured instead of the built-in one."""
    started = time.perf_counter()
    sentence = sentence_config(source)
    kind = model_kind(source, sentence, requested_kind)
    if kind is None:
        return _fail(started, Blocker(code="runtime.unknown_model_kind", gate="runtime",
                                      why="no sentence-transformers pooling and no *ForCausalLM architecture"))
    if refused := refusal(layout, "runtime"):
        return _fail(started, *refused)
    try:
        long = long_tokens(kind, layout, source, policy)
        n_ctx = max(context_size(layout, policy), long or 0)
    except CodedError as exc:
        return _fail(started, Blocker(code=exc.code, gate="runtime", why=exc.why,
                                      key=f"{layout.metadata.get('general.architecture')}.context_length"))
    try:
        hf = HFTokenizer(source.root / "tokenizer.json")
        progress("runtime", 0, 3)
        candidate = LlamaProcess(artifact, embedding=kind == "embedding", n_ctx=n_ctx, rank=kind == "reranker",
                                 vocabulary=vocabulary_size(layout))
    except (ReferenceMissingError, CandidateLoadError, LlamaCrashedError, CodedError) as exc:
        return _fail(started, error_blocker(exc))
    try:
        texts, skipped = text_set(submitted, hf, candidate, n_ctx, long)
        if not any(not t.is_probe for t in texts):  # the probe alone is no measurement of the model's texts
            why = f"every text is longer than the context ({n_ctx} tokens): nothing was measured"
            return _not_run(started, why, {"kind": kind, "n_ctx": n_ctx, "texts": [t.label for t in texts],
                                           "skipped_texts": skipped}, [])
        hf_ids, llama_ids = Recorded(hf.encode), Recorded(candidate.tokenize)
        tokens = check_tokenizer(texts, hf_ids, llama_ids, hf.raw, dict(layout.metadata), policy.token_ids_exact)
        details: dict[str, Any] = {}
        blockers = list(tokens.blockers) + (check_chat_template(source, layout, candidate, details)
                                            if kind == "causal-lm" else [])
        progress("runtime", 1, 3)
        classes = compute_classes(layout)
        details.update(_described(kind, n_ctx, texts, skipped, layout, policy, tokens))
        measured_texts = tuple(t for t in texts if t.label not in set(tokens.probe_divergences))
        sides = replace(_sides(artifact, layout, source, kind, storage_rows, details,
                               (measured_texts, hf, candidate, n_ctx)), labelled=labelled)
        found, measured = _measure(kind, sides, sentence, tokens.default_ids_equal, policy, classes, details)
        blockers.extend(locate_divergence(found, details, texts=texts, model=sides.correct, candidate=candidate,
                                          architecture=str(layout.metadata.get("general.architecture")),
                                          classes=classes))
        blockers.extend(_quality(sides, layout, policy, details, traced=bool(found)))
        progress("runtime", 3, 3)
        tokenizer = TokenizerEvidence(hf=hf_ids, llama=llama_ids, tokenizer_json=hf.raw,
                                      metadata=dict(layout.metadata), ids_exact=policy.token_ids_exact,
                                      default_ids_equal=dict(tokens.default_ids_equal),
                                      blockers=tuple(tokens.blockers))
        measured = replace(measured, evidence=replace(measured.evidence or RuntimeEvidence(texts=texts),
                                                      tokenizer=tokenizer))
        if empty := nothing_measured(details):
            return _not_run(started, empty, details, blockers)
    except (ReferenceMissingError, CandidateLoadError, LlamaCrashedError, CodedError) as exc:
        return _fail(started, error_blocker(exc))
    finally:
        candidate.close()
    status = "failed" if blockers else "passed"
    result = GateResult(name="runtime", status=status, seconds=time.perf_counter() - started, details=details)
    return result, blockers, measured


def every_row(part: StoragePart | None) -> dict[str, TensorRow] | None:
    """Gate 1's row of every tensor by GGUF name, when this process checked them all (one part of one)."""
    if part is None or part.shards != 1:
        return None
    rows = {pair.row.gguf_name: pair.row for pair in part.checked if pair.row is not None}
    return rows if len(part.checked) == len(part.pair_names) else None


class RuntimeGate:
    """Gate 2. It runs in the first pod only, after gate 1, whose proof of equal weights spares a reference."""

    number = 2
    name: GateName = "runtime"
    every_shard = False
    libraries: tuple[str, ...] = REFERENCE_LIBRARIES

    def run(self, context: GateContext) -> GateOutcome:
        request = context.request
        submitted = submitted_texts(request.texts, request.text_sets)
        result, blockers, context.measured = run_runtime_gate(
            context.artifact, context.layout, context.source, context.policy, submitted, request.kind,
            context.progress, storage_rows=every_row(context.part), labelled=request.labelled_set)
        figures = runtime_details(result.details)
        notes = [f"input kind: {gap}" for gap in figures.not_covered]
        if skipped := figures.skipped_texts:
            notes.append(f"texts longer than the context, not measured: {', '.join(skipped)}")
        return GateOutcome(result=result, blockers=blockers, not_verified=notes)

    def plants(self, inputs: ControlInputs) -> list[Plant]:
        """One plant per comparison gate 2 ran, each timed (and failing) on its own."""
        evidence = inputs.runtime.evidence if inputs.runtime else None
        if evidence is None:
            return [lambda: [not_applicable("runtime", "gate 2 measured nothing to plant a defect in")]]
        texts, plants = evidence.texts, []
        if (tokenizer := evidence.tokenizer) is not None:
            plants.append(lambda: [tokenizer_control(texts, tokenizer)])
        if (embeddings := evidence.embeddings) is not None:
            plants.append(lambda: [embedding_control(texts, embeddings)])
        if (logits := evidence.logits) is not None:
            plants.append(lambda: [logits_control(texts, logits)])
        return plants


RUNTIME = RuntimeGate()
