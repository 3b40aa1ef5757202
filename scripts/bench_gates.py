#!/usr/bin/env python3
"""End-to-end `convgate verify` on the trained fixtures: wall time, per-gate seconds and the peaks of the
process tree's memory (RSS and anonymous, the engine and its llama.cpp child together), next to a baseline
measured in the same run: the bare work gate 2 cannot avoid (load transformers and llama.cpp, run the same
texts through each once: embeddings for MiniLM, every position's logits for SmolLM2; no checks).

Every measurement is a fresh process. Usage:
  python scripts/bench_gates.py [--fixtures .fixtures] [--repeat 1] [--default-texts]
  python scripts/bench_gates.py --smoke        (MiniLM F16, the full run only: the suite's check)
  python scripts/bench_gates.py --long-context 2048,8192 [--only 'smollm2 F16']
                                               (gate 2 with its built-in long text at each length, and
                                                with none: what comparing far positions costs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_tree import Sampler

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "How do I verify that a converted model matches the original weights?",
    "Platform teams gate every quantized model before it ships.",
    "a",
]

BASELINE = """
import sys, json, torch
from tokenizers import Tokenizer
from transformers import AutoModel, AutoModelForCausalLM
from llama_cpp import Llama
source, gguf, texts, causal = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "causal"
tok = Tokenizer.from_file(source + "/tokenizer.json"); tok.no_padding(); tok.no_truncation()
model = (AutoModelForCausalLM if causal else AutoModel).from_pretrained(source, dtype=torch.float32).eval()
llm = Llama(gguf, embedding=not causal, logits_all=causal, n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
with torch.inference_mode():
    for text in texts:
        ids = torch.tensor([tok.encode(text).ids])
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        if causal:
            llm.reset(); llm.eval(llm.tokenize(text.encode()))
        else:
            llm.embed(text)
"""

CASES = (("smollm2 BF16", "smollm2", "smollm2-BF16.gguf", "causal"),
         ("smollm2 F16", "smollm2", "smollm2-F16.gguf", "causal"),
         ("smollm2 Q8_0", "smollm2", "smollm2-Q8_0.gguf", "causal"),
         ("minilm F16", "minilm", "minilm-F16.gguf", "embedding"),
         ("minilm Q8_0", "minilm", "minilm-Q8_0.gguf", "embedding"))


def measured(argv: list[str]) -> tuple[float, float, float, float, str]:
    """(wall seconds, CPU seconds, peak tree RSS MiB, peak tree anonymous MiB, stdout) of one fresh process.
    CPU seconds are the tree's (a process's rusage counts the children it reaped: the llama.cpp child, gate 1's
    pool), which other load on the machine moves far less than it moves wall time."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    sampler = Sampler(process.pid)
    out = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    sampler.stop()
    if process.returncode not in (0, 1):  # 1 is a NO-GO verdict, still measured
        raise SystemExit(f"failed (exit {process.returncode}): {' '.join(argv[:6])}")
    cpu = usage.ru_utime + usage.ru_stime
    return time.perf_counter() - started, cpu, sampler.rss / 1024, sampler.anon / 1024, out


def verify(source: Path, artifact: Path, gates: str, texts: Path | None,
           policy: Path | None = None) -> tuple[float, float, float, float, dict]:
    given = (["--texts", str(texts)] if texts else []) + (["--policy", str(policy)] if policy else [])
    *figures, out = measured([sys.executable, "-m", "service", "verify", "--source", str(source),
                              "--artifact", str(artifact), "--gates", gates, *given, "--json"])
    return (*figures, json.JSONDecoder().raw_decode(out)[0])  # type: ignore[return-value]


def passes(report: dict) -> str:
    """How many reference passes gate 2 ran (absent from reports made before it was recorded)."""
    reference = report["gates"].get("runtime", {}).get("details", {}).get("reference", {})
    return str(reference.get("passes", "-"))


def long_context(cases: list[tuple[str, str, str, str]], fixtures: Path, lengths: list[int], texts: Path) -> None:
    """Gate 2 on each causal case with the built-in long text at each length (policy.long_context_tokens) and
    with a 16-token one (as good as none): the extra seconds and memory are what far positions cost."""
    print(f"{'fixture':<14}{'long text':>10}{'wall s':>8}{'CPU s':>8}{'RSS':>8}{'anon':>8}  positions compared, "
          "longest position [verdict]")
    for name, folder, artifact_name, kind in cases:
        if kind != "causal":
            continue
        for length in [16, *lengths]:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as policy:
                json.dump({"long_context_tokens": length}, policy)
            wall, cpu, rss, anon, report = verify(fixtures / folder / "source", fixtures / folder / artifact_name,
                                                  "2", texts, Path(policy.name))
            Path(policy.name).unlink()
            logits = report["gates"]["runtime"]["details"].get("logits", {})
            reached = logits.get("positions", {}).get("longest_position", "-")
            print(f"{name:<14}{length:>10}{wall:>8.1f}{cpu:>8.1f}{rss:>8.0f}{anon:>8.0f}  "
                  f"{logits.get('summary', {}).get('positions', '-')}, {reached} [{report['verdict']}]", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=Path(".fixtures"))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--default-texts", action="store_true", help="verify with the built-in text set")
    parser.add_argument("--only", default="", help="comma-separated case names (e.g. 'smollm2 F16')")
    parser.add_argument("--smoke", action="store_true", help="MiniLM F16, the full run only (the suite's check)")
    parser.add_argument("--long-context", default="", help="comma-separated lengths of gate 2's long text")
    args = parser.parse_args()
    runs_of = (("gates 1,2,3", "1,2,3"),) if args.smoke else (("gates 1,2,3", "1,2,3"), ("gate 2", "2"))
    cases = [case for case in CASES if case[0] == "minilm F16"] if args.smoke else [
        case for case in CASES if not args.only or case[0] in args.only.split(",")]
    repeat = 1 if args.smoke else args.repeat
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(TEXTS) + "\n")
    texts = None if args.default_texts else Path(handle.name)
    print(f"convgate verify, {'the built-in texts' if texts is None else f'{len(TEXTS)} English texts'}, "
          f"best of {repeat}; memory: peak of the process tree, MiB")
    if args.long_context:
        long_context(cases, args.fixtures, [int(n) for n in args.long_context.split(",")], Path(handle.name))
        Path(handle.name).unlink()
        return
    print(f"{'fixture':<14}{'run':<13}{'wall s':>8}{'CPU s':>8}{'RSS':>8}{'anon':>8}{'passes':>7}  "
          "gate seconds [verdict]")
    for name, folder, artifact_name, kind in cases:
        source, artifact = args.fixtures / folder / "source", args.fixtures / folder / artifact_name
        full_cpu = 0.0
        for label, gates in runs_of:
            runs = [verify(source, artifact, gates, texts) for _ in range(repeat)]
            wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
            rss, anon = max(r[2] for r in runs), max(r[3] for r in runs)
            report = runs[0][4]
            full_cpu = full_cpu or cpu
            per_gate = ", ".join(f"{gate} {result['seconds']:.1f}" for gate, result in report["gates"].items())
            print(f"{name:<14}{label:<13}{wall:>8.1f}{cpu:>8.1f}{rss:>8.0f}{anon:>8.0f}{passes(report):>7}  {per_gate} "
                  f"[{report['verdict']}]", flush=True)
        base = [measured([sys.executable, "-c", BASELINE, str(source), str(artifact), json.dumps(TEXTS), kind])
                for _ in range(repeat)]
        base_wall, base_cpu = min(b[0] for b in base), min(b[1] for b in base)
        print(f"{name:<14}{'baseline':<13}{base_wall:>8.1f}{base_cpu:>8.1f}{max(b[2] for b in base):>8.0f}"
              f"{max(b[3] for b in base):>8.0f}{'':>7}  (load both runtimes, run the texts once)"
              f"  -> full verify / baseline = {full_cpu / base_cpu:.2f}x (CPU)", flush=True)
    Path(handle.name).unlink()


if __name__ == "__main__":
    main()
