"""What the metadata check derives, whole: every expectation with its origin, float-ness, llama.cpp
default and optionality, and every flag finding with its message. A derivation that silently drops or
alters a field changes one of these tables."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from engine.errors import SourceError
from engine.gates.expectation import NO_DEFAULT, Expectation
from engine.gates.hyperparameters import common_hyperparameters
from engine.gates.storage.tokenizer_metadata import TokenizerFiles, flag_findings, lowercases, tokenizer_expectations
from tests.unit.test_metadata_check import BPE_TOKENIZER, HONEST_LLAMA, LLAMA_CONFIG, source

FULL_CONFIG = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "layer_norm_eps": 1e-12,
    "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2, "is_causal": False, "rope_theta": 1e6,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                     "extrapolation_factor": 1.0, "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 0.5},
}


def table(expectations: list[Expectation]) -> list[tuple[Any, ...]]:
    return [(e.key, e.expected, e.origin, e.is_float, None if e.default is NO_DEFAULT else e.default, e.optional)
            for e in expectations]


def files(tmp_path: Path) -> TokenizerFiles:
    src = source(tmp_path, LLAMA_CONFIG, BPE_TOKENIZER, {"eos_token": "<|end|>", "chat_template": "{{ x }}"})
    read = TokenizerFiles.read(src)
    assert read is not None
    return read


def test_every_hyperparameter_with_its_origin_and_default():
    assert table(common_hyperparameters("x", FULL_CONFIG)) == HYPER


def test_every_tokenizer_key_with_its_origin(tmp_path):
    assert table(tokenizer_expectations(files(tmp_path))) == TOKENIZER


def test_flag_findings_and_the_details_reported(tmp_path):
    tf = files(tmp_path)
    for edit, expected in (({"tokenizer.ggml.add_bos_token": True}, FLAGS_bos_set),
                           ({"tokenizer.ggml.add_eos_token": False}, FLAGS_eos_off),
                           ({"tokenizer.ggml.eos_token_id": 5}, FLAGS_eos_id)):
        findings, details = flag_findings(tf, {**HONEST_LLAMA, **edit})
        assert ([(f.flag, f.why) for f in findings], details) == expected


def test_lowercase_normalisers_are_recognised_wherever_they_sit(tmp_path):
    def lowers(normalizer: Any) -> bool:
        return lowercases(files(tmp_path).__class__({"normalizer": normalizer}, {}, {}, None))

    assert lowers({"type": "Lowercase"})
    assert lowers({"type": "BertNormalizer", "lowercase": True})
    assert not lowers({"type": "BertNormalizer", "lowercase": False})
    assert lowers({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]})
    assert not lowers({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip"}]})
    assert not lowers({"type": "NFC"}) and not lowers(None) and not lowers("Lowercase")


def test_the_tokenizer_files_are_read_with_their_template(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{{ jinja }}", encoding="utf-8")
    src = source(tmp_path, LLAMA_CONFIG, BPE_TOKENIZER, {"eos_token": "<|end|>"})
    read = TokenizerFiles.read(src)
    assert read is not None and read.chat_template == "{{ jinja }}" and read.config == {"eos_token": "<|end|>"}
    assert read.model_config == LLAMA_CONFIG and read.tokenizer["model"]["type"] == "BPE"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x"}]}))
    assert TokenizerFiles.read(src).chat_template == "{{ jinja }}"  # type: ignore[union-attr]  # read once per opening
    assert TokenizerFiles.read(replace(src)).chat_template is None  # type: ignore[union-attr]  # a new opening
    (tmp_path / "tokenizer.json").write_text("[]")
    with pytest.raises(SourceError, match=r"tokenizer\.json is not a JSON object"):  # refused, not "absent"
        TokenizerFiles.read(replace(src))
    (tmp_path / "tokenizer.json").unlink()
    assert TokenizerFiles.read(replace(src)) is None


HYPER = [('x.block_count', 2, 'config.num_hidden_layers', False, None, False),
 ('x.context_length', 256, 'config.max_position_embeddings', False, None, False),
 ('x.embedding_length', 64, 'config.hidden_size', False, None, False),
 ('x.feed_forward_length', 128, 'config.intermediate_size', False, None, False),
 ('x.attention.head_count', 4, 'config.num_attention_heads', False, None, False),
 ('x.attention.head_count_kv', 2, 'config.num_key_value_heads', False, 4, False),
 ('x.attention.layer_norm_rms_epsilon', 1e-05, 'config.rms_norm_eps', True, None, False),
 ('x.attention.layer_norm_epsilon', 1e-12, 'config.layer_norm_eps', True, None, False),
 ('x.attention.key_length', 32, 'config.head_dim', False, 16, False),
 ('x.attention.value_length', 32, 'config.head_dim', False, 16, False),
 ('x.expert_count', 8, 'config.num_experts', False, None, False),
 ('x.expert_used_count', 2, 'config.num_experts_per_tok', False, None, False),
 ('x.attention.causal', False, 'config.is_causal', False, True, False),
 ('x.rope.freq_base', 1000000.0, 'config.rope_theta', True, 10000.0, False),
 ('x.rope.scaling.type', 'yarn', 'config rope scaling (yarn)', False, None, False),
 ('x.rope.scaling.factor', 4.0, 'config rope scaling (yarn)', True, None, False),
 ('x.rope.scaling.original_context_length', 4096, 'config rope scaling (yarn)', False, None, False),
 ('x.rope.scaling.yarn_ext_factor', 1.0, 'config rope scaling (yarn)', True, None, False),
 ('x.rope.scaling.yarn_beta_fast', 32.0, 'config rope scaling (yarn)', True, None, False),
 ('x.rope.scaling.yarn_beta_slow', 1.0, 'config rope scaling (yarn)', True, None, False),
 ('x.rope.scaling.yarn_attn_factor', 0.5, 'config rope scaling (yarn)', True, None, False)]

TOKENIZER = [('tokenizer.ggml.model', 'gpt2', 'tokenizer.json model.type', False, None, False),
 ('tokenizer.ggml.tokens',
  ['a', 'b', 'ab', 'c d', '<|end|>', 'hi'],
  'tokenizer.json vocab + added_tokens, padded to vocab_size',
  False,
  None,
  False),
 ('tokenizer.ggml.token_type', [1, 1, 1, 1, 3, 4], 'tokenizer.json token kinds', False, None, False),
 ('tokenizer.ggml.merges', ['a b', 'c Ġd'], 'tokenizer.json model.merges', False, None, False),
 ('tokenizer.ggml.eos_token_id', 4, 'tokenizer_config.json eos_token', False, None, True),
 ('tokenizer.chat_template', '{{ x }}', 'tokenizer_config.json chat_template', False, None, False)]

FLAGS_bos_set = ([('tokenizer.ggml.add_bos_token',
   'add_bos_token is True (the GGUF key) but the Hugging Face template adds no BOS (single: prefix [], suffix '
   '[4]; pair middle [4])')],
 {'template': {'prefix': [], 'suffix': [4], 'pair_middle': [4]},
  'gguf_flags': {'bos': True, 'eos': True, 'sep': None},
  'effective_flags': {'bos': True, 'eos': True, 'sep': False},
  'model': 'gpt2',
  'expected': {'bos': None, 'eos': [4], 'sep': []}})

FLAGS_eos_off = ([('tokenizer.ggml.add_eos_token',
   'add_eos_token is False (the GGUF key) but the Hugging Face template adds [4] (single: prefix [], suffix '
   '[4]; pair middle [4])')],
 {'template': {'prefix': [], 'suffix': [4], 'pair_middle': [4]},
  'gguf_flags': {'bos': False, 'eos': False, 'sep': None},
  'effective_flags': {'bos': False, 'eos': False, 'sep': False},
  'model': 'gpt2',
  'expected': {'bos': None, 'eos': [4], 'sep': []}})

FLAGS_eos_id = ([('tokenizer.ggml.eos_token_id', 'add_eos_token adds token 5, the Hugging Face template adds [4]')],
 {'template': {'prefix': [], 'suffix': [4], 'pair_middle': [4]},
  'gguf_flags': {'bos': False, 'eos': True, 'sep': None},
  'effective_flags': {'bos': False, 'eos': True, 'sep': False},
  'model': 'gpt2',
  'expected': {'bos': None, 'eos': [4], 'sep': []}})


def test_what_looks_like_a_special_token():
    from engine.gates.storage.tokenizer_metadata import _looks_special

    for token, special in (("<|endoftext|>", True), ("<tag>", True), ("<|x>", True), ("<a b>", False),
                           ("<é>", False), ("x>", False), ("<x", False), ("|>", False), ("<|", False),
                           ("plain", False)):
        assert _looks_special(token) is special, token


def test_unknown_token_from_the_model_and_vocabulary_size_from_the_ids(tmp_path):
    from engine.gates.storage.tokenizer_metadata import special_ids, vocabulary

    wordpiece = {"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1, "b": 3}},
                 "added_tokens": [{"id": 5, "content": "[X]", "special": True}]}
    tf = files_for(tmp_path, wordpiece, {}, {})
    assert special_ids(tf) == {"unk": 0}
    assert vocabulary(tf, "gpt2") == (["[UNK]", "a", "[PAD2]", "b", "[PAD4]", "[X]"], [1, 1, 5, 1, 5, 3])
    missing_unk = {"model": {"type": "WordPiece", "unk_token": "[NOPE]", "vocab": {"a": 0}}}
    assert special_ids(files_for(tmp_path, missing_unk, {}, {})) == {}
    assert vocabulary(files_for(tmp_path, {"model": {"type": "BPE", "vocab": {}}}, {}, {}), "gpt2") == ([], [])
    small = files_for(tmp_path, {"model": {"type": "BPE", "vocab": {"a": 0}},
                                 "added_tokens": [{"id": 3, "content": "<s>", "special": True}]}, {}, {"vocab_size": 2})
    assert vocabulary(small, "gpt2") == (["a", "[PAD1]", "[PAD2]", "<s>"], [1, 5, 5, 3])
    spm = files_for(tmp_path, {"model": {"type": "BPE", "byte_fallback": True,
                                         "vocab": {"<0x0A>": 0, "<0x0AB>": 1, "0x0A>": 2}}}, {}, {})
    assert vocabulary(spm, "llama")[1] == [6, 1, 1]


def test_a_bert_tokenizer_derives_its_type_count_and_lowercase(tmp_path):
    wordpiece = {"model": {"type": "WordPiece", "vocab": {"[CLS]": 0, "[SEP]": 1, "hi": 2}},
                 "added_tokens": [{"id": 0, "content": "[CLS]", "special": True},
                                  {"id": 1, "content": "[SEP]", "special": True}],
                 "normalizer": {"type": "BertNormalizer", "lowercase": True}}
    tf = files_for(tmp_path, wordpiece, {"cls_token": "[CLS]", "sep_token": "[SEP]"}, {"type_vocab_size": 2})
    assert table(tokenizer_expectations(tf)) == BERT_TOKENIZER
    default_types = files_for(tmp_path, wordpiece, {}, {})
    counts = [e for e in tokenizer_expectations(default_types) if e.key == "tokenizer.ggml.token_type_count"]
    assert [e.expected for e in counts] == [1]


def test_bert_flags_read_as_llama_cpp_defaults(tmp_path):
    bert = {"model": {"type": "WordPiece", "vocab": {"[CLS]": 101, "[SEP]": 102}},
            "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}}
    tf = files_for(tmp_path, bert, {"cls_token": "[CLS]", "sep_token": "[SEP]"}, {})
    metadata = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.bos_token_id": 101,
                "tokenizer.ggml.eos_token_id": 102, "tokenizer.ggml.seperator_token_id": 102}
    findings, details = flag_findings(tf, metadata)
    assert ([(f.flag, f.why) for f in findings], details) == BERT_DEFAULT_FLAGS


def files_for(tmp_path: Path, tokenizer: dict[str, Any], config: dict[str, Any], model_config: dict[str, Any]
              ) -> TokenizerFiles:
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    read = TokenizerFiles.read(source.__globals__["SourceModel"](root=tmp_path, config=model_config, tensors={}))
    assert read is not None
    return read
BERT_TOKENIZER = [('tokenizer.ggml.model', 'bert', 'tokenizer.json model.type', False, None, False),
 ('tokenizer.ggml.tokens',
  ['[CLS]', '[SEP]', '▁hi'],
  'tokenizer.json vocab + added_tokens, padded to vocab_size',
  False,
  None,
  False),
 ('tokenizer.ggml.token_type', [3, 3, 1], 'tokenizer.json token kinds', False, None, False),
 ('tokenizer.ggml.token_type_count', 2, 'config.type_vocab_size', False, None, False),
 ('tokenizer.ggml.seperator_token_id', 1, 'tokenizer_config.json sep_token', False, None, True),
 ('tokenizer.ggml.cls_token_id', 0, 'tokenizer_config.json cls_token', False, None, True),
 ('tokenizer.ggml.bos_token_id', 0, 'tokenizer_config.json bos_token', False, None, True),
 ('tokenizer.ggml.eos_token_id', 1, 'tokenizer_config.json eos_token', False, None, True),
 ('tokenizer.ggml.normalizer.lowercase', True, 'tokenizer.json normalizer', False, None, False)]
BERT_DEFAULT_FLAGS = ([],
 {'template': {'prefix': [101], 'suffix': [102], 'pair_middle': [102]},
  'gguf_flags': {'bos': None, 'eos': None, 'sep': None},
  'effective_flags': {'bos': True, 'eos': False, 'sep': True},
  'model': 'bert',
  'expected': {'bos': [101], 'eos': None, 'sep': [102]}})
