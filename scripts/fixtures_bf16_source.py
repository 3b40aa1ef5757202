"""bf16-source/: tiny-llama's weights as a BF16 source, and llama.cpp's F16 of it, which is not bit-exact.

Why: an F16 holds every BF16 value of its normal range exactly, but BF16 values below 2^-17 fall between
F16's subnormals and are rounded (by at most 2^-25). Every real BF16 checkpoint has such weights; the
trained fixtures do not (their sources were dequantized from GGUF files, whose values F16 holds exactly).
Gate 2 runs one reference pass for this F16 (engine/gates/runtime/references.py), and gate 1 must still
call each rounded value the converter's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixture_tools import convert, llama_cpp_tree, produce


def build_bf16_source(cache: Path) -> None:
    tree = llama_cpp_tree(cache)
    tiny = cache / "tiny-llama" / "source"
    out = cache / "bf16-source"
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        tmp.mkdir()
        for path in tiny.iterdir():
            if path.suffix != ".safetensors":
                shutil.copyfile(path, tmp / path.name)
        for path in tiny.glob("*.safetensors"):
            tensors = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
                       for name, tensor in load_file(str(path)).items()}
            save_file(tensors, str(tmp / path.name), metadata={"format": "pt"})
        config = json.loads((tmp / "config.json").read_text(encoding="utf-8"))
        (tmp / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}, indent=2), encoding="utf-8")

    source = produce(out / "source", make_source)
    convert(tree, source, "f16", out / "F16.gguf")
