"""ModernBERT encoders (GGUF architecture `modern-bert`): fused projections kept fused.

llama.cpp's converter (`ModernBertModel` in convert_hf_to_gguf) copies `attn.Wqkv` (q, k, v rows in
that order) as one `attn_qkv` and `mlp.Wi` (the GLU's input rows, then its gate rows: 2 x
intermediate_size) as one `ffn_up`, which llama.cpp splits at run time; gate 1 compares each fused
tensor with its fused source one to one (no row reorder: ModernBERT's rotary layout is Hugging
Face's, and the converter applies no Q/K permutation). Layer 0 has no `attn_norm` in either file
(an identity). Names lose the `model.` prefix that the masked-LM and classifier wrappers add.

Its config names ModernBERT's LayerNorm epsilon `norm_eps`, which the converter writes as the unused
RMS epsilon, while llama.cpp's graph reads `attention.layer_norm_epsilon`, written only from
`layer_norm_eps`: the expectation comes from `norm_eps`, what the Hugging Face model computes with.
Global layers rotate with the global rope base, the sliding-window layers with the local one (4.x
`global_rope_theta` / `local_rope_theta`, 5.x `rope_parameters`), both common hyperparameters.
"""

from __future__ import annotations

import gguf

from engine.gates.architectures.base import Architecture
from engine.gates.expectation import Expectation

EPSILON = "modern-bert.attention.layer_norm_epsilon"
CLASSIFIER_POOLING = {"mean": int(gguf.PoolingType.MEAN), "cls": int(gguf.PoolingType.CLS)}


class ModernBert(Architecture, arch="modern-bert"):
    model_arch = gguf.MODEL_ARCH.MODERN_BERT
    hf_architectures = ("ModernBertModel", "ModernBertForMaskedLM", "ModernBertForSequenceClassification")

    def canonical_source_name(self, name: str) -> str:
        return name.removeprefix("model.")

    def expectations(self) -> list[Expectation]:
        config = self.config
        out = [e for e in super().expectations() if e.key != EPSILON]
        eps = config.get("norm_eps", config.get("layer_norm_eps"))
        if eps is not None:
            out.append(Expectation(EPSILON, float(eps), "config.norm_eps (ModernBERT's LayerNorm epsilon)",
                                   is_float=True))
            out.append(Expectation("modern-bert.attention.layer_norm_rms_epsilon", float(eps),
                                   "config.norm_eps (the converter writes it; llama.cpp's graph does not read it)",
                                   is_float=True, optional=True))
        out.append(Expectation("modern-bert.attention.causal", False, "ModernBERT attends both ways", default=True))
        if config.get("local_attention") is not None:
            out.append(Expectation("modern-bert.attention.sliding_window", int(config["local_attention"]),
                                   "config.local_attention"))
        out.append(Expectation("modern-bert.attention.sliding_window_pattern",
                               int(config.get("global_attn_every_n_layers") or 3),
                               "config.global_attn_every_n_layers", default=3))
        out.append(Expectation("modern-bert.hidden_activation", str(config.get("hidden_activation") or "gelu"),
                               "config.hidden_activation (GELU -> GeGLU, SiLU -> SwiGLU)", default="gelu"))
        out.append(Expectation("modern-bert.rope.scaling.type", "none", "ModernBERT has no rope scaling"))
        if config.get("vocab_size") is not None:
            out.append(Expectation("modern-bert.vocab_size", int(config["vocab_size"]), "config.vocab_size"))
        pooling = config.get("classifier_pooling") or "cls"  # transformers' ModernBertConfig default
        out.append(Expectation("modern-bert.classifier.pooling_type", CLASSIFIER_POOLING.get(str(pooling), pooling),
                               "config.classifier_pooling (pooling before a classifier head; llama.cpp: mean)",
                               default=CLASSIFIER_POOLING["mean"]))
        return out
