"""Fixtures for what gate 2 measures at scale of positions or vocabulary, not of weights: random-weight
models (their structure is the point) with a real SentencePiece tokenizer rebuilt offline from llama.cpp's
ggml-vocab-llama-spm.gguf, converted by llama.cpp's own converter.

- big-vocab/: a 2-layer, 64-wide llama whose vocabulary is padded to Gemma's 262,144 tokens (the converter
  pads a SentencePiece vocabulary with [PAD] tokens up to `vocab_size`, as it does for real models): every
  position's logits are a megabyte, so memory that grows with positions x vocabulary shows at once.
- long-<name>/: tiny models whose defects only long context shows, each trained for 2,048 positions and
  converted to F32 (the tightest thresholds): gemma3 with five sliding-window layers (window 512) and one
  global layer, as llama.cpp patterns them; phi3 with a Mistral-style window (512) on every layer; a llama
  with Llama 3's rope scaling (original context 256, factor 8), for which the converter writes
  `rope_freqs.weight`; a qwen3 with YaRN (original context 512, factor 4). Their twins are made by the tests.
"""

from __future__ import annotations

from pathlib import Path

from fixture_tools import convert, llama_cpp_tree, produce
from fixtures_decoders import DecoderFixture, _llama_normalizer, _make_source, _no_dummy_prefix, _write_sentencepiece

BIG_VOCABULARY = 262_144
BIG_VOCAB_CONFIG = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
}


def _llama_spm_tokenizer(tree: Path, target: Path) -> object:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tree / "models"), gguf_file="ggml-vocab-llama-spm.gguf")
    tokenizer.eos_token = "</s>"  # the rebuild names <s> as EOS; llama's SentencePiece vocabulary ends with </s>
    tokenizer.save_pretrained(target)
    (target / "tokenizer.model").unlink(missing_ok=True)  # not a valid SentencePiece model when rebuilt
    _write_sentencepiece(tree / "models" / "ggml-vocab-llama-spm.gguf", target / "tokenizer.model", dummy_prefix=True)
    return tokenizer


def build_big_vocab(cache: Path) -> None:
    tree = llama_cpp_tree(cache)
    out = cache / "big-vocab"
    out.mkdir(exist_ok=True)

    def make_source(tmp: Path) -> None:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = _llama_spm_tokenizer(tree, tmp)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=BIG_VOCABULARY, bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
                             eos_token_id=tokenizer.eos_token_id, **BIG_VOCAB_CONFIG)  # type: ignore[attr-defined]
        LlamaForCausalLM(config).save_pretrained(tmp, safe_serialization=True)

    source = produce(out / "source", make_source)
    convert(tree, source, "f32", out / "big-vocab-F32.gguf")


LONG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 2048}
LONG_FIXTURES: dict[str, DecoderFixture] = {
    "gemma3": DecoderFixture(
        "long-gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "llama-spm",
        {**LONG, "num_hidden_layers": 6, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 512},
        sentencepiece=True, tokenizer_edit=_no_dummy_prefix, extra={"architectures": ["Gemma3ForCausalLM"]}),
    "phi3": DecoderFixture(
        "long-phi3", "Phi3Config", "Phi3ForCausalLM", "phi-3",
        {**LONG, "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "original_max_position_embeddings": 2048, "sliding_window": 512},
        sentencepiece=True, tokenizer_edit=_llama_normalizer),
    "llama3-rope": DecoderFixture(
        "long-llama3-rope", "LlamaConfig", "LlamaForCausalLM", "llama-spm",
        {**LONG, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
         "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 256}},
        sentencepiece=True),
    "yarn": DecoderFixture(
        "long-qwen3-yarn", "Qwen3Config", "Qwen3ForCausalLM", "qwen2",
        {**LONG, "head_dim": 16, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
         "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                             "original_max_position_embeddings": 512}}),
}


def build_long(cache: Path) -> None:
    """Every long-<name> fixture: source/ and F32.gguf."""
    tree = llama_cpp_tree(cache)
    for spec in LONG_FIXTURES.values():
        out = cache / spec.folder
        out.mkdir(exist_ok=True)
        source = produce(out / "source", _make_source(tree, spec))
        convert(tree, source, "f32", out / "F32.gguf")


BUILDERS = {"big-vocab": build_big_vocab, "long-context": build_long}
