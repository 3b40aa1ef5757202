"""Phi-3 decoders: fused projections kept fused.

This converter copies `self_attn.qkv_proj` (q, k, v rows in that order) as one `attn_qkv` tensor
and `mlp.gate_up_proj` (gate rows, then up rows) as one `ffn_up` tensor, which llama.cpp splits
at run time; gate 1 compares each fused tensor with its fused source one to one (no row reorder:
phi3 keeps Hugging Face's rotary layout).
"""

from __future__ import annotations

import gguf

from engine.gates.architectures.base import Architecture
from engine.gates.expectation import Expectation


class Phi3(Architecture, arch="phi3"):
    model_arch = gguf.MODEL_ARCH.PHI3
    hf_architectures = ("Phi3ForCausalLM",)

    def expectations(self) -> list[Expectation]:
        out = super().expectations()
        heads = int(self.config["num_attention_heads"])
        rotary = float(self.config.get("partial_rotary_factor") or 1.0)
        out.append(Expectation("phi3.rope.dimension_count", int(rotary * int(self.config["hidden_size"])) // heads,
                               "config.partial_rotary_factor * hidden_size / heads"))
        out.append(Expectation("phi3.attention.sliding_window", int(self.config.get("sliding_window") or 0),
                               "config.sliding_window (0 when absent)"))
        original = self.config.get("original_max_position_embeddings")
        if original is not None:
            out.append(Expectation("phi3.rope.scaling.original_context_length", int(original),
                                   "config.original_max_position_embeddings"))
        return out
