#!/usr/bin/env python3
"""Measure gate 2 on honest conversions of every fixture in every precision class.

The default policy's gate-2 thresholds (worker/thresholds.py) are the worst of these values widened
by a stated margin. This script builds the extra quantizations it needs (with llama.cpp's own
`llama_model_quantize`) into `<fixtures>/threshold-study/`, runs gate 2 on each with a permissive
policy (nothing can fail on a threshold), and prints one row per file plus the worst value per
class, as Python ready to paste into `MEASURED`.

Usage: python scripts/measure_thresholds.py [--fixtures .fixtures] [--texts examples/english.txt]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from build_fixtures import convert, llama_cpp_tree, quantize  # noqa: E402

from worker.engine import LocalInputs, VerifyRequest, verify  # noqa: E402
from worker.formats.gguf_structure import read_layout  # noqa: E402
from worker.policy import Policy  # noqa: E402
from worker.quant.precision import PRECISION_CLASSES, precision_class  # noqa: E402
from worker.thresholds import RuntimeThresholds  # noqa: E402

EXTRA_FTYPES = {"Q8_0": 7, "Q5_0": 8, "Q5_K_M": 17, "Q6_K": 18, "Q4_0": 2, "Q4_K_M": 15, "Q3_K_M": 12, "Q2_K": 10}
STUDY = {
    "minilm": ("minilm/source", "minilm/minilm-F32.gguf", ("F16", "BF16", "Q8_0", "Q6_K", "Q5_0", "Q5_K_M", "Q4_0",
                                                          "Q4_K_M", "Q3_K_M", "Q2_K")),
    "tiny-qwen3": ("tiny-qwen3/source", "tiny-qwen3/tiny-qwen3-F32.gguf", ("F16", "Q8_0", "Q6_K", "Q5_K_M",
                                                                          "Q4_K_M", "Q3_K_M")),
    "tiny-llama": ("tiny-llama/source", "tiny-llama/tiny-llama-F32.gguf", ("F16", "BF16", "Q8_0", "Q6_K", "Q5_0",
                                                                          "Q5_K_M", "Q4_0", "Q4_K_M", "Q3_K_M",
                                                                          "Q2_K")),
}
# One-per-architecture fixtures (scripts/fixtures_decoders.py, fixtures_encoders.py): llama.cpp's own F16
# conversion and its Q8_0 quantization, measured as built. Rerankers have their own thresholds
# (worker/rerank_thresholds.py).
ARCHITECTURE_FIXTURES = ("arch-llama", "arch-mistral", "arch-qwen2", "arch-qwen3moe", "arch-gemma2", "arch-gemma3",
                         "arch-phi3", "arch-xlm-roberta")
PERMISSIVE = RuntimeThresholds(min_cosine=-1, max_logits_nmse=1e9, max_kl_mean=1e9, max_kl_p99=1e9,
                               min_top1_agreement=0)


def variant(fixtures: Path, name: str, base: Path, source: Path, kind: str) -> Path:
    out = fixtures / "threshold-study" / name
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"{name}-{kind}.gguf"
    if kind in ("F16", "BF16"):
        return convert(llama_cpp_tree(fixtures), source, kind.lower(), target)
    if kind in EXTRA_FTYPES:
        from build_fixtures import QUANT_FTYPES

        QUANT_FTYPES.setdefault(kind, EXTRA_FTYPES[kind])
        return quantize(base, kind, target)
    raise ValueError(kind)


def measure(source: Path, artifact: Path, texts: tuple[str, ...]) -> dict[str, float | None]:
    policy = Policy(runtime={name: PERMISSIVE for name in PRECISION_CLASSES}, require_top1_equal=False)
    request = VerifyRequest(gates=frozenset({2}), texts=texts)
    report = verify(request, LocalInputs(source=source, artifact=artifact), policy)
    details = report.gates["runtime"].details
    if "embeddings" in details:
        return {"min_cosine": details["embeddings"]["min_cosine"]}
    summary = details["logits"]["summary"]
    return {"nmse": summary["nmse"], "kl_mean": summary["kl_mean"], "kl_p99": summary["kl_p99"],
            "top1": summary["top1_agreement"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=ROOT / ".fixtures")
    parser.add_argument("--texts", type=Path, default=ROOT / "examples" / "english.txt")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--architectures-only", action="store_true",
                        help="measure only the one-per-architecture fixtures (no extra quantizations)")
    args = parser.parse_args()
    if args.build_only:
        for name, (source_dir, base_file, kinds) in STUDY.items():
            for kind in kinds:
                variant(args.fixtures, name, args.fixtures / base_file, args.fixtures / source_dir, kind)
        return
    texts = tuple(line for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip())
    rows = []
    for folder in ARCHITECTURE_FIXTURES:
        for kind in ("F16", "Q8_0"):
            artifact = args.fixtures / folder / f"{kind}.gguf"
            values = measure(args.fixtures / folder / "source", artifact, texts)
            rows.append({"fixture": f"{folder}-{kind}", "precision": precision_class(read_layout(artifact)), **values})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if not args.architectures_only:
        # Quantizing in a process that has run llama.cpp inference crashes libllama: build first, apart.
        subprocess.check_call([sys.executable, __file__, "--fixtures", str(args.fixtures), "--build-only"])
    for name, (source_dir, base_file, kinds) in ({} if args.architectures_only else STUDY).items():
        source, base = args.fixtures / source_dir, args.fixtures / base_file
        for kind in ("F32", *kinds):
            artifact = base if kind == "F32" else variant(args.fixtures, name, base, source, kind)
            values = measure(source, artifact, texts)
            rows.append({"fixture": f"{name}-{kind}", "precision": precision_class(read_layout(artifact)), **values})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("MEASURED: tuple[Honest, ...] = (")
    for row in rows:
        fields = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v:.3g}" for k, v in row.items())
        print(f"    Honest({fields}),")
    print(")")
    print("\nworst per class:", file=sys.stderr)
    for precision in PRECISION_CLASSES:
        members = [r for r in rows if r["precision"] == precision]
        print(f"  {precision}: {[r['fixture'] for r in members]}", file=sys.stderr)


if __name__ == "__main__":
    main()
