"""The architecture keys every decoder or encoder GGUF shares, derived from config.json.

Each key names the config field it comes from and, where llama.cpp's loader falls back to a value
when the key is absent, that default (an absent key is accepted only if the source's value equals
it). Rope scaling is derived for the kinds whose GGUF form is fixed (linear, yarn); any other
scaling kind leaves its keys underivable, which the metadata check reports by name.

Configs come in two generations, and both are read as llama.cpp's converter reads them: transformers 4
writes `rope_theta`, `rope_scaling`, `rope_local_base_freq` / `local_rope_theta` and `num_experts`;
transformers 5 writes one `rope_parameters` dict (per layer type, `full_attention` and
`sliding_attention`, where a model has both) and `num_local_experts`. A key whose field is absent is
never guessed: transformers 4 reading a 5-written config silently took its defaults (rope base 10000,
128 experts) and built another model than the one converted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.gates.expectation import Expectation

ROPE_FREQ_BASE_DEFAULT = 10000.0


# The field names the converter looks for, in its order (conversion/base.py, ModelBase.__init__).
GLOBAL_THETA_FIELDS = ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base")
LOCAL_THETA_FIELDS = ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                      "rope_local_base_freq")
EXPERT_COUNT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def first_field(config: Mapping[str, Any], fields: tuple[str, ...]) -> Any:
    """The first of `fields` present (and not null) in `config`, as the converter's find_hparam reads them."""
    return next((config[f] for f in fields if config.get(f) is not None), None)


def converter_rope(config: Mapping[str, Any]) -> dict[str, Any]:
    """The converter's `rope_parameters`: the config's own (5.x) or its `rope_scaling` (4.x), with the global
    and sliding-window bases and the other loose fields mirrored in when it has no per-layer-type entries."""
    params = {k: (dict(v) if isinstance(v, Mapping) else v)
              for k, v in dict(config.get("rope_parameters") or config.get("rope_scaling") or {}).items()}
    if "full_attention" not in params and "sliding_attention" not in params:
        if (local := first_field(config, LOCAL_THETA_FIELDS)) is not None:
            params["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in params and (theta := first_field(config, GLOBAL_THETA_FIELDS)) is not None:
            params["rope_theta"] = theta
        if "rope_type" not in params and params.get("type") is not None:
            params["rope_type"] = params["type"]
        for field in ("partial_rotary_factor", "original_max_position_embeddings"):
            if field not in params and config.get(field) is not None:
                params[field] = config[field]
    return params


def rope_parameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """The rope settings of the global (full-attention) layers, which the converter writes unsuffixed."""
    params = converter_rope(config)
    return dict(params.get("full_attention", params))


def rope_theta_origin(config: Mapping[str, Any]) -> str:
    """Where the global rope base was read: the config key, so a report names what to fix."""
    own = config.get("rope_parameters") or config.get("rope_scaling")
    if isinstance(own, Mapping):
        name = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
        if isinstance(own.get("full_attention"), Mapping) and "rope_theta" in own["full_attention"]:
            return f"config.{name}.full_attention.rope_theta"
        if "rope_theta" in own:
            return f"config.{name}.rope_theta"
    field = next((f for f in GLOBAL_THETA_FIELDS if config.get(f) is not None), "rope_theta")
    return f"config.{field}"


def sliding_rope_theta(config: Mapping[str, Any]) -> float | None:
    """The sliding-window layers' rope base, which the converter writes as `rope.freq_base_swa`."""
    theta = (converter_rope(config).get("sliding_attention") or {}).get("rope_theta")
    return None if theta is None else float(theta)


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
    if (experts := first_field(config, EXPERT_COUNT_FIELDS)) is not None:
        field = next(f for f in EXPERT_COUNT_FIELDS if config.get(f) is not None)
        out.append(Expectation(f"{arch}.expert_count", int(experts), f"config.{field}"))
    for field in ("num_experts_per_tok", "num_experts_per_token"):
        put("expert_used_count", field)
    if config.get("is_causal") is False:
        out.append(Expectation(f"{arch}.attention.causal", False, "config.is_causal", default=True))
    rope = rope_parameters(config)
    if rope.get("rope_theta") is not None:
        out.append(Expectation(f"{arch}.rope.freq_base", float(rope["rope_theta"]), rope_theta_origin(config),
                               is_float=True, default=ROPE_FREQ_BASE_DEFAULT))
    if (swa := sliding_rope_theta(config)) is not None:
        global_theta = float(rope.get("rope_theta") or ROPE_FREQ_BASE_DEFAULT)
        out.append(Expectation(f"{arch}.rope.freq_base_swa", swa, "config rope theta of the sliding-window layers",
                               is_float=True, default=global_theta))
    out.extend(_rope_scaling(arch, rope))
    return out


def underivable_rope_scaling(config: Mapping[str, Any]) -> str | None:
    """The rope scaling kind whose keys are not derived here (llama3, longrope, dynamic...), if any."""
    params = rope_parameters(config)
    kind = params.get("rope_type")
    if kind in (None, "default", "linear", "yarn"):
        return None
    return str(kind)
