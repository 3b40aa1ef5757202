"""Gate 2's diagnosis of a failure: the first layer where llama.cpp and the reference part.

A failing embedding, logits or relevance comparison says *that* the models differ, not *where*. Here
both run the same token ids (llama.cpp's, so tokenization is out of the picture) for the first failing
text; every layer's output is captured on both sides (llama.cpp's eval callback, forward hooks on the
reference's layer modules) and compared by relative error ||h_llama - h_ref|| / ||h_ref|| over all
positions. The first layer whose error exceeds its compute class's tolerance is named in the
blockers; none exceeding it means the layers agree and the divergence is after them (output norm,
pooling, head) or before them (tokenization, which the gate's own blockers then show).

Hooks on the layer modules, not `output_hidden_states`: transformers puts the final norm into the
last hidden state of decoders (LlamaModel, Qwen3Model, ...) but not of every encoder, whereas llama.cpp's
`l_out-<il>` is always the raw block output. Diagnostic only: it never adds or removes a blocker, and
runs only when the gate has already failed (no cost on GO).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.blockers import Blocker
from engine.errors import ConvgateError
from engine.formats.artifact_files import artifact_layout
from engine.formats.source import open_source
from engine.gates.runtime.logits_parity import PAST_MARK
from engine.gates.runtime.references import references
from engine.gates.runtime.relevance_parity import RERANK_SET
from engine.quant.compute import COMPUTE_CLASSES, ComputeClass
from engine.runtime.llama_process import LlamaProcess
from engine.texts import Text
from engine.thresholds import round_outward

# Tolerance = LAYER_MARGIN x the worst per-layer relative error measured on honest conversions of the
# class (any layer, any text), rounded outward. 3x is thresholds.py's 10x margin on squared distances
# (NMSE) expressed on a plain relative L2 error (sqrt(10) ~ 3.2). An absolute bound, not a jump from the
# previous layer: honest curves grow smoothly with depth (each layer at most ~1.9x the one before), but
# layer 0 has no previous layer and an MoE routing flip at F16 (arch-qwen3moe-F16) jumps at layer 0.
LAYER_MARGIN = 3.0
LAYER_FLOOR = 1e-4  # an F32-vs-F32 class would otherwise get a tolerance that summation order breaks
# Positions traced: a defect in a block shows at every position, and llama.cpp's layers are held until
# the reference has run (n_layer x positions x n_embd floats: 80 x 64 x 8192 x 4 B = 168 MiB for a 70B).
MAX_TRACE_POSITIONS = 64


@dataclass(frozen=True, slots=True)
class HonestLayers:
    """The worst per-layer relative error one honest conversion of a trained model showed, against
    transformers on the artifact's own weights, over the measured texts."""

    fixture: str
    compute: ComputeClass
    worst: float


# Measured with `python scripts/measure_thresholds.py` (see engine/thresholds.py for the versions and texts).
# Diagnostic only: a trained model's massive-activation channels make 8-bit activations err by up to ~0.5 of a
# layer's norm at some positions (SmolLM2 Q5_0), so the tolerance of those classes names a layer only when it is
# far off.
MEASURED_LAYERS: tuple[HonestLayers, ...] = (
    HonestLayers('smollm2-BF16', 'bf16', 0.0181),
    HonestLayers('smollm2-F16', 'f16', 0.0016),
    HonestLayers('smollm2-F32', 'f32', 0.000636),
    HonestLayers('smollm2-Q8_0', 'q8_0', 0.0387),
    HonestLayers('smollm2-Q6_K', 'q8_k', 0.0771),
    HonestLayers('smollm2-Q5_K_M', 'q8_k', 0.0883),
    HonestLayers('smollm2-Q4_K_M', 'q8_k', 0.391),
    HonestLayers('smollm2-Q4_0', 'q8_0', 0.0537),
    HonestLayers('smollm2-Q5_0', 'q8_0', 0.48),
    HonestLayers('smollm2-Q5_1', 'q8_0', 0.186),
    HonestLayers('smollm2-Q4_1', 'q8_0', 0.0482),
    HonestLayers('smollm2-Q4_K_S', 'q8_k', 0.086),
    HonestLayers('smollm2-Q3_K_M', 'q8_k', 0.0595),
    HonestLayers('smollm2-Q2_K', 'q8_k', 0.0936),
    HonestLayers('smollm2-IQ4_NL', 'q8_k', 0.0927),
    HonestLayers('smollm2-IQ4_XS', 'q8_k', 0.0994),
    HonestLayers('minilm-F32', 'f32', 0.00183),
    HonestLayers('minilm-F16', 'f16', 0.00181),
    HonestLayers('minilm-BF16', 'bf16', 0.00443),
    HonestLayers('minilm-Q8_0', 'q8_0', 0.0229),
    HonestLayers('minilm-Q6_K', 'q8_k', 0.0302),
    HonestLayers('minilm-Q5_K_M', 'q8_k', 0.0316),
    HonestLayers('minilm-Q4_K_M', 'q8_k', 0.0316),
    HonestLayers('minilm-Q4_0', 'q8_0', 0.0263),
    HonestLayers('minilm-Q5_0', 'q8_0', 0.0228),
    HonestLayers('minilm-Q5_1', 'q8_0', 0.0241),
    HonestLayers('minilm-Q4_1', 'q8_0', 0.0242),
    HonestLayers('minilm-Q3_K_M', 'q8_k', 0.0302),
    HonestLayers('minilm-Q2_K', 'q8_k', 0.0335),
    HonestLayers('minilm-IQ4_NL', 'q8_0', 0.0229),
)


def _worst_layer_error(name: ComputeClass) -> float:
    """The class's worst honest per-layer error, or the nearest finer measured class's."""
    for nearest in reversed(COMPUTE_CLASSES[:COMPUTE_CLASSES.index(name) + 1]):
        found = [m.worst for m in MEASURED_LAYERS if m.compute == nearest]
        if found:
            return max(found)
    raise ValueError(f"no honest per-layer error measured for compute class {name!r} or a finer one")


def layer_tolerance(classes: Sequence[ComputeClass]) -> float:
    """LAYER_MARGIN over the worst honest per-layer error of the file's compute classes, rounded outward."""
    return round_outward(max(LAYER_FLOOR, LAYER_MARGIN * max(_worst_layer_error(n) for n in classes)), up=True)


def relative_error(candidate: np.ndarray, reference: np.ndarray) -> float:
    """||candidate - reference|| / ||reference|| over every position of one layer ([pos, dim])."""
    if candidate.shape != reference.shape:
        raise ValueError(f"llama.cpp's layer {candidate.shape} and the reference's {reference.shape} differ")
    ref = reference.astype(np.float64)
    norm = float(np.linalg.norm(ref))
    return float(np.linalg.norm(candidate.astype(np.float64) - ref)) / norm if norm > 0 else math.inf


def first_divergent_layer(errors: Sequence[float], tolerance: float) -> int | None:
    """The first layer beyond `tolerance` (NaN counts as beyond), or None when every layer is within."""
    return next((layer for layer, error in enumerate(errors) if not error <= tolerance), None)


def _layer_modules(model: Any) -> Any:
    """The reference's block list: the first ModuleList as long as the config's layer count."""
    import torch

    n_layer = model.config.num_hidden_layers
    found = next((module for _, module in model.named_modules()
                  if isinstance(module, torch.nn.ModuleList) and len(module) == n_layer), None)
    if found is None:
        raise ValueError(f"the reference has no list of {n_layer} layer modules to hook")
    return found


def reference_errors(model: Any, ids: list[int], candidate: np.ndarray) -> list[float]:
    """Each block of the transformers `model` run on `ids`, its raw output compared with llama.cpp's layer
    (`candidate`, [n_layer, n_tokens, n_embd]) as soon as it is produced: no reference layer is kept."""
    import torch

    errors: dict[int, float] = {}

    def compare(layer: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            errors[layer] = relative_error(candidate[layer], hidden[0].detach().numpy())
        return hook

    blocks = _layer_modules(model)
    if len(blocks) != len(candidate):
        raise ValueError(f"llama.cpp has {len(candidate)} layers, the reference {len(blocks)}")
    handles = [block.register_forward_hook(compare(layer)) for layer, block in enumerate(blocks)]
    try:
        with torch.inference_mode():
            tensor = torch.tensor([ids], dtype=torch.long)
            model(input_ids=tensor, attention_mask=torch.ones_like(tensor))
    finally:
        for handle in handles:
            handle.remove()
    return [errors[layer] for layer in range(len(blocks))]


def layer_curve(reference_model: Any, candidate: LlamaProcess, architecture: str, ids: list[int]) -> list[float]:
    """Per-layer relative error of llama.cpp (traced in its child) against the reference on the same ids."""
    return reference_errors(reference_model, ids, candidate.trace_layers(architecture, ids))


def measure_curves(source_dir: Path, artifact: Path, texts: Sequence[str]) -> list[list[float]]:
    """Each text's per-layer curve on one conversion against transformers on its own weights, outside any
    gate: how MEASURED_LAYERS was measured. The base model serves every kind (a causal LM's or classifier's
    head comes after the last block)."""
    layout = artifact_layout(artifact)
    architecture = str(layout.metadata["general.architecture"])
    model = references(artifact, layout, open_source(source_dir), "embedding").correct
    with LlamaProcess(artifact, embedding=True, n_ctx=512) as candidate:
        return [layer_curve(model.model, candidate, architecture,
                            candidate.tokenize(text, add_special=True, parse_special=False)) for text in texts]


def _worst_pair(found: Sequence[Blocker], per_pair: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The (query, document) pair of the first failing query that llama.cpp scores furthest off."""
    queries = {query.label: query for query in RERANK_SET}
    named = next((b.text for b in found if b.text is not None), None)
    rows = [p for p in per_pair if queries[p["query"]].query == named] or per_pair
    if not rows:
        return None
    pair = max(rows, key=lambda p: math.inf if math.isnan(p["abs_diff"]) else p["abs_diff"])
    query = queries[pair["query"]]
    return query.query, query.documents[pair["document"]]


def _worst_text(found: Sequence[Blocker], details: dict[str, Any], texts: Sequence[Text]) -> str | None:
    """The first text a blocker names; else (aggregate logits or retrieval blockers) the worst measured."""
    named = next((b.text for b in found if b.text is not None), None)
    if named is not None:
        return named
    if "logits" in details:
        rows = details["logits"]["per_text"]
        worst = max(rows, key=lambda r: r["kl_mean"], default=None)
    else:
        rows = details["embeddings"]["per_text"]
        worst = min(rows, key=lambda r: r["cosine"], default=None)
    return next((t.text for t in texts if worst is not None and t.label == worst["label"]), None)


def failing_input(found: Sequence[Blocker], details: dict[str, Any], texts: Sequence[Text],
                  candidate: Any) -> tuple[str, list[int]] | None:
    """The first failing text (or (query, document) pair) and llama.cpp's token ids for it."""
    if "relevance" in details:
        pair = _worst_pair(found, details["relevance"]["per_pair"])
        return None if pair is None else (" | ".join(pair), candidate.pair_tokens(*pair))
    text = _worst_text(found, details, texts)
    return None if text is None else (text, candidate.tokenize(text, add_special=True, parse_special=False))


def _suffix(divergence: dict[str, Any]) -> str:
    if "error" in divergence:
        return f"; layer trace unavailable: {divergence['error']}"
    layer, tolerance = divergence["first_divergent_layer"], divergence["tolerance"]
    if layer is None and divergence["layers"] and divergence["layers"][-1] > tolerance / 2:
        # past 1.5x the worst honest per-layer error without any layer crossing 3x: the rounding of every
        # layer adding up (a deep model's honest quant, or a defect spread over all layers), not one part
        return (f"; no layer diverges beyond {tolerance:g} on the traced text, but the error grows through the "
                f"layers to {divergence['layers'][-1]:.3g} at the last: every layer's small difference adds up")
    if layer is None:
        return (f"; every layer agrees within {tolerance:g} on the traced text, so the models part "
                "after the last layer (output norm, pooling, head) or before the first (token ids)")
    return f"; first diverges at layer {layer} (relative error {divergence['layers'][layer]:.3g} > {tolerance:g})"


def locate_divergence(found: list[Blocker], details: dict[str, Any], *, texts: Sequence[Text], model: Any,
                      candidate: Any, architecture: str, classes: Sequence[ComputeClass],
                      against: str = "the artifact's own weights") -> list[Blocker]:
    """When gate 2's comparison failed: trace the first failing text layer by layer against `model`
    (transformers on `against`), put the curve in `details["layer_divergence"]` and name the first divergent
    layer in every blocker's `why`."""
    if not found:
        return found
    if all(blocker.why.startswith(PAST_MARK) for blocker in found):
        # a text's first positions agree, or a whole-text figure would have failed too: tracing them would
        # name no layer, or a wrong one, for a difference that lies past a window or the original context
        details["layer_divergence"] = {"skipped": f"the difference lies past position "
                                       f"{details['logits']['past_mark']['from_position']}; the trace reads a "
                                       f"text's first {MAX_TRACE_POSITIONS} positions"}
        return [blocker.model_copy(update={"why": blocker.why + "; layer trace not run: it reads a text's first "
                                           f"{MAX_TRACE_POSITIONS} positions, before the difference"})
                for blocker in found]
    chosen = failing_input(found, details, texts, candidate)
    if chosen is None:
        return found
    text, ids = chosen[0], chosen[1][:MAX_TRACE_POSITIONS]
    tolerance = layer_tolerance(classes)
    divergence: dict[str, Any] = {"text": text, "positions": len(ids), "tolerance": tolerance, "against": against,
                                  "criterion": f"relative L2 error per layer > {LAYER_MARGIN:g}x the worst honest "
                                  f"{'/'.join(classes)}"}
    try:
        errors = layer_curve(model.model, candidate, architecture, ids)
        divergence.update(layers=errors, first_divergent_layer=first_divergent_layer(errors, tolerance))
    except (ConvgateError, ValueError, RuntimeError) as exc:  # a diagnosis never fails the gate itself
        divergence["error"] = f"{type(exc).__name__}: {exc}"
    details["layer_divergence"] = divergence
    suffix = _suffix(divergence)
    return [blocker.model_copy(update={"why": blocker.why + suffix}) for blocker in found]
