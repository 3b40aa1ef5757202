#!/usr/bin/env python3
"""End-to-end `convgate verify` wall time and peak RSS, split by gate, next to a baseline measured
in the same run: the bare work gate 2 cannot avoid (load transformers and llama.cpp, embed the same
texts once each, no checks).

Every measurement is a fresh process (peak RSS is the kernel's ru_maxrss for that process).
Usage: python scripts/bench_gates.py [--fixtures .fixtures] [--repeat 2]
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

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "How do I verify that a converted model matches the original weights?",
    "Platform teams gate every quantized model before it ships.",
    "a",
]

BASELINE = """
import sys, json, torch
from tokenizers import Tokenizer
from transformers import AutoModel
from llama_cpp import Llama
source, gguf, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
tok = Tokenizer.from_file(source + "/tokenizer.json"); tok.no_padding(); tok.no_truncation()
model = AutoModel.from_pretrained(source, dtype=torch.float32).eval()
llm = Llama(gguf, embedding=True, n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
with torch.inference_mode():
    for text in texts:
        ids = torch.tensor([tok.encode(text).ids])
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
        llm.embed(text)
"""


def run(args: list[str]) -> tuple[float, float, str]:
    started = time.perf_counter()
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = process.stdout.read() if process.stdout else ""
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        raise SystemExit(f"failed: {' '.join(args[:6])}")
    return time.perf_counter() - started, usage.ru_maxrss / 1024, out


def verify(source: Path, artifact: Path, gates: str, texts: Path) -> tuple[float, float, dict]:
    wall, rss, out = run([sys.executable, "-m", "service", "verify", "--source", str(source), "--artifact",
                          str(artifact), "--gates", gates, "--texts", str(texts), "--json"])
    return wall, rss, json.loads(out.rsplit("\n", 2)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=Path(".fixtures"))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="one fixture, the full run only (the suite's check)")
    args = parser.parse_args()
    runs_of = (("gates 1,2,3", "1,2,3"),) if args.smoke else (
        ("gates 1,2,3", "1,2,3"), ("gate 1", "1"), ("gate 2", "2"), ("gate 3", "3"))
    repeat = 1 if args.smoke else args.repeat
    minilm, qwen3 = args.fixtures / "minilm", args.fixtures / "tiny-qwen3"
    cases = [("minilm F16", minilm / "source", minilm / "minilm-F16.gguf"),
             ("qwen3 F32", qwen3 / "source", qwen3 / "tiny-qwen3-F32.gguf")][: 1 if args.smoke else None]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(TEXTS) + "\n")
    texts = Path(handle.name)
    print(f"convgate verify, {len(TEXTS)} English texts, best of {repeat}")
    print(f"{'fixture':<12}{'run':<14}{'wall s':>8}{'peak MiB':>10}  gate seconds (from the report)")
    for name, source, artifact in cases:
        for label, gates in runs_of:
            runs = [verify(source, artifact, gates, texts) for _ in range(repeat)]
            wall = min(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            report = runs[0][2]
            per_gate = ", ".join(f"{gate} {result['seconds']:.2f}" for gate, result in report["gates"].items())
            print(f"{name:<12}{label:<14}{wall:>8.2f}{rss:>10.0f}  {per_gate}  [{report['verdict']}]")
        base = [run([sys.executable, "-c", BASELINE, str(source), str(artifact), json.dumps(TEXTS)])
                for _ in range(repeat)]
        base_wall, base_rss = min(b[0] for b in base), max(b[1] for b in base)
        full_wall = min(verify(source, artifact, "1,2,3", texts)[0] for _ in range(repeat))
        print(f"{name:<12}{'baseline':<14}{base_wall:>8.2f}{base_rss:>10.0f}  (load both runtimes, embed once)"
              f"  -> full verify / baseline = {full_wall / base_wall:.2f}x")
    texts.unlink()


if __name__ == "__main__":
    main()
