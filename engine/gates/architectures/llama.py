"""llama (and Mistral-style llamas, which the converter writes as `llama`): Q/K rows permuted."""

from __future__ import annotations

import gguf

from engine.gates.architectures.base import Architecture, RowTransform, head_permutation
from engine.gates.computed_tensors import ComputedTensor, llama3_rope_factors
from engine.gates.expectation import Expectation


class Llama(Architecture, arch="llama"):
    model_arch = gguf.MODEL_ARCH.LLAMA
    omitted_patterns = ((r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", "rotary buffer, recomputed"),)
    hf_architectures = ("LlamaForCausalLM", "LlamaModel", "MistralForCausalLM")

    def expectations(self) -> list[Expectation]:
        out = super().expectations()
        heads = int(self.config["num_attention_heads"])
        rope_dim = int(self.config.get("head_dim") or int(self.config["hidden_size"]) // heads)
        out.append(Expectation("llama.rope.dimension_count", rope_dim, "config.head_dim (or hidden_size / heads)",
                               default=int(self.config["hidden_size"]) // heads))
        if "vocab_size" in self.config:
            out.append(Expectation("llama.vocab_size", int(self.config["vocab_size"]), "config.vocab_size",
                                   optional=True))
        return out

    def computed(self) -> dict[str, ComputedTensor]:
        factors = llama3_rope_factors(self.config)
        return {} if factors is None else {"rope_freqs.weight": factors}

    def omission_reason(self, source_name: str) -> str | None:
        if source_name == "lm_head.weight" and self.config.get("tie_word_embeddings"):
            return "output head tied to token embeddings (tie_word_embeddings)"
        return super().omission_reason(source_name)

    def transform(self, gguf_name: str, rows: int) -> RowTransform | None:
        n_head = int(self.config["num_attention_heads"])
        n_kv = int(self.config.get("num_key_value_heads") or n_head)
        if gguf_name.endswith(".attn_q.weight"):
            return RowTransform(f"llama Q head permutation (n_head={n_head})", head_permutation(rows, n_head))
        if gguf_name.endswith(".attn_k.weight"):
            return RowTransform(f"llama K head permutation (n_head_kv={n_kv})", head_permutation(rows, n_kv))
        return None

