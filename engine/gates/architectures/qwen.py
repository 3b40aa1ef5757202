"""Qwen decoders: qwen2 (bias on q/k/v), qwen3 (q/k norms) and qwen3moe (stacked experts).

Qwen keeps Hugging Face's rotary layout, so no Q/K permutation is undone. In qwen3moe the
converter stacks each layer's per-expert `gate_proj`, `up_proj` and `down_proj` matrices, in
expert order, into one 3-D tensor `ffn_{gate,up,down}_exps` [n_expert, rows, cols]; the router
`mlp.gate` is copied as `ffn_gate_inp`.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import gguf

from engine.gates.architectures.base import Architecture
from engine.gates.architectures.derived import Derivation, stacked
from engine.gates.expectation import Expectation
from engine.gates.hyperparameters import EXPERT_COUNT_FIELDS, first_field

EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


class Qwen2(Architecture, arch="qwen2"):
    model_arch = gguf.MODEL_ARCH.QWEN2
    omitted_patterns = ((r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", "rotary buffer, recomputed"),)
    hf_architectures = ("Qwen2ForCausalLM", "Qwen2Model")

    def omission_reason(self, source_name: str) -> str | None:
        if source_name == "lm_head.weight" and self.config.get("tie_word_embeddings"):
            return "output head tied to token embeddings (tie_word_embeddings)"
        return super().omission_reason(source_name)


class Qwen3(Qwen2, arch="qwen3"):
    model_arch = gguf.MODEL_ARCH.QWEN3
    hf_architectures = ("Qwen3ForCausalLM", "Qwen3Model")


class Qwen3Moe(Qwen2, arch="qwen3moe"):
    model_arch = gguf.MODEL_ARCH.QWEN3MOE
    hf_architectures = ("Qwen3MoeForCausalLM", "Qwen3MoeModel")

    def derivations(self, source_names: Collection[str]) -> list[Derivation]:
        """One stacked tensor per (layer, projection), its experts in index order 0..n-1."""
        experts: dict[tuple[int, str], dict[int, str]] = {}
        for name in source_names:
            if m := EXPERT.fullmatch(name):
                experts.setdefault((int(m[1]), m[3]), {})[int(m[2])] = name
        out = []
        n_expert = int(first_field(self.config, EXPERT_COUNT_FIELDS) or 0)
        for (layer, proj), by_index in sorted(experts.items()):
            # every configured expert must be there: a missing one is named by the inventory
            names = [by_index.get(i, f"model.layers.{layer}.mlp.experts.{i}.{proj}.weight")
                     for i in range(max(n_expert, max(by_index) + 1))]
            target = self.name_map.get_name(f"model.layers.{layer}.mlp.experts.{proj}.weight",
                                            try_suffixes=(".weight",))
            if target is None:
                continue
            out.append(stacked(target, names, f"{len(names)} experts' {proj} stacked in expert order"))
        return out

    def expectations(self) -> list[Expectation]:
        out = super().expectations()
        if self.config.get("moe_intermediate_size") is not None:
            out.append(Expectation("qwen3moe.expert_feed_forward_length", int(self.config["moe_intermediate_size"]),
                                   "config.moe_intermediate_size"))
        return out
