#!/usr/bin/env python3
"""Scale benchmark: random-weight Qwen3 embedding models of growing size, converted by llama.cpp's own
converter (F16) and quantizer (Q8_0, Q4_K_M), verified gate by gate, each next to baselines measured in
the same process tree:

- gate 1 vs gguf-py's plain dequantization of the same file (no checks);
- gate 2 vs transformers loading the model and embedding the texts, and llama-cpp-python loading the
  GGUF and embedding them (no comparison).

Every measurement is a fresh process: wall seconds, and the peaks of its process tree's resident memory
(VmRSS, which includes the mapped GGUF and safetensors pages the kernel can drop and re-read) and of its
anonymous memory (RssAnon: what a pod's memory limit cannot reclaim), both summed over the process and
its descendants (gate 1's pool) and sampled every 50 ms. (Not ru_maxrss: exec folds the parent's peak
into a child's, so after this script quantized a 3 GB file every later child would read 2 GiB.) The
growth per billion parameters is a least-squares line through the sizes built; the projection to 7B
and 70B uses it with the stated assumptions.

Usage: python scripts/bench_scale.py [--sizes 0.05,0.15,0.6] [--types F16,Q8_0,Q4_K_M] [--workdir DIR]
       python scripts/bench_scale.py --smoke     (one ~5M-parameter model, F16: the suite's check)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
from engine.gates.storage.value_checks import PARALLEL_MIN_WEIGHTS  # noqa: E402

TEXTS = REPO / "examples" / "english.txt"
# (hidden, layers, intermediate) per nominal size in billions; the 151,936-token embedding is tied
SHAPES = {0.01: (32, 2, 96), 0.05: (256, 4, 768), 0.15: (512, 8, 1536), 0.6: (1024, 28, 3072),
          1.7: (2048, 28, 6144), 4.0: (2560, 36, 9728)}
DEQUANTIZE = """
import sys, time, numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
t = time.perf_counter()
for tensor in GGUFReader(sys.argv[1]).tensors:
    dequantize(np.asarray(tensor.data), tensor.tensor_type)
print(time.perf_counter() - t)
"""
HF_EMBED = """
import sys, time, torch
from transformers import AutoModel, AutoTokenizer
t = time.perf_counter()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModel.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
with torch.inference_mode():
    for text in open(sys.argv[2], encoding="utf-8").read().splitlines()[:8]:
        model(**tokenizer(text, return_tensors="pt"))
print(time.perf_counter() - t)
"""
LLAMA_EMBED = """
import sys, time
from llama_cpp import Llama
t = time.perf_counter()
llm = Llama(sys.argv[1], embedding=True, n_ctx=512, verbose=False)
for text in open(sys.argv[2], encoding="utf-8").read().splitlines()[:8]:
    llm.embed(text)
print(time.perf_counter() - t)
"""


def tree_memory(root: psutil.Process) -> tuple[int, int]:
    """(VmRSS, RssAnon) in KiB summed over `root` and its descendants; a process that ends meanwhile adds 0."""
    rss = anon = 0
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for process in tree:
        try:
            with open(f"/proc/{process.pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "RssAnon")))
        except OSError:
            continue
        rss += int(fields.get("VmRSS", "0 kB").split()[0])
        anon += int(fields.get("RssAnon", "0 kB").split()[0])
    return rss, anon


def child(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float, str]:
    """(wall seconds, peak tree RSS MiB, peak tree anonymous MiB, stdout) of one fresh process."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    peaks = [0, 0]
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(process.pid)
        while not done.wait(0.05):
            rss, anon = tree_memory(root)
            peaks[0], peaks[1] = max(peaks[0], rss), max(peaks[1], anon)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = process.stdout.read() if process.stdout else ""
    code = process.wait()
    done.set()
    sampler.join()
    if code not in (0, 1):  # 1 is a NO-GO verdict, still measured
        raise SystemExit(f"benchmark child failed: {' '.join(argv[:4])}")
    return time.perf_counter() - started, peaks[0] / 1024, peaks[1] / 1024, out


def build_source(size: float, target: Path, template: Path) -> int:
    """A random BF16 Qwen3 embedding model of nominal `size` (the tiny-qwen3 fixture's tokenizer and
    pooling files); returns its parameter count."""
    import torch
    from transformers import Qwen3Config, Qwen3Model

    hidden, layers, intermediate = SHAPES[size]
    config = json.loads((template / "config.json").read_text())
    config.update(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate,
                  num_attention_heads=max(hidden // 64, 2), num_key_value_heads=max(hidden // 128, 1), head_dim=64,
                  layer_types=["full_attention"] * layers, dtype="bfloat16")
    if not target.exists():
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(template, tmp, ignore=lambda folder, names: [
            name for name in names if Path(folder) == template and name in ("model.safetensors", "config.json")])
        from build_fixtures import _sentence_transformers_files

        _sentence_transformers_files(tmp, hidden)  # pooling over this size's hidden dimension
        torch.manual_seed(0)
        model = Qwen3Model(Qwen3Config(**{k: v for k, v in config.items() if k != "transformers_version"}))
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)
        (tmp / "config.json").write_text(json.dumps(config | {"architectures": ["Qwen3Model"]}, indent=2))
        tmp.rename(target)
    from safetensors import safe_open

    with safe_open(target / "model.safetensors", "np") as handle:
        return sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())  # noqa: SIM118


def artifacts(source: Path, workdir: Path, types: list[str], fixtures: Path) -> dict[str, Path]:
    from fixture_tools import convert, llama_cpp_tree, quantize

    tree = llama_cpp_tree(fixtures)
    f16 = convert(tree, source, "f16", workdir / f"{source.name}-F16.gguf")
    return {name: f16 if name == "F16" else quantize(f16, name, workdir / f"{source.name}-{name}.gguf")
            for name in types}


def verify(source: Path, artifact: Path, gates: str) -> tuple[float, float, float, dict]:
    wall, rss, anon, out = child([sys.executable, "-m", "service", "verify", "--source", str(source), "--artifact",
                                  str(artifact), "--gates", gates, "--texts", str(TEXTS), "--json"])
    return wall, rss, anon, json.JSONDecoder().raw_decode(out)[0]


def measure(params: int, source: Path, name: str, artifact: Path) -> dict[str, float | str | int]:
    g1_wall, g1_rss, g1_anon, g1 = verify(source, artifact, "1")
    g2_wall, g2_rss, g2_anon, g2 = verify(source, artifact, "2")
    deq = child([sys.executable, "-c", DEQUANTIZE, str(artifact)])
    hf = child([sys.executable, "-c", HF_EMBED, str(source), str(TEXTS)])
    ll = child([sys.executable, "-c", LLAMA_EMBED, str(artifact), str(TEXTS)])
    gate1_s, gate2_s = g1["gates"]["storage"]["seconds"], g2["gates"]["runtime"]["seconds"]
    return {"params": params, "type": name, "gate1_s": gate1_s, "gate1_wall_s": g1_wall, "gate1_mib": g1_rss,
            "gate1_anon_mib": g1_anon, "gate2_anon_mib": g2_anon, "dequantize_anon_mib": deq[2],
            "hf_embed_anon_mib": hf[2], "llama_embed_anon_mib": ll[2],
            "gate1_weights_per_s": params / gate1_s, "gate1_verdict": g1["verdict"],
            "gate1_processes": int(g1["environment"]["threads"]) if params >= PARALLEL_MIN_WEIGHTS else 1,
            "dequantize_s": deq[0], "dequantize_mib": deq[1], "gate2_s": gate2_s, "gate2_wall_s": g2_wall,
            "gate2_mib": g2_rss,
            "gate2_verdict": g2["verdict"], "hf_embed_s": hf[0], "hf_embed_mib": hf[1],
            "llama_embed_s": ll[0], "llama_embed_mib": ll[1]}


def slope(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (per billion parameters, intercept)."""
    if len(points) < 2:
        x, y = points[0]
        return (y / x if x else 0.0), 0.0
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points) or 1e-12
    k = sum((p[0] - mx) * (p[1] - my) for p in points) / var
    return k, my - k * mx


def report(rows: list[dict], pool_efficiency: float) -> None:
    print(f"{'params':>14}{'type':>8}{'gate1 s':>9}{'RSS':>7}{'anon':>6}{'w/s':>12}{'deq s':>7}{'anon':>6}"
          f"{'gate2 s':>9}{'RSS':>7}{'anon':>6}{'HF s':>7}{'anon':>7}{'llama s':>9}{'anon':>6}  verdicts")
    for r in rows:
        print(f"{r['params']:>14,}{r['type']:>8}{r['gate1_s']:>9.1f}{r['gate1_mib']:>7.0f}{r['gate1_anon_mib']:>6.0f}"
              f"{r['gate1_weights_per_s']:>12,.0f}{r['dequantize_s']:>7.1f}{r['dequantize_anon_mib']:>6.0f}"
              f"{r['gate2_s']:>9.1f}{r['gate2_mib']:>7.0f}{r['gate2_anon_mib']:>6.0f}{r['hf_embed_s']:>7.1f}"
              f"{r['hf_embed_anon_mib']:>7.0f}{r['llama_embed_s']:>9.1f}{r['llama_embed_anon_mib']:>6.0f}  "
              f"{r['gate1_verdict']}/{r['gate2_verdict']}")
    print("(memory in MiB: peak of the process tree's RSS and of its anonymous memory; verdicts: gate 1/gate 2)")
    print("\ngrowth per billion parameters (least squares over the sizes built) and the baseline's")
    keys = ("gate1_s", "gate1_anon_mib", "dequantize_s", "gate2_s", "gate2_mib", "gate2_anon_mib", "hf_embed_anon_mib")
    for name in sorted({r["type"] for r in rows}):
        typed = [r for r in rows if r["type"] == name]
        fits = {key: slope([(r["params"] / 1e9, r[key]) for r in typed]) for key in keys}
        print(f"  {name:<7} gate 1 {fits['gate1_s'][0]:.0f} s/B, anonymous {fits['gate1_anon_mib'][0]:.0f} MiB/B "
              f"(dequantize baseline {fits['dequantize_s'][0]:.0f} s/B); gate 2 {fits['gate2_s'][0]:.0f} s/B, "
              f"anonymous {fits['gate2_anon_mib'][0]:.0f} MiB/B, RSS {fits['gate2_mib'][0]:.0f} MiB/B "
              f"(transformers alone: anonymous {fits['hf_embed_anon_mib'][0]:.0f} MiB/B)")
        largest = typed[-1]  # its throughput: startup costs amortised; measured with its gate-1 pool
        rate = largest["gate1_weights_per_s"] / (1 + (largest["gate1_processes"] - 1) * pool_efficiency)
        for billions in (7, 70):
            one_core = billions * 1e9 / rate
            spread = ", ".join(f"{cores} cores {one_core / (1 + (cores - 1) * pool_efficiency) / 60:.1f} min"
                               for cores in (2, 8, 32))
            gib = {key: (fits[key][0] * billions + fits[key][1]) / 1024 for key in keys}
            print(f"          {billions}B: gate 1 ~{one_core / 60:.1f} min on one core; {spread}; anonymous "
                  f"memory gate 1 ~{gib['gate1_anon_mib']:.1f} GiB, gate 2 ~{gib['gate2_anon_mib']:.1f} GiB "
                  f"(transformers alone ~{gib['hf_embed_anon_mib']:.1f} GiB)")
    print(f"(gate seconds are the reports' own, without interpreter start; the time projection divides the "
          f"parameters by the largest model's gate-1 weights/s and assumes each extra core or pod adds "
          f"{pool_efficiency:.2f} of one core's speed (--pool-efficiency, from bench_gate1.py's pool speed-up); "
          "the memory projection is the fitted line of anonymous memory, which file-backed pages do not add to)")


def main() -> None:
    if sys.argv[1:2] == ["--build"]:
        print(build_source(float(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.05,0.15,0.6")
    parser.add_argument("--types", default="F16,Q8_0,Q4_K_M")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--fixtures", type=Path, default=REPO / ".fixtures")
    parser.add_argument("--pool-efficiency", type=float, default=0.87,
                        help="speed each extra process adds (bench_gate1.py: Q4_K_M 1.87x on 2 processes)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one ~5M-parameter model, F16 only")
    args = parser.parse_args()
    sizes = [0.01] if args.smoke else [float(s) for s in args.sizes.split(",")]
    types = ["F16"] if args.smoke else args.types.split(",")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="convgate-scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    template = args.fixtures / "tiny-qwen3" / "source"
    rows = []
    try:
        for size in sizes:
            source = workdir / f"qwen3-{size}B"
            # built in a child: torch in this process would count in every later child's peak RSS (a forked
            # child's high-water mark starts at its parent's)
            params = int(subprocess.check_output([sys.executable, __file__, "--build", str(size), str(source),
                                                  str(template)], text=True).split()[-1])
            for name, artifact in artifacts(source, workdir, types, args.fixtures).items():
                rows.append(measure(params, source, name, artifact))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"scale benchmark, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, texts {TEXTS.name} (8 lines); "
          "baselines in the same process tree")
    report(rows, args.pool_efficiency)


if __name__ == "__main__":
    main()
