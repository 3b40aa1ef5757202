"""How a config's rope, expert and head fields become GGUF expectations, field by field, in both config
generations (engine/gates/hyperparameters.py). Each test states a config llama.cpp's converter reads in one
way, and the expectation (key, value, origin, default) that reading gives; a branch that reads another field,
another default or names another origin changes one of them."""

from __future__ import annotations

from typing import Any

import pytest

from engine.gates.hyperparameters import (
    ROPE_FREQ_BASE_DEFAULT,
    common_hyperparameters,
    converter_rope,
    first_field,
    rope_parameters,
    rope_theta_origin,
    sliding_rope_theta,
    underivable_rope_scaling,
)
from tests.unit.test_metadata_derivations import table


def derived(config: dict[str, Any]) -> dict[str, tuple[Any, str, bool, Any]]:
    """key (without the architecture) -> (expected, origin, is_float, default or None)."""
    return {key.removeprefix("a."): (expected, origin, is_float, default)
            for key, expected, origin, is_float, default, _optional in table(common_hyperparameters("a", config))}


def test_first_field_takes_the_first_present_and_not_null_in_the_converters_order():
    assert first_field({"b": 2, "c": 3}, ("a", "b", "c")) == 2
    assert first_field({"a": None, "c": 3}, ("a", "b", "c")) == 3
    assert first_field({"a": 0}, ("a", "b")) == 0  # zero is a value, not an absence
    assert first_field({}, ("a",)) is None


def test_a_transformers_4_config_mirrors_its_loose_fields_into_the_rope_parameters():
    config = {"rope_theta": 5e5, "rope_local_base_freq": 1e4, "partial_rotary_factor": 0.5,
              "original_max_position_embeddings": 2048, "rope_scaling": {"type": "linear", "factor": 2.0}}
    assert converter_rope(config) == {"type": "linear", "rope_type": "linear", "factor": 2.0, "rope_theta": 5e5,
                                      "sliding_attention": {"rope_theta": 1e4}, "partial_rotary_factor": 0.5,
                                      "original_max_position_embeddings": 2048}
    assert sliding_rope_theta(config) == 1e4
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}  # the config itself is left as it was


def test_a_rope_dicts_own_fields_win_over_the_loose_ones():
    config = {"rope_theta": 1.0, "partial_rotary_factor": 0.25, "original_max_position_embeddings": 1,
              "rope_scaling": {"rope_type": "yarn", "type": "linear", "rope_theta": 2.0, "partial_rotary_factor": 0.75,
                               "original_max_position_embeddings": 2}}
    assert converter_rope(config) == config["rope_scaling"]


def test_a_transformers_5_config_keeps_its_per_layer_type_entries_and_reads_the_full_attention_ones():
    config = {"rope_theta": 1.0, "local_rope_theta": 3.0, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
    assert converter_rope(config) == config["rope_parameters"]  # no loose field is mirrored in
    assert converter_rope(config)["full_attention"] is not config["rope_parameters"]["full_attention"]
    assert rope_parameters(config) == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert sliding_rope_theta(config) == 1e4
    assert rope_theta_origin(config) == "config.rope_parameters.full_attention.rope_theta"
    hyper = derived(config)
    assert hyper["rope.freq_base"] == (1e6, "config.rope_parameters.full_attention.rope_theta", True,
                                       ROPE_FREQ_BASE_DEFAULT)
    assert hyper["rope.freq_base_swa"] == (1e4, "config rope theta of the sliding-window layers", True, 1e6)
    assert hyper["rope.scaling.type"] == ("linear", "config rope scaling (linear)", False, None)
    assert hyper["rope.scaling.factor"] == (8.0, "config rope scaling (linear)", True, None)


@pytest.mark.parametrize(("config", "origin"), [
    ({"rope_parameters": {"rope_theta": 2.0}}, "config.rope_parameters.rope_theta"),
    ({"rope_scaling": {"rope_theta": 2.0}}, "config.rope_scaling.rope_theta"),
    ({"rope_scaling": {"full_attention": {"rope_theta": 2.0}}}, "config.rope_scaling.full_attention.rope_theta"),
    ({"rope_scaling": {"full_attention": {"factor": 2.0}}, "rope_theta": 2.0}, "config.rope_theta"),
    ({"rope_scaling": {"factor": 2.0}, "rotary_emb_base": 2.0}, "config.rotary_emb_base"),
    ({"rope_global_theta": 2.0, "rope_theta": 3.0}, "config.rope_global_theta"),
    ({"rope_theta": None, "rotary_emb_base": 2.0}, "config.rotary_emb_base"),
    ({}, "config.rope_theta"),
])
def test_the_rope_bases_origin_names_the_field_it_was_read_from(config, origin):
    assert rope_theta_origin(config) == origin


def test_the_sliding_base_defaults_to_the_global_one_or_llamas_when_there_is_none():
    assert derived({"rope_theta": 5.0, "swa_rope_theta": 7})["rope.freq_base_swa"][1:] == (
        "config rope theta of the sliding-window layers", True, 5.0)
    alone = derived({"rope_local_theta": 7})
    assert alone["rope.freq_base_swa"] == (7.0, "config rope theta of the sliding-window layers", True,
                                           ROPE_FREQ_BASE_DEFAULT)
    assert "rope.freq_base" not in alone
    assert sliding_rope_theta({"rope_theta": 5.0}) is None


def test_yarn_reads_every_field_and_the_older_attention_factors_name():
    hyper = derived({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 4096.0,
                                      "beta_slow": 2, "attn_factor": 0.5}})
    origin = "config rope scaling (yarn)"
    assert hyper == {"rope.scaling.type": ("yarn", origin, False, None),
                     "rope.scaling.factor": (4.0, origin, True, None),
                     "rope.scaling.original_context_length": (4096, origin, False, None),
                     "rope.scaling.yarn_beta_slow": (2.0, origin, True, None),
                     "rope.scaling.yarn_attn_factor": (0.5, origin, True, None)}
    assert isinstance(hyper["rope.scaling.original_context_length"][0], int)
    both = derived({"rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 1,
                                     "attention_factor": 0.25, "attn_factor": 0.5}})
    assert both["rope.scaling.yarn_attn_factor"][0] == 0.25  # the newer name first


@pytest.mark.parametrize("scaling", [{"rope_type": "default", "factor": 2.0}, {"rope_type": "linear"},
                                     {"rope_type": "llama3", "factor": 8.0}, {"factor": 2.0}])
def test_no_scaling_keys_without_a_kind_and_factor_derived_here(scaling):
    assert not any(key.startswith("rope.scaling") for key in derived({"rope_scaling": scaling}))


@pytest.mark.parametrize(("scaling", "named"), [
    ({"rope_type": "llama3"}, "llama3"), ({"type": "longrope"}, "longrope"), ({"rope_type": "dynamic"}, "dynamic"),
    ({"rope_type": "default"}, None), ({"rope_type": "linear"}, None), ({"rope_type": "yarn"}, None), ({}, None)])
def test_an_underivable_scaling_kind_is_named(scaling, named):
    assert underivable_rope_scaling({"rope_scaling": scaling}) == named


def test_heads_and_head_widths_default_as_llama_cpps_loader_does():
    hyper = derived({"hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32})
    assert hyper["attention.head_count_kv"] == (4, "config.num_key_value_heads", False, 4)
    assert hyper["attention.key_length"] == (32, "config.head_dim", False, 24)
    assert hyper["attention.value_length"] == (32, "config.head_dim", False, 24)
    assert hyper["embedding_length"] == (96, "config.hidden_size", False, None)
    without_heads = derived({"hidden_size": 96, "head_dim": 32})
    assert "attention.key_length" not in without_heads and "attention.value_length" not in without_heads


def test_integers_and_floats_are_read_as_the_loader_stores_them():
    hyper = derived({"num_hidden_layers": 2.0, "rms_norm_eps": 1, "layer_norm_eps": None})
    assert hyper == {"block_count": (2, "config.num_hidden_layers", False, None),
                     "attention.layer_norm_rms_epsilon": (1.0, "config.rms_norm_eps", True, None)}
    assert isinstance(hyper["block_count"][0], int) and isinstance(hyper["attention.layer_norm_rms_epsilon"][0], float)


@pytest.mark.parametrize(("config", "field"), [
    ({"num_local_experts": 8, "num_experts": 4}, "num_local_experts"),
    ({"num_experts": 4, "n_routed_experts": 2}, "num_experts"),
    ({"num_local_experts": None, "n_routed_experts": 2}, "n_routed_experts"),
])
def test_the_expert_count_comes_from_the_first_generations_field(config, field):
    assert derived(config)["expert_count"] == (config[field], f"config.{field}", False, None)


def test_experts_used_and_causality():
    assert derived({"num_experts_per_token": 2})["expert_used_count"] == (2, "config.num_experts_per_token", False,
                                                                           None)
    assert derived({"is_causal": False})["attention.causal"] == (False, "config.is_causal", False, True)
    assert "attention.causal" not in derived({"is_causal": True})
    assert "attention.causal" not in derived({"is_causal": None})
    assert derived({}) == {}
