"""The metadata check on small hand-written sources: fast, exact, one rule per test."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from engine.formats.ggml_types import GGML_TYPES_BY_NAME, ValueType
from engine.formats.gguf_structure import GGUFArray, GGUFLayout, TensorInfo
from engine.formats.source import SourceModel
from engine.gates.architectures import architecture_for
from engine.gates.hyperparameters import common_hyperparameters, rope_parameters, underivable_rope_scaling
from engine.gates.storage.metadata_check import MetadataOutcome, check_metadata
from engine.gates.storage.metadata_keys import disposition
from engine.gates.storage.tokenizer_metadata import (
    TokenizerFiles,
    expected_flags,
    ggml_model,
    merges,
    pair_middle,
    special_ids,
    vocabulary,
)

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 6}
BPE_TOKENIZER = {
    "model": {"type": "BPE", "byte_fallback": False, "vocab": {"a": 0, "b": 1, "ab": 2, "c d": 3},
              "merges": [["a", "b"], ["c", " d"]]},
    "added_tokens": [{"id": 4, "content": "<|end|>", "special": True}, {"id": 5, "content": "hi", "special": False}],
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<|end|>"}}],
                       "pair": [{"Sequence": {"id": "A"}}, {"SpecialToken": {"id": "<|end|>"}},
                                {"Sequence": {"id": "B"}}, {"SpecialToken": {"id": "<|end|>"}}],
                       "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [4], "tokens": ["<|end|>"]}}},
}
HONEST_LLAMA = {
    "general.architecture": "llama", "general.name": "tiny", "general.license": "mit", "general.file_type": 1,
    "llama.block_count": 2, "llama.context_length": 256, "llama.embedding_length": 64,
    "llama.feed_forward_length": 128, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
    "llama.attention.layer_norm_rms_epsilon": 9.999999747378752e-06, "llama.rope.freq_base": 10000.0,
    "llama.rope.dimension_count": 16, "llama.vocab_size": 6,
    "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default",
    "tokenizer.ggml.tokens": ["a", "b", "ab", "c d", "<|end|>", "hi"],
    "tokenizer.ggml.token_type": [1, 1, 1, 1, 3, 4],
    "tokenizer.ggml.merges": ["a b", "c Ġd"],
    "tokenizer.ggml.eos_token_id": 4, "tokenizer.ggml.add_eos_token": True, "tokenizer.ggml.add_bos_token": False,
}


def source(tmp_path: Path, config: dict[str, Any], tokenizer: dict[str, Any] | None = None,
           tokenizer_config: dict[str, Any] | None = None) -> SourceModel:
    if tokenizer is not None:
        (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config or {"eos_token": "<|end|>"}))
    return SourceModel(root=tmp_path, config=config, tensors={})


def layout(metadata: dict[str, Any]) -> GGUFLayout:
    return GGUFLayout(path=Path("x.gguf"), version=3, alignment=32, metadata=metadata, tensors=(), data_offset=0,
                      file_size=0)


def run(tmp_path: Path, metadata: dict[str, Any], config: dict[str, Any] | None = None,
        tokenizer: dict[str, Any] | None = BPE_TOKENIZER) -> MetadataOutcome:
    src = source(tmp_path, config or LLAMA_CONFIG, tokenizer)
    arch = architecture_for(str(metadata.get("general.architecture", "llama")), src.config)
    assert arch is not None
    return check_metadata(arch, layout(metadata), src)


def blocked(outcome: MetadataOutcome) -> dict[str, str]:
    return {str(b.key): b.code for b in outcome.blockers}


def test_an_honest_file_passes_and_names_what_it_did_not_derive(tmp_path):
    outcome = run(tmp_path, HONEST_LLAMA)
    assert outcome.blockers == []
    assert all(check.result == "ok" for check in outcome.checks)
    assert any("tokenizer.ggml.pre" in line for line in outcome.not_verified)
    assert any("general.file_type" in line for line in outcome.not_verified)
    assert "2 descriptive general.* keys (names, licence, datasets) are not compared" in outcome.not_verified
    assert not any("add_eos_token" in line for line in outcome.not_verified)  # judged, not merely listed


@pytest.mark.parametrize(("key", "value", "code"), [
    ("llama.block_count", 3, "metadata.mismatch"),
    ("llama.rope.freq_base", 10001.0, "metadata.mismatch"),
    ("llama.attention.layer_norm_rms_epsilon", 1.0000001e-05, "metadata.mismatch"),
    ("llama.rope.dimension_count", 8, "metadata.mismatch"),
    ("llama.vocab_size", 7, "metadata.mismatch"),
    ("general.architecture", "llama", None),
    ("tokenizer.ggml.model", "llama", "metadata.mismatch"),
    ("tokenizer.ggml.eos_token_id", 5, "metadata.mismatch"),
    ("llama.expert_count", 4, "metadata.unexpected_key"),
    ("llama.rope.scaling.type", "linear", "metadata.unexpected_key"),
    ("some.vendor.key", 1, "metadata.unexpected_key"),
])
def test_each_changed_or_planted_key_is_named(tmp_path, key, value, code):
    outcome = run(tmp_path, {**HONEST_LLAMA, key: value})
    named = {(b.key, b.code) for b in outcome.blockers}
    assert (key, code) in named if code else not named


def test_floats_compare_at_float32(tmp_path):
    """1e-5 as float32 is 9.999999747378752e-06: equal, not a mismatch; a one-ulp change is."""
    assert blocked(run(tmp_path, {**HONEST_LLAMA, "llama.attention.layer_norm_rms_epsilon": 1e-5})) == {}
    assert blocked(run(tmp_path, {**HONEST_LLAMA, "llama.attention.layer_norm_rms_epsilon": 1.00000005e-5})) == {
        "llama.attention.layer_norm_rms_epsilon": "metadata.mismatch"}


def test_a_boolean_is_not_an_integer(tmp_path):
    config = {**LLAMA_CONFIG, "is_causal": False}
    outcome = run(tmp_path, {**HONEST_LLAMA, "llama.attention.causal": 0}, config=config)
    assert blocked(outcome) == {"llama.attention.causal": "metadata.wrong_type"}  # an integer where a bool goes
    assert blocked(run(tmp_path, {**HONEST_LLAMA, "llama.attention.causal": False}, config=config)) == {}


def test_absent_keys_pass_only_where_llama_cpp_defaults_to_the_source_value(tmp_path):
    without = {k: v for k, v in HONEST_LLAMA.items() if k not in ("llama.rope.freq_base", "llama.vocab_size")}
    assert blocked(run(tmp_path, without)) == {}  # default 10000 == rope_theta; vocab_size is optional
    other_theta = {**LLAMA_CONFIG, "rope_theta": 500000.0}
    assert blocked(run(tmp_path, without, config=other_theta)) == {"llama.rope.freq_base": "metadata.missing"}
    no_blocks = {k: v for k, v in HONEST_LLAMA.items() if k != "llama.block_count"}
    assert blocked(run(tmp_path, no_blocks)) == {"llama.block_count": "metadata.missing"}


def test_arrays_report_where_they_first_differ(tmp_path):
    tokens = ["a", "ab", "b", "c d", "<|end|>", "hi"]
    outcome = run(tmp_path, {**HONEST_LLAMA, "tokenizer.ggml.tokens": GGUFArray(ValueType.STRING, tuple(tokens))})
    (blocker,) = outcome.blockers
    assert blocker.key == "tokenizer.ggml.tokens"
    assert "2 of 6 entries differ" in blocker.why and "[1] is 'ab', expected 'b'" in blocker.why
    shorter = run(tmp_path, {**HONEST_LLAMA, "tokenizer.ggml.token_type": [1, 1, 1, 1, 3]})
    assert "length 5, expected 6" in shorter.blockers[0].why


def test_an_unreadable_architecture_name_is_named(tmp_path):
    config = {**LLAMA_CONFIG, "architectures": ["GPTNeoXForCausalLM"]}
    assert blocked(run(tmp_path, HONEST_LLAMA, config=config)) == {"general.architecture": "metadata.mismatch"}


def test_without_a_tokenizer_the_gap_is_named(tmp_path):
    honest = {k: v for k, v in HONEST_LLAMA.items() if not k.startswith("tokenizer.")}
    outcome = run(tmp_path, honest, tokenizer=None)
    assert outcome.blockers == []
    assert "tokenizer keys: the source has no tokenizer.json" in outcome.not_verified


@pytest.mark.parametrize(("flags", "flagged"), [
    ({"tokenizer.ggml.add_eos_token": False}, {"tokenizer.ggml.add_eos_token"}),
    ({"tokenizer.ggml.add_bos_token": True}, {"tokenizer.ggml.add_bos_token"}),
    ({"tokenizer.ggml.add_sep_token": True}, {"tokenizer.ggml.add_sep_token"}),
    ({"tokenizer.ggml.add_eos_token": 1}, {"tokenizer.ggml.add_eos_token"}),
])
def test_flags_against_the_template(tmp_path, flags, flagged):
    outcome = run(tmp_path, {**HONEST_LLAMA, **flags})
    assert {b.key for b in outcome.blockers if b.code == "tokenizer.flag_mismatch"} == flagged


def test_flags_absent_are_llama_cpp_defaults(tmp_path):
    """A gpt2 vocabulary adds nothing by default, so a template that appends EOS needs add_eos_token."""
    without = {k: v for k, v in HONEST_LLAMA.items() if k != "tokenizer.ggml.add_eos_token"}
    (blocker,) = run(tmp_path, without).blockers
    assert blocker.key == "tokenizer.ggml.add_eos_token" and "default for a 'gpt2' vocabulary" in blocker.why


def test_template_helpers():
    assert pair_middle(BPE_TOKENIZER) == (4,)
    assert pair_middle({"post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}}
                       ) == (102,)
    assert pair_middle({"post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}}
                       ) == (2, 2)
    assert pair_middle({"post_processor": {"type": "ByteLevel"}}) is None
    assert pair_middle({}) is None
    assert expected_flags((1,), (), (1,), None) == {"bos": (1,), "eos": None, "sep": None}  # llama: <s> A <s> B
    assert expected_flags((101,), (102,), (102,), 102) == {"bos": (101,), "eos": (102,), "sep": ()}
    assert expected_flags((), (2,), (2, 3), 3) == {"bos": None, "eos": (2,), "sep": (3,)}
    assert expected_flags((), (2,), (), None)["sep"] is None  # A B </s>: not expressible by the flags
    assert expected_flags((), (), None, None) == {"bos": None, "eos": None, "sep": ()}


def files(tmp_path: Path, tokenizer: dict[str, Any], config: dict[str, Any], model_config: dict[str, Any]
          ) -> TokenizerFiles:
    return TokenizerFiles.read(source(tmp_path, model_config, tokenizer, config))  # type: ignore[return-value]


def test_vocabulary_padding_kinds_and_phantom_space(tmp_path):
    wordpiece = {"model": {"type": "WordPiece", "vocab": {"[CLS]": 0, "hello": 1, "##lo": 2}, "unk_token": "[UNK]"},
                 "added_tokens": [{"id": 0, "content": "[CLS]", "special": True}]}
    tf = files(tmp_path, wordpiece, {"cls_token": "[CLS]"}, {"vocab_size": 5})
    assert ggml_model(tf) == "bert"
    assert vocabulary(tf, "bert") == (["[CLS]", "\u2581hello", "lo", "[PAD3]", "[PAD4]"], [3, 1, 1, 5, 5])
    spm = {"model": {"type": "BPE", "byte_fallback": True, "unk_token": "<unk>",
                     "vocab": {"<unk>": 0, "<0x0A>": 1, "\u2581a": 2, "<tag>": 3}}, "added_tokens": []}
    tf = files(tmp_path, spm, {"unk_token": "<unk>"}, {})
    assert ggml_model(tf) == "llama"
    assert vocabulary(tf, "llama") == (["<unk>", "<0x0A>", "\u2581a", "<tag>"], [2, 6, 1, 1])
    unigram = {"model": {"type": "Unigram", "vocab": [["x", -1.0], ["y", -2.0]]},
               "added_tokens": [{"id": 2, "content": "<|x|>", "special": False}]}
    tf = files(tmp_path, unigram, {}, {})
    assert ggml_model(tf) == "t5"
    assert vocabulary(tf, "t5") == (["x", "y", "<|x|>"], [1, 1, 3])  # looks special: CONTROL


def test_merges_and_special_ids(tmp_path):
    tf = files(tmp_path, BPE_TOKENIZER, {"eos_token": {"content": "<|end|>"}, "pad_token": "missing"},
               {"bos_token_id": 0})
    assert merges(tf) == ["a b", "c \u0120d"]
    assert special_ids(tf) == {"eos": 4, "bos": 0}
    assert merges(files(tmp_path, {"model": {"type": "BPE", "merges": ["a b"]}}, {}, {})) == ["a b"]
    assert merges(files(tmp_path, {"model": {"type": "WordPiece"}}, {}, {})) is None
    bert = files(tmp_path, {"model": {"type": "WordPiece", "vocab": {"[CLS]": 7, "[SEP]": 8}}},
                 {"cls_token": "[CLS]", "sep_token": "[SEP]"}, {})
    assert special_ids(bert) == {"cls": 7, "sep": 8, "bos": 7, "eos": 8}


def test_rope_settings_in_both_config_forms():
    assert rope_parameters({"rope_theta": 5.0, "rope_scaling": {"type": "linear", "factor": 2.0}}) == {
        "type": "linear", "factor": 2.0, "rope_theta": 5.0, "rope_type": "linear"}
    assert rope_parameters({"rope_parameters": {"rope_theta": 7.0, "rope_type": "default"}})["rope_theta"] == 7.0
    linear = common_hyperparameters("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}})
    assert [(e.key, e.expected) for e in linear] == [("llama.rope.scaling.type", "linear"),
                                                     ("llama.rope.scaling.factor", 4.0)]
    yarn = common_hyperparameters("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32,
                                                             "original_max_position_embeddings": 32768}})
    assert {e.key: e.expected for e in yarn} == {
        "qwen3.rope.scaling.type": "yarn", "qwen3.rope.scaling.factor": 4.0,
        "qwen3.rope.scaling.original_context_length": 32768, "qwen3.rope.scaling.yarn_beta_fast": 32.0}
    assert underivable_rope_scaling({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}) == "llama3"
    assert underivable_rope_scaling({"rope_scaling": {"rope_type": "yarn", "factor": 8.0}}) is None


def test_an_underivable_rope_scaling_is_named_not_blocked(tmp_path):
    config = {**LLAMA_CONFIG, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    outcome = run(tmp_path, {**HONEST_LLAMA, "llama.rope.scaling.type": "llama3"}, config=config)
    assert outcome.blockers == []
    assert any("rope scaling 'llama3' is not derived" in line for line in outcome.not_verified)


def test_head_dim_and_experts_are_derived():
    config = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32, "num_local_experts": 8,
              "num_experts_per_tok": 2}
    derived = {e.key: (e.expected, e.default) for e in common_hyperparameters("x", config)}
    assert derived["x.attention.key_length"] == (32, 16)
    assert derived["x.attention.value_length"] == (32, 16)
    assert derived["x.expert_count"][0] == 8 and derived["x.expert_used_count"][0] == 2


def test_dispositions():
    assert disposition("general.name") == "descriptive"
    assert disposition("general.dataset.3.repo_url") == "descriptive"
    assert disposition("general.sampling.temp") is not None
    assert disposition("tokenizer.ggml.add_bos_token") is not None
    assert disposition("general.tensor_extra.name") is None
    assert disposition("llama.block_count") is None


def tensor(name: str, shape: tuple[int, ...]) -> TensorInfo:
    return TensorInfo(name, shape, GGML_TYPES_BY_NAME["F32"], 0, 4)


TENSORS = (tensor("token_embd.weight", (64, 6)), tensor("blk.0.attn_q.weight", (64, 64)),
           tensor("blk.1.attn_q.weight", (64, 64)), tensor("output_norm.weight", (64,)))


def run_with_tensors(tmp_path: Path, metadata: dict[str, Any], tensors=TENSORS) -> MetadataOutcome:
    src = source(tmp_path, LLAMA_CONFIG, BPE_TOKENIZER)
    arch = architecture_for("llama", src.config)
    assert arch is not None
    return check_metadata(arch, dataclasses.replace(layout(metadata), tensors=tensors), src)


def test_every_check_is_reported_with_its_origin(tmp_path):
    """The report's metadata table, whole: key, expected, actual, where the expectation came from."""
    outcome = run_with_tensors(tmp_path, HONEST_LLAMA)
    checks = [(c.key, c.expected, c.actual, c.origin, c.result) for c in outcome.checks]
    assert checks == EXPECTED_CHECKS


def test_the_tensors_present_must_agree_with_the_metadata(tmp_path):
    three_blocks = (*TENSORS, tensor("blk.2.attn_q.weight", (64, 64)))
    outcome = run_with_tensors(tmp_path, HONEST_LLAMA, three_blocks)
    assert [(b.key, b.code) for b in outcome.blockers] == [("llama.block_count", "metadata.mismatch")]
    assert "tensors (blk.N present) says 3" in outcome.blockers[0].why
    wide = (tensor("token_embd.weight", (32, 6)), *TENSORS[1:])
    assert [b.key for b in run_with_tensors(tmp_path, HONEST_LLAMA, wide).blockers] == ["llama.embedding_length"]
    more_rows = (tensor("token_embd.weight", (64, 7)), *TENSORS[1:])
    (blocker,) = run_with_tensors(tmp_path, HONEST_LLAMA, more_rows).blockers
    assert blocker.key == "tokenizer.ggml.tokens" and "tensors (token_embd rows) says 7" in blocker.why


def test_pooling_comes_from_the_sentence_transformers_config(tmp_path):
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Pooling",
                                                        "path": "1_Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    outcome = run(tmp_path, {**HONEST_LLAMA, "llama.pooling_type": 2})
    assert outcome.blockers == [] and "llama.pooling_type" in outcome.compared
    wrong = run(tmp_path, {**HONEST_LLAMA, "llama.pooling_type": 1})
    assert [(b.key, b.code) for b in wrong.blockers] == [("llama.pooling_type", "metadata.pooling_mismatch")]
    assert "1_Pooling/config.json says 2" in wrong.blockers[0].why
    absent = run(tmp_path, HONEST_LLAMA)
    assert [(b.key, b.code) for b in absent.blockers] == [("llama.pooling_type", "metadata.missing")]


def test_long_arrays_are_summarised_short_ones_shown(tmp_path):
    tokens = [f"t{i}" for i in range(20)]
    config = {**LLAMA_CONFIG, "vocab_size": 20}
    tokenizer = {**BPE_TOKENIZER, "model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}},
                 "added_tokens": []}
    meta = {**HONEST_LLAMA, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": [1] * 20,
            "llama.vocab_size": 20}
    meta.pop("tokenizer.ggml.merges")
    outcome = run(tmp_path, meta, config=config, tokenizer=tokenizer)
    by_key = {c.key: c for c in outcome.checks}
    assert by_key["tokenizer.ggml.tokens"].expected.startswith("20 items, sha256:")
    assert by_key["tokenizer.ggml.tokens"].expected == by_key["tokenizer.ggml.tokens"].actual
    assert by_key["tokenizer.ggml.model"].expected == "gpt2"


EXPECTED_CHECKS: list[tuple[str, Any, Any, str, str]] = [
    ('general.architecture', 'llama', 'llama',
     "config.architectures ('LlamaForCausalLM', 'LlamaModel', 'MistralForCausalLM')", 'ok'),
    ('llama.block_count', 2, 2, 'config.num_hidden_layers', 'ok'),
    ('llama.context_length', 256, 256, 'config.max_position_embeddings', 'ok'),
    ('llama.embedding_length', 64, 64, 'config.hidden_size', 'ok'),
    ('llama.feed_forward_length', 128, 128, 'config.intermediate_size', 'ok'),
    ('llama.attention.head_count', 4, 4, 'config.num_attention_heads', 'ok'),
    ('llama.attention.head_count_kv', 2, 2, 'config.num_key_value_heads', 'ok'),
    ('llama.attention.layer_norm_rms_epsilon', 1e-05, 9.999999747378752e-06, 'config.rms_norm_eps', 'ok'),
    ('llama.rope.freq_base', 10000.0, 10000.0, 'config.rope_theta', 'ok'),
    ('llama.rope.dimension_count', 16, 16, 'config.head_dim (or hidden_size / heads)', 'ok'),
    ('llama.vocab_size', 6, 6, 'config.vocab_size', 'ok'),
    ('llama.block_count', 2, 2, 'tensors (blk.N present)', 'ok'),
    ('llama.embedding_length', 64, 64, 'tensors (token_embd width)', 'ok'),
    ('tokenizer.ggml.tokens', 6, ['a', 'b', 'ab', 'c d', '<|end|>', 'hi'], 'tensors (token_embd rows)', 'ok'),
    ('tokenizer.ggml.model', 'gpt2', 'gpt2', 'tokenizer.json model.type', 'ok'),
    ('tokenizer.ggml.tokens', ['a', 'b', 'ab', 'c d', '<|end|>', 'hi'],
     ['a', 'b', 'ab', 'c d', '<|end|>', 'hi'], 'tokenizer.json vocab + added_tokens, padded to vocab_size',
     'ok'),
    ('tokenizer.ggml.token_type', [1, 1, 1, 1, 3, 4], [1, 1, 1, 1, 3, 4], 'tokenizer.json token kinds', 'ok'),
    ('tokenizer.ggml.merges', ['a b', 'c Ġd'], ['a b', 'c Ġd'], 'tokenizer.json model.merges', 'ok'),
    ('tokenizer.ggml.eos_token_id', 4, 4, 'tokenizer_config.json eos_token', 'ok'),
]
