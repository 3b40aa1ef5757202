#!/usr/bin/env python3
"""A 7B-shaped run: a random-weight causal LM with Llama-2-7B's shapes (hidden 4096, 32 layers, MLP 11008,
32 heads, vocabulary 32000: 6.74B parameters) as a BF16 source in 2 GB safetensors shards, converted by
llama.cpp's own converter to F16 and quantized by llama.cpp's quantizer to Q4_K_M, the Q4_K_M also written as
a 3-shard gguf-split. Each artifact is verified in full (gates 1, 2, 3) on this machine, beside the time the
converter and the quantizer took to make it: the baseline is what producing the file cost.

Every verification is a fresh process with the page cache dropped first (when the kernel lets us), measured
from outside: wall seconds, the reports' per-gate seconds, the peaks of the process tree's VmRSS and RssAnon
(sampled every 50 ms), and the bytes the tree read from storage (/proc/<pid>/io read_bytes, summed over the
tree, each process's last sample kept), attributed to gates by the report's own timings.
The projection to 70B scales each measure by the parameter count (10.4x), the slope a linear-time gate has.

Usage: python scripts/bench_7b.py [--workdir DIR]       (~80 GB of disk at its peak is not needed: the F16 is
                                                           deleted once quantized; ~32 GB)
       python scripts/bench_7b.py --smoke               (a 2-layer, 256-wide model: the suite's check)
       python scripts/bench_7b.py --layers 16 --verify F16 --memory-limit 12G
                                                        (half the layers, in a memory cgroup whose page cache
                                                         cannot hold the source and the F16 together, as 24 GiB
                                                         cannot hold the 7B pair's 27 GB)
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))
from process_tree import Sampler  # noqa: E402

TEXTS = REPO / "examples" / "english.txt"
LLAMA2_7B = {"hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 11008, "num_attention_heads": 32,
             "num_key_value_heads": 32, "head_dim": 128}
SMOKE = {"hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512, "num_attention_heads": 4,
         "num_key_value_heads": 4, "head_dim": 64}
SHARD_BYTES = 2 << 30
PARAMS_70B = 68.98e9  # Llama-2-70B


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of a LlamaForCausalLM with `config`'s shapes, in checkpoint order."""
    hidden, inter, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        shapes |= {prefix + "input_layernorm.weight": (hidden,), prefix + "post_attention_layernorm.weight": (hidden,),
                   prefix + "self_attn.q_proj.weight": (q, hidden), prefix + "self_attn.k_proj.weight": (kv, hidden),
                   prefix + "self_attn.v_proj.weight": (kv, hidden), prefix + "self_attn.o_proj.weight": (hidden, q),
                   prefix + "mlp.gate_proj.weight": (inter, hidden), prefix + "mlp.up_proj.weight": (inter, hidden),
                   prefix + "mlp.down_proj.weight": (hidden, inter)}
    return shapes | {"model.norm.weight": (config["hidden_size"],), "lm_head.weight": (vocab, hidden)}


def build_source(target: Path, template: Path, shapes: dict[str, int]) -> int:
    """The BF16 source in shards of at most SHARD_BYTES, written one shard at a time (never the whole model in
    memory); the tiny-llama fixture's tokenizer. Returns the parameter count."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((template / "config.json").read_text()) | shapes | {"dtype": "bfloat16",
                                                                          "max_position_embeddings": 4096}
    every = tensor_shapes(config)
    if not target.exists():
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "generation_config.json"):
            shutil.copyfile(template / name, tmp / name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        generator = torch.Generator().manual_seed(0)
        groups: list[list[str]] = [[]]
        size = 0
        for name, shape in every.items():
            if size and size + 2 * math.prod(shape) > SHARD_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(name)
            size += 2 * math.prod(shape)
        weight_map = {}
        for number, names in enumerate(groups, start=1):
            file = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
            tensors = {name: (torch.ones(every[name]) if name.endswith("norm.weight") else
                              torch.empty(every[name]).normal_(0, 0.02, generator=generator)).to(torch.bfloat16)
                       for name in names}
            save_file(tensors, str(tmp / file), metadata={"format": "pt"})
            weight_map |= dict.fromkeys(names, file)
        total = sum(2 * math.prod(shape) for shape in every.values())
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        tmp.rename(target)
    return sum(math.prod(shape) for shape in every.values())


def drop_page_cache() -> bool:
    """So the bytes read are the bytes a pod whose page cache cannot hold the model reads."""
    try:
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def timed(label: str, work) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - started
    print(f"  {label}: {seconds:.0f} s", flush=True)
    return seconds, result


def fresh(path: Path) -> Path:
    """`path` with any file there from an earlier run removed: the fixture tools keep an existing file, which
    would then not be timed."""
    path.unlink(missing_ok=True)
    return path


def cold(label: str, work) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """`timed` from a dropped page cache: the converter and the quantizer read from storage, as each
    verification does, so the ratio compares like with like (with the source just written, and so still in
    the cache, the half-7B conversion took 25 s instead of 42 s)."""
    drop_page_cache()
    return timed(label, work)


def memory_cgroup(limit: str) -> Path:
    """A memory cgroup capped at `limit` (e.g. 12G), as a pod's limit caps it: the page cache the verification
    fills counts against it, so a model larger than the limit is read from the disk as in such a pod. cgroup v2
    (memory.max) or v1 (memory.limit_in_bytes); needs the right to create one (root, a privileged container)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    size = int(float(limit[:-1]) * units[limit[-1].upper()]) if limit[-1].upper() in units else int(limit)
    v1 = Path("/sys/fs/cgroup/memory")
    group = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / f"convgate-bench-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / ("memory.limit_in_bytes" if v1.is_dir() else "memory.max")).write_text(str(size))
    return group


def verify(source: Path, artifact: Path, shard_sha256: list[str], group: Path | None = None) -> dict:
    """One full verification in a fresh process (in `group`, a memory cgroup, when given), measured from
    outside."""
    dropped = drop_page_cache()
    argv = [sys.executable, "-m", "service", "verify", "--source", str(source), "--artifact", str(artifact),
            "--gates", "1,2,3", "--texts", str(TEXTS), "--json", *(f"--shard-sha256={s}" for s in shard_sha256)]
    started = time.perf_counter()

    def enter_group() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               preexec_fn=enter_group)  # noqa: PLW1509 -- a write of this pid, no threads
    sampler = Sampler(process.pid)
    out = process.stdout.read() if process.stdout else ""
    code = process.wait()
    sampler.stop()
    wall = time.perf_counter() - started
    if code not in (0, 1):
        raise SystemExit(f"verification failed to run (exit {code}): {artifact.name}")
    report = json.JSONDecoder().raw_decode(out)[0]
    timings = report["timings"]
    gates, bounds, at = {}, {}, wall - timings["total"]  # the interpreter's start before the engine's clock
    for step in ("fetch_and_digest", "storage", "runtime", "release", "controls"):
        at += timings.get(step, 0.0)
        bounds[step] = at
    before = 0
    for step, end in bounds.items():
        gates[step] = {"seconds": timings.get(step, 0.0), "read_gb": (sampler.read_by(end) - before) / 1e9}
        before = sampler.read_by(end)
    logits = report.get("gates", {}).get("runtime", {}).get("details", {}).get("logits", {})
    return {"artifact": artifact.name, "verdict": report["verdict"], "passes": passes(report),
            "distances": {key: logits.get("summary", {}).get(key) for key in ("nmse", "kl_mean", "kl_p99")},
            "compute_noise": logits.get("compute_noise"),
            "blockers": [b["code"] for b in report["blockers"]], "wall_s": wall, "rss_gib": sampler.rss / 2**20,
            "anon_gib": sampler.anon / 2**20,
            "read_gb": sum(sampler.read.values()) / 1e9, "gates": gates, "cache_dropped": dropped}


def passes(report: dict) -> int | None:
    """Gate 2's reference passes (one where gate 1 proved the weights equal)."""
    runtime = report.get("gates", {}).get("runtime", {}).get("details", {})
    return runtime.get("reference", {}).get("passes")


def report(params: int, source_gb: float, made: dict[str, float], runs: list[dict]) -> None:
    scale = PARAMS_70B / params
    print(f"\n7B-shaped run, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, {params / 1e9:.2f}B parameters, "
          f"BF16 source {source_gb:.1f} GB, texts {TEXTS.name}")
    print("making the files (llama.cpp's converter and quantizer; the split by gguf-py): "
          + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in made.items() if name != "build the BF16 source"))
    print(f"{'artifact':<40}{'verdict':>7}{'wall s':>8}{'digest':>8}{'gate 1':>8}{'gate 2':>8}{'gate 3':>8}"
          f"{'ctrls':>7}{'RSS GiB':>9}{'anon':>6}{'read GB':>9}{'g2 read':>9}")
    for run in runs:
        g = run["gates"]
        print(f"{run['artifact']:<40}{run['verdict']:>7}{run['wall_s']:>8.0f}{g['fetch_and_digest']['seconds']:>8.0f}"
              f"{g['storage']['seconds']:>8.0f}{g['runtime']['seconds']:>8.0f}{g['release']['seconds']:>8.0f}"
              f"{g['controls']['seconds']:>7.0f}{run['rss_gib']:>9.1f}{run['anon_gib']:>6.1f}{run['read_gb']:>9.1f}"
              f"{g['runtime']['read_gb']:>9.1f}")
    print("(read GB: bytes the verification's process tree read from storage, page cache dropped first: "
          f"{all(run['cache_dropped'] for run in runs)}; g2 read: during gate 2, by the report's timings)")
    print("gate 2's reference passes: " + ", ".join(f"{run['artifact']} {run['passes']}" for run in runs))
    for run in runs:  # random weights: a NO-GO's blockers say whether correctness or a trained-model budget spoke
        if run["blockers"]:
            print(f"  {run['artifact']} blockers: {', '.join(sorted(set(run['blockers'])))}")
        print(f"  {run['artifact']} correctness distances: " + ", ".join(
            f"{key} {value:.3g}" for key, value in run["distances"].items() if value is not None))
        if noise := run["compute_noise"]:  # gate 2 measured the model's own rounding noise (compute_noise.py)
            print(f"  {run['artifact']} its own {noise['rounded_to']} rounding noise over {noise['positions']} "
                  f"positions: nmse {noise['nmse']:.3g}, kl_mean {noise['kl_mean']:.3g}, kl_p99 {noise['kl_p99']:.3g}; "
                  f"thresholds then nmse {noise['thresholds']['max_logits_nmse']}, kl_mean "
                  f"{noise['thresholds']['max_kl_mean']}, kl_p99 {noise['thresholds']['max_kl_p99']}")
    conversion = {"F16": made["convert F16"], "Q4_K_M": made["convert F16"] + made.get("quantize Q4_K_M", 0.0)}
    conversion["split"] = conversion["Q4_K_M"] + made.get("split Q4_K_M", 0.0)
    print("\nverification wall / making the file:")
    for run in runs:
        kind = "split" if "-of-" in run["artifact"] else ("F16" if "F16" in run["artifact"] else "Q4_K_M")
        print(f"  {run['artifact']:<40} {run['wall_s']:.0f} s / {conversion[kind]:.0f} s = "
              f"{run['wall_s'] / conversion[kind]:.2f}x")
    print(f"\nprojected to 70B (x{scale:.1f} parameters, linear in each measure):")
    for run in runs:
        print(f"  {run['artifact']:<40} wall ~{run['wall_s'] * scale / 3600:.1f} h on {os.cpu_count()} CPUs, "
              f"gate 2 ~{run['gates']['runtime']['seconds'] * scale / 60:.0f} min, read ~"
              f"{run['read_gb'] * scale:.0f} GB, anonymous memory (not linear: one block + activations) "
              f"measured {run['anon_gib']:.1f} GiB here")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--fixtures", type=Path, default=REPO / ".fixtures")
    parser.add_argument("--smoke", action="store_true", help="a 2-layer, 256-wide model")
    parser.add_argument("--verify", default="F16,Q4_K_M,split",
                        help="which artifacts to verify (all are made): F16, Q4_K_M, split")
    parser.add_argument("--low-disk", action="store_true",
                        help="delete the source while quantizing and build it again (peak: source + F16)")
    parser.add_argument("--layers", type=int, default=None, help="Llama-2-7B's shapes with this many layers")
    parser.add_argument("--memory-limit", default=None,
                        help="run each verification in a memory cgroup of this size (e.g. 12G), page cache included")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def main() -> None:
    if sys.argv[1:2] == ["--build"]:
        print(build_source(Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])))
        return
    args = parse_args()
    chosen = set(args.verify.split(","))
    from fixture_tools import convert, llama_cpp_tree, quantize

    from engine.digests import sha256_file
    from tests.gguf_split_writer import resplit

    shapes = SMOKE if args.smoke else LLAMA2_7B
    if args.layers:
        shapes = shapes | {"num_hidden_layers": args.layers}
    group = memory_cgroup(args.memory_limit) if args.memory_limit else None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="convgate-7b-"))
    workdir.mkdir(parents=True, exist_ok=True)
    source = workdir / ("llama-smoke" if args.smoke else "llama2-7b-shaped")
    if args.layers:
        source = source.with_name(f"{source.name}-{args.layers}-layers")
    made: dict[str, float] = {}
    runs = []
    try:
        def build() -> int:  # in a child: torch in this process would count in every later child's peak
            return int(subprocess.check_output(
                [sys.executable, __file__, "--build", str(source), str(args.fixtures / "tiny-llama" / "source"),
                 json.dumps(shapes)], text=True).split()[-1])

        made["build the BF16 source"], params = timed("build the BF16 source", build)
        tree = llama_cpp_tree(args.fixtures)
        made["convert F16"], f16 = cold("convert F16", lambda: convert(tree, source, "f16",
                                                                         fresh(workdir / f"{source.name}-F16.gguf")))
        if "F16" in chosen:
            runs.append(verify(source, Path(str(f16)), [], group))
        source_gb = sum(path.stat().st_size for path in source.glob("*.safetensors")) / 1e9
        if chosen & {"Q4_K_M", "split"}:
            if args.low_disk:  # the seeded source is made again, identical, once the F16 is gone
                shutil.rmtree(source)
            made["quantize Q4_K_M"], q4 = cold("quantize Q4_K_M", lambda: quantize(
                Path(str(f16)), "Q4_K_M", fresh(workdir / f"{source.name}-Q4_K_M.gguf")))
            Path(str(f16)).unlink()  # the disk: BF16 source, F16 and Q4_K_M at once is the peak
            if not source.exists():
                timed("build the BF16 source again", build)
            if "Q4_K_M" in chosen:
                runs.append(verify(source, Path(str(q4)), [], group))
            (workdir / "split").mkdir(exist_ok=True)
            made["split Q4_K_M"], shards = timed("split Q4_K_M in 3", lambda: resplit(
                Path(str(q4)), workdir / "split" / f"{source.name}-Q4_K_M.gguf", 3))
            shard_list = list(shards)  # type: ignore[call-overload]
            if "split" in chosen:
                runs.append(verify(source, shard_list[0], [sha256_file(shard) for shard in shard_list], group))
    finally:
        if group is not None:
            group.rmdir()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps({"params": params, "made": made, "runs": runs}, indent=2))
        return
    report(params, source_gb, made, runs)


if __name__ == "__main__":
    main()
