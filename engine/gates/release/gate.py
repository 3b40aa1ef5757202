"""Gate 3 — the released file: re-open the exact bytes by digest and re-measure them.

The file must still have the sha256 measured before gates 1 and 2; then llama.cpp loads it afresh
and its outputs are checked for dimension, finiteness, non-zero norm and the same top-1 results
gate 2 recorded (a reranker: gate 2's pairs re-scored, the same scores and document order). Every
file of the release package is digested so a recipient can check them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.blockers import Blocker
from engine.digests import digest_file
from engine.errors import ReferenceMissingError
from engine.formats.artifact_files import artifact_paths
from engine.formats.gguf_structure import GGUFLayout
from engine.gates.contract import ControlInputs, GateContext, GateName, GateOutcome, Plant
from engine.gates.release import digest
from engine.gates.release.controls import release_control
from engine.gates.runtime.embedding_parity import retrieval_top1, top1
from engine.gates.runtime.gate import RuntimeMeasurements, model_kind
from engine.gates.runtime.loadable import refusal, vocabulary_size
from engine.gates.runtime.relevance_parity import RERANK_SET, candidate_scores, changed_orders, document_order
from engine.report import FileDigest, GateResult
from engine.rerank_thresholds import RELEASE_SCORE_TOLERANCE
from engine.runtime.llama_candidate import CandidateLoadError
from engine.runtime.llama_process import LlamaCrashedError, LlamaProcess
from engine.runtime.sentence_config import SentenceConfig, sentence_config
from engine.texts import RETRIEVAL


def _remeasure_embedding(candidate: LlamaProcess, layout: GGUFLayout, sentence: SentenceConfig,
                         measured: RuntimeMeasurements | None, details: dict) -> list[Blocker]:
    blockers: list[Blocker] = []
    arch = layout.metadata.get("general.architecture")
    expected_dim = layout.metadata.get(f"{arch}.embedding_length")
    vectors: list[np.ndarray] = []

    def embed(text: str) -> np.ndarray:
        vector = candidate.embed(text)
        vectors.append(vector)
        return vector

    top1 = retrieval_top1(embed, sentence.prompts)
    dims = {len(v) for v in vectors}
    details.update(dimension=sorted(dims), expected_dimension=expected_dim, top1=top1,
                   min_norm=float(min(np.linalg.norm(v) for v in vectors)))
    if dims != {expected_dim}:
        blockers.append(Blocker(code="release.dimension_mismatch", gate="release",
                                why=f"embedding dimension {sorted(dims)}, metadata says {expected_dim}"))
    if not all(np.all(np.isfinite(v)) for v in vectors):
        blockers.append(Blocker(code="release.not_finite", gate="release", why="non-finite embedding values"))
    elif details["min_norm"] == 0:
        blockers.append(Blocker(code="release.zero_norm", gate="release", why="an embedding has zero norm"))
    if measured is not None and tuple(top1) != measured.retrieval_top1:
        blockers.append(Blocker(code="release.top1_changed", gate="release",
                                why=f"retrieval top-1 {top1}, gate 2 measured {list(measured.retrieval_top1)}"))
    if measured is not None:  # `retrieval_top1` embedded the queries, then the documents: `vectors` in order
        blockers.extend(_remeasure_widths(vectors, measured, details))
    return blockers


def _remeasure_widths(vectors: list[np.ndarray], measured: RuntimeMeasurements, details: dict) -> list[Blocker]:
    """The released file at every width gate 2 served (truncate, then normalise): the same top-1."""
    queries, documents = vectors[:len(RETRIEVAL.queries)], vectors[len(RETRIEVAL.queries):]
    found, at = [], {}
    for width, expected in measured.width_top1:
        now = top1([q[:width] for q in queries], [d[:width] for d in documents])[0]
        at[str(width)] = now
        if tuple(now) != expected:
            found.append(Blocker(code="release.top1_changed", gate="release",
                                 why=f"at {width} dimensions: retrieval top-1 {now}, gate 2 measured {list(expected)}"))
    if at:
        details["top1_at"] = at
    return found


def _remeasure_logits(candidate: LlamaProcess, measured: RuntimeMeasurements, details: dict) -> list[Blocker]:
    text = measured.logits_text or "The quick brown fox jumps over the lazy dog."
    ids = candidate.tokenize(text, add_special=True, parse_special=False)[: len(measured.logits_top1) or None]
    if not ids:
        details.update(positions=0, top1_equal_to_gate2=not measured.logits_top1)
        return [Blocker(code="gate.not_run", gate="release", why="the text tokenized to nothing: no logits measured")]
    found, finite = candidate.top1(ids)
    top1 = found.tolist()
    details.update(positions=len(ids), top1_equal_to_gate2=tuple(top1) == measured.logits_top1)
    if not finite:
        return [Blocker(code="release.not_finite", gate="release", why="non-finite logits")]
    if measured.logits_top1 and tuple(top1) != measured.logits_top1:
        return [Blocker(code="release.top1_changed", gate="release", why="top-1 tokens differ from gate 2")]
    return []


def _remeasure_relevance(candidate: LlamaProcess, measured: RuntimeMeasurements | None,
                         details: dict) -> list[Blocker]:
    """Re-score gate 2's pairs: finite, the scores gate 2 measured (same bytes, same runtime), the same order."""
    scores = candidate_scores(candidate)
    details.update(scores=[list(q) for q in scores], orders=[document_order(q) for q in scores],
                   tolerance=RELEASE_SCORE_TOLERANCE)
    if not all(math.isfinite(s) for query in scores for s in query):
        return [Blocker(code="release.not_finite", gate="release", why="non-finite relevance scores")]
    if measured is None:
        return []
    blockers: list[Blocker] = []
    if measured.rerank_scores:
        diff = max(abs(a - b) for was, now in zip(measured.rerank_scores, scores, strict=True)
                   for a, b in zip(was, now, strict=True))
        details["max_abs_diff_from_gate2"] = diff
        if not diff <= RELEASE_SCORE_TOLERANCE:
            blockers.append(Blocker(code="release.score_changed", gate="release",
                                    why=f"relevance scores differ from gate 2's by up to {diff:.3g} "
                                        f"(> {RELEASE_SCORE_TOLERANCE:g}): not the file measured"))
    changed = changed_orders(measured.rerank_orders, measured.rerank_scores, scores, 2 * RELEASE_SCORE_TOLERANCE)
    if changed:
        blockers.append(Blocker(code="release.order_changed", gate="release",
                                why="; ".join(f"{RERANK_SET[i].label}: documents {details['orders'][i]}, gate 2 "
                                              f"measured {list(measured.rerank_orders[i])}" for i in changed)))
    return blockers


def run_release_gate(
    artifact: Path,
    measured_files: Sequence[FileDigest],
    layout: GGUFLayout,
    sentence: SentenceConfig,
    measured: RuntimeMeasurements | None,
    kind: str | None,
    package: tuple[Path, ...] = (),
) -> tuple[GateResult, list[Blocker], list[FileDigest]]:
    started = time.perf_counter()
    details: dict = {}
    # the artifact's every file (a split's every shard) read again, as published: the bytes gates 1 and 2 saw
    paths = artifact_paths(artifact)
    reread = [digest_file(path, measured.uri) for path, measured in zip(paths, measured_files, strict=True)]
    files = list(reread)
    blockers: list[Blocker] = []
    for path in package:
        try:
            files.append(digest_file(path))
        except OSError as exc:
            blockers.append(Blocker(code="release.missing_file", gate="release", why=f"{path}: {exc.strerror}"))
    details["package"] = [f.model_dump() for f in files]
    changed = [found for path, now, then in zip(paths, reread, measured_files, strict=True)
               if (found := digest.digest_changed(now.sha256, then.sha256, path.name))]
    if changed:
        blockers.extend(changed)
    elif kind is None:
        blockers.append(Blocker(code="runtime.unknown_model_kind", gate="release", why="cannot re-measure"))
    elif refused := refusal(layout, "release"):
        blockers.extend(refused)
    else:
        n_ctx = measured.n_ctx if measured else 512
        try:
            with LlamaProcess(artifact, embedding=kind == "embedding", n_ctx=n_ctx, rank=kind == "reranker",
                              vocabulary=vocabulary_size(layout)) as candidate:
                if kind == "embedding":
                    blockers.extend(_remeasure_embedding(candidate, layout, sentence, measured, details))
                elif kind == "reranker":
                    blockers.extend(_remeasure_relevance(candidate, measured, details))
                else:
                    baseline = measured or RuntimeMeasurements("causal-lm", n_ctx)
                    blockers.extend(_remeasure_logits(candidate, baseline, details))
        except (CandidateLoadError, ReferenceMissingError) as exc:
            blockers.append(Blocker(code="runtime.load_failed", gate="release", why=str(exc)))
        except LlamaCrashedError as exc:
            blockers.append(Blocker(code="runtime.crashed", gate="release", why=str(exc)))
    details["compared_with_gate2"] = measured is not None
    status = "failed" if blockers else "passed"
    if any(b.code == "gate.not_run" for b in blockers):
        status = "not_run"
    return GateResult(name="release", status=status, seconds=time.perf_counter() - started, details=details), \
        blockers, files


class ReleaseGate:
    """Gate 3. It runs in the first pod only, last: it re-measures what gate 2 recorded, when gate 2 ran."""

    number = 3
    name: GateName = "release"
    every_shard = False
    libraries: tuple[str, ...] = ()

    def run(self, context: GateContext) -> GateOutcome:
        sentence = sentence_config(context.source)
        measured = context.measured
        kind = measured.kind if measured else model_kind(context.source, sentence, context.request.kind)
        result, blockers, package = run_release_gate(context.artifact, context.pieces, context.layout, sentence,
                                                     measured, kind, context.inputs.release_files)
        notes = [] if measured else ["gate 3 top-1 results were not compared with gate 2 (gate 2 did not run)"]
        return GateOutcome(result=result, blockers=blockers, not_verified=notes,
                           package_files=package[len(context.pieces):])

    def plants(self, inputs: ControlInputs) -> list[Plant]:
        return [lambda: [release_control(inputs.artifact, inputs.artifact_sha256)]]


RELEASE = ReleaseGate()
