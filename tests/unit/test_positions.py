"""Which positions gate 2 compares a causal LM at: the first ones of every text, and on a longer text the
batch holding each sliding window's edge, the original context of rope scaling and the text's end, in whole
decode batches; and what the report then says was reached and what was not."""

from __future__ import annotations

import pytest

from engine.gates.runtime.positions import (
    LONG_CONTEXT_BYTES,
    LONG_CONTEXT_CAP,
    LONG_CONTEXT_WORK,
    Marks,
    bytes_per_token,
    coverage,
    layer_weights,
    long_context_tokens,
    marks,
    position_gaps,
    spans,
)

GEMMA3 = {"sliding_window": 512, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
          "max_position_embeddings": 32768, "rope_parameters": {
              "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
              "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
LLAMA31 = {"max_position_embeddings": 131072, "rope_parameters": {
    "rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "rope_theta": 5e5}}


@pytest.mark.parametrize(("config", "expected"), [
    (GEMMA3, Marks((512,), None, 32768)),
    (LLAMA31, Marks((), 8192, 131072)),
    ({"sliding_window": 4096, "max_position_embeddings": 32768}, Marks((4096,), None, 32768)),  # Mistral: every layer
    ({"sliding_window": 4096, "use_sliding_window": False, "max_position_embeddings": 32768}, Marks((), None, 32768)),
    ({"sliding_window": 4096, "layer_types": ["full_attention"], "max_position_embeddings": 512}, Marks((), None, 512)),
    ({"sliding_window": None, "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 4096},
      "max_position_embeddings": 16384}, Marks((), 4096, 16384)),
    ({"text_config": {"sliding_window": 1024, "layer_types": ["sliding_attention"], "max_position_embeddings": 8192}},
     Marks((1024,), None, 8192)),
    ({"sliding_window": 4096, "max_position_embeddings": 512}, Marks((), None, 512)),  # wider than the context
    ({"sliding_window": True, "max_position_embeddings": "x"}, Marks((), None, 0)),
], ids=["gemma3", "llama3.1", "mistral", "qwen2-off", "full-only", "yarn", "multimodal", "too-wide", "garbled"])
def test_marks_read_from_the_config(config, expected):
    assert marks(config) == expected


def test_a_short_text_is_compared_on_its_first_positions_only():
    assert spans(100, 256, 64, Marks((512,), 8192, 32768)) == [(0, 100)]
    assert spans(256, 256, 64, Marks((512,), None, 32768)) == [(0, 256)]


def test_a_long_text_is_compared_past_each_edge_and_at_its_end_in_whole_batches():
    found = Marks((512, 4096), 2048, 32768)
    # each window's edge and the first position a whole window past it (1024; 8192 is past the text)
    assert spans(5000, 256, 64, found) == [(0, 256), (512, 576), (1024, 1088), (2048, 2112), (4096, 4160),
                                           (4992, 5000)]
    assert spans(600, 256, 64, found) == [(0, 256), (512, 600)]  # the window's batch is the last one
    assert spans(300, 300, 256, Marks((), None, 0)) == [(0, 300)]
    assert spans(700, 300, 256, Marks((), None, 0)) == [(0, 700)]  # first positions rounded up, then the end


def test_coverage_names_what_was_crossed_and_what_was_not():
    found = Marks((512, 4096), 2048, 8192)
    reached = coverage([[(0, 256)], [(0, 256), (512, 576), (2048, 2112)]], found)
    assert (reached.longest_position, reached.windows_crossed, reached.windows_not_crossed,
            reached.original_context_crossed) == (2111, (512,), (4096,), True)
    gaps = position_gaps({"windows": [512, 4096], "windows_crossed": [512], "original_context": 2048,
                          "original_context_crossed": True, "longest_position": 2111, "trained_context": 8192})
    assert gaps == ["positions past the sliding window of 4096 tokens (no text was compared there)",
                    "positions past 2112 (the model is trained for 8192): the long text stops at the policy's "
                    "long_context_tokens or what the pod affords"]
    assert position_gaps({"windows": [], "windows_crossed": [], "original_context": None,
                          "original_context_crossed": None, "longest_position": 8191, "trained_context": 8192}) == []


SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "max_position_embeddings": 8192}
LLAMA2_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 32, "max_position_embeddings": 4096}
MISTRAL_7B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "max_position_embeddings": 32768, "sliding_window": 4096}


def test_the_long_text_is_what_the_pod_affords_within_the_trained_context_and_past_every_window():
    assert long_context_tokens(SMOLLM2, 8192, None, 256) == 8192  # 78 KiB a token: the trained context fits
    in_memory = LONG_CONTEXT_BYTES // bytes_per_token(LLAMA2_7B)
    in_time = LONG_CONTEXT_WORK // layer_weights(LLAMA2_7B)
    assert 150 < in_time < 256 < in_memory < 4096  # a 7B pays for one position what SmolLM2 pays for sixty
    assert long_context_tokens(LLAMA2_7B, 4096, None, 128) == in_time // 128 * 128
    assert long_context_tokens(LLAMA2_7B, 4096, None, 256) == 0  # not one batch: no long text
    # a whole window past the window, whatever it costs
    assert long_context_tokens(MISTRAL_7B, 32768, None, 256) == 2 * 4096 + 256
    assert long_context_tokens(SMOLLM2, 2048, None, 256) == 2048  # never past what the file declares
    assert long_context_tokens(SMOLLM2, 8192, 1024, 256) == 1024  # the policy's number
    assert long_context_tokens(SMOLLM2, 512, 1024, 256) == 512


def test_a_small_model_with_a_long_trained_context_stops_at_the_cap_unless_a_policy_asks_for_more():
    gemma3_270m = {"hidden_size": 640, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                   "num_hidden_layers": 18, "intermediate_size": 2048, "max_position_embeddings": 32768,
                   "sliding_window": 512, "layer_types": ["sliding_attention", "full_attention"]}
    assert LONG_CONTEXT_BYTES // bytes_per_token(gemma3_270m) > 3 * LONG_CONTEXT_CAP  # memory alone would allow it
    assert long_context_tokens(gemma3_270m, 32768, None, 64) == LONG_CONTEXT_CAP
    assert long_context_tokens(gemma3_270m, 32768, 32768, 64) == 32768
