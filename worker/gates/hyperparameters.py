"""The architecture keys every decoder or encoder GGUF shares, derived from config.json.

Each key names the config field it comes from and, where llama.cpp's loader falls back to a value
when the key is absent, that default (an absent key is accepted only if the source's value equals
it). Rope scaling is derived for the kinds whose GGUF form is fixed (linear, yarn); any other
scaling kind leaves its keys underivable, which the metadata check reports by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.gates.expectation import Expectation

ROPE_FREQ_BASE_DEFAULT = 10000.0


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """Rope settings from either config form: `rope_scaling` + `rope_theta`, or one `rope_parameters` dict."""
    params = dict(config.get("rope_parameters") or {})
    params = dict(params.get("full_attention", params))
    params.update({k: v for k, v in (config.get("rope_scaling") or {}).items() if k not in params})
    if "rope_theta" not in params and "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params["type"]
    return params


def _rope_scaling(arch: str, params: Mapping[str, Any]) -> list[Expectation]:
    kind = params.get("rope_type")
    factor = params.get("factor")
    if kind in (None, "default") or factor is None:
        return []
    origin = f"config rope scaling ({kind})"
    if kind == "linear":
        return [Expectation(f"{arch}.rope.scaling.type", "linear", origin),
                Expectation(f"{arch}.rope.scaling.factor", float(factor), origin, is_float=True)]
    if kind == "yarn":
        out = [Expectation(f"{arch}.rope.scaling.type", "yarn", origin),
               Expectation(f"{arch}.rope.scaling.factor", float(factor), origin, is_float=True),
               Expectation(f"{arch}.rope.scaling.original_context_length",
                           int(params["original_max_position_embeddings"]), origin)]
        for field, key in (("extrapolation_factor", "yarn_ext_factor"), ("beta_fast", "yarn_beta_fast"),
                           ("beta_slow", "yarn_beta_slow")):
            if params.get(field) is not None:
                out.append(Expectation(f"{arch}.rope.scaling.{key}", float(params[field]), origin, is_float=True))
        attn = params.get("attention_factor", params.get("attn_factor"))
        if attn is not None:
            out.append(Expectation(f"{arch}.rope.scaling.yarn_attn_factor", float(attn), origin, is_float=True))
        return out
    return []


def common_hyperparameters(arch: str, config: Mapping[str, Any]) -> list[Expectation]:
    """Block count, widths, heads, norms, rope, experts: what llama.cpp's common hparams loader reads."""
    out: list[Expectation] = []

    def put(key: str, field: str, *, is_float: bool = False, default: Any = None) -> None:
        if config.get(field) is None:
            return
        value = float(config[field]) if is_float else int(config[field])
        kwargs = {"default": default} if default is not None else {}
        out.append(Expectation(f"{arch}.{key}", value, f"config.{field}", is_float=is_float, **kwargs))

    put("block_count", "num_hidden_layers")
    put("context_length", "max_position_embeddings")
    put("embedding_length", "hidden_size")
    put("feed_forward_length", "intermediate_size")
    put("attention.head_count", "num_attention_heads")
    heads = config.get("num_attention_heads")
    put("attention.head_count_kv", "num_key_value_heads", default=heads)
    put("attention.layer_norm_rms_epsilon", "rms_norm_eps", is_float=True)
    put("attention.layer_norm_epsilon", "layer_norm_eps", is_float=True)
    if config.get("head_dim") is not None and heads:
        natural = int(config["hidden_size"]) // int(heads)
        put("attention.key_length", "head_dim", default=natural)
        put("attention.value_length", "head_dim", default=natural)
    for field in ("num_local_experts", "num_experts", "n_routed_experts"):
        put("expert_count", field)
    for field in ("num_experts_per_tok", "num_experts_per_token"):
        put("expert_used_count", field)
    if config.get("is_causal") is False:
        out.append(Expectation(f"{arch}.attention.causal", False, "config.is_causal", default=True))
    rope = rope_parameters(config)
    if rope.get("rope_theta") is not None:
        out.append(Expectation(f"{arch}.rope.freq_base", float(rope["rope_theta"]), "config.rope_theta",
                               is_float=True, default=ROPE_FREQ_BASE_DEFAULT))
    out.extend(_rope_scaling(arch, rope))
    return out


def underivable_rope_scaling(config: Mapping[str, Any]) -> str | None:
    """The rope scaling kind whose keys are not derived here (llama3, longrope, dynamic...), if any."""
    params = rope_parameters(config)
    kind = params.get("rope_type")
    if kind in (None, "default", "linear", "yarn"):
        return None
    return str(kind)
