"""bf16-source/: tiny-llama's weights as a BF16 source, and llama.cpp's F16 of it, which is not bit-exact.

Why: an F16 holds every BF16 value of its normal range exactly, but BF16 values below 2^-17 fall between
F16's subnormals and are rounded (by at most 2^-25). Every real BF16 checkpoint has such weights; the
trained fixtures do not (their sources were dequantized from GGUF files, whose values F16 holds exactly).
Gate 2 runs one reference pass for this F16 (engine/gates/runtime/references.py), and gate 1 must still
call each rounded value the converter's own."""

from __future__ import annotations

import json
from pathlib import Path

from fixture_tools import convert, llama_cpp_tree, tiny_llama_variant


def build_bf16_source(cache: Path) -> None:
    def bf16_weights(tiny: Path, tmp: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        for path in tiny.glob("*.safetensors"):
            tensors = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
                       for name, tensor in load_file(str(path)).items()}
            save_file(tensors, str(tmp / path.name), metadata={"format": "pt"})
        config = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
        (tmp / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}, indent=2), encoding="utf-8")

    source = tiny_llama_variant(cache, "bf16-source", bf16_weights)
    convert(llama_cpp_tree(cache), source, "f16", cache / "bf16-source" / "F16.gguf")
