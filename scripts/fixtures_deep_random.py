"""deep-random/: a 32-layer random llama whose honest F16 llama.cpp's own float16 rounding moves further than the
float16 thresholds measured on trained SmolLM2 allow.

Why: the 7B-shaped random F16 of docs/benchmarks.md, bit-exact by gate 1, was NO-GO on
`logits.nmse_above_threshold`: 32 layers of random weights amplify the rounding of activations. Gate 2 now
measures a model's own sensitivity to its class's rounding when a distance fails
(engine/gates/runtime/compute_noise.py). This fixture shows the same at tiny-llama's width: tiny-llama's
tokenizer and shapes, 32 layers, weights drawn with a standard deviation of 0.1 instead of 0.02, a BF16 source
(so the F16 holds it exactly and gate 2 runs one reference pass, as for the 7B), llama.cpp's F16 of it."""

from __future__ import annotations

import json
from pathlib import Path

from fixture_tools import convert, llama_cpp_tree, tiny_llama_variant

DEEP = {"num_hidden_layers": 32, "initializer_range": 0.1, "dtype": "bfloat16"}


def build_deep_random(cache: Path) -> None:
    def deep_weights(tiny: Path, tmp: Path) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        config = json.loads((tiny / "config.json").read_text(encoding="utf-8")) | DEEP
        (tmp / "config.json").unlink()  # save_pretrained writes the deep model's own
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**{key: value for key, value in config.items()
                                                if key not in ("architectures", "model_type", "transformers_version")}))
        model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True)

    source = tiny_llama_variant(cache, "deep-random", deep_weights)
    convert(llama_cpp_tree(cache), source, "f16", cache / "deep-random" / "F16.gguf")
