"""Tiny random-weight decoders of the families platforms convert most, each in its own folder.

Every model is made from a config by transformers (seeded, offline), with a real tokenizer of its
family rebuilt from llama.cpp's `models/ggml-vocab-*.gguf`, converted to F16 by llama.cpp's own
converter and quantized to Q8_0 by llama.cpp's quantizer (the helpers of fixture_tools.py).
SentencePiece families get a `tokenizer.model` written from the same GGUF vocabulary (the converter
needs it for gemma2 and phi3, and without it llama's converter falls back to tokenizer.json and
writes every score as -1000, which changes how llama.cpp's SentencePiece tokenizer splits words:
'▁j' 'umps' instead of '▁jump' 's'), so the converter and the Hugging Face tokenizer read one
vocabulary with its real scores. There is no gemma vocabulary transformers can rebuild (the sdist's gemma-4 file uses
a tokenizer model transformers 4.x does not know), so the gemma models use llama's SentencePiece
vocabulary with Gemma's normaliser (no dummy prefix). The sources are written by transformers 5.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fixture_tools import convert, llama_cpp_tree, produce, quantize

SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 512}


@dataclass(frozen=True)
class DecoderFixture:
    """One architecture: its folder, transformers classes, config and tokenizer vocabulary."""

    folder: str
    config_class: str
    model_class: str
    vocab: str
    config: dict[str, Any]
    sentencepiece: bool = False
    tokenizer_edit: Callable[[dict[str, Any]], None] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _no_dummy_prefix(tokenizer_json: dict[str, Any]) -> None:
    """Gemma's tokenizer replaces spaces with '▁' but does not prepend one (its SentencePiece model
    has add_dummy_prefix=false). transformers 4 rebuilt a SentencePiece vocabulary with a Prepend normaliser,
    transformers 5 with a Metaspace pre-tokenizer that prepends: either is turned off."""
    normalizer = tokenizer_json.get("normalizer")
    if normalizer:
        steps = normalizer["normalizers"] if normalizer.get("type") == "Sequence" else [normalizer]
        kept = [s for s in steps if s.get("type") != "Prepend"]
        tokenizer_json["normalizer"] = {"type": "Sequence", "normalizers": kept}
    pre = tokenizer_json.get("pre_tokenizer") or {}
    if pre.get("type") == "Metaspace":
        pre["prepend_scheme"] = "never"


def _llama_normalizer(tokenizer_json: dict[str, Any]) -> None:
    """Phi-3's tokenizer is llama's SentencePiece one (dummy prefix, spaces as '▁'); the rebuild from
    ggml-vocab-phi-3.gguf leaves the normalizer out, so spaces would reach the model as raw bytes, and
    turns byte fallback off and lists the GGUF's [PADn] fillers as ordinary tokens."""
    tokenizer_json["model"]["byte_fallback"] = True  # as Phi-3's own tokenizer.json: <0xNN> tokens for unknown bytes
    vocab = tokenizer_json["model"]["vocab"]  # Phi-3's own lists no [PADn] fillers past its added tokens
    for token in [t for t in vocab if t.startswith("[PAD") and t.endswith("]")]:
        del vocab[token]
    tokenizer_json["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}


FIXTURES: dict[str, DecoderFixture] = {
    "llama": DecoderFixture(
        "arch-llama", "LlamaConfig", "LlamaForCausalLM", "llama-spm",
        {**SMALL, "rope_theta": 500000.0, "tie_word_embeddings": True, "rms_norm_eps": 1e-5},
        sentencepiece=True),
    "mistral": DecoderFixture(
        "arch-mistral", "MistralConfig", "MistralForCausalLM", "llama-spm",
        {**SMALL, "hidden_size": 128, "head_dim": 32, "sliding_window": 4096, "rope_theta": 1e6,
         "tie_word_embeddings": False, "rms_norm_eps": 1e-5},
        sentencepiece=True),
    "qwen2": DecoderFixture(
        "arch-qwen2", "Qwen2Config", "Qwen2ForCausalLM", "qwen2",
        {**SMALL, "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "rope_theta": 1e6}),
    "qwen3moe": DecoderFixture(
        "arch-qwen3moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen2",
        {**SMALL, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
         "norm_topk_prob": True, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}),
    "gemma2": DecoderFixture(
        "arch-gemma2", "Gemma2Config", "Gemma2ForCausalLM", "llama-spm",
        {**SMALL, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64,
         "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0},
        sentencepiece=True, tokenizer_edit=_no_dummy_prefix),
    "gemma3": DecoderFixture(
        "arch-gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "llama-spm",
        {**SMALL, "head_dim": 16, "query_pre_attn_scalar": 16, "sliding_window": 64},
        sentencepiece=True, tokenizer_edit=_no_dummy_prefix, extra={"architectures": ["Gemma3ForCausalLM"]}),
    "phi3": DecoderFixture(
        "arch-phi3", "Phi3Config", "Phi3ForCausalLM", "phi-3",
        {**SMALL, "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
         "original_max_position_embeddings": 512, "sliding_window": 256},
        sentencepiece=True, tokenizer_edit=_llama_normalizer),
}


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def sentencepiece_model(tokens: list[str], scores: list[float], types: list[int], *, dummy_prefix: bool) -> bytes:
    """A SentencePiece ModelProto (BPE) holding a GGUF vocabulary: GGUF token types are SentencePiece's."""
    pieces = b"".join(
        _field(1, _field(1, token.encode("utf-8")) + _varint(2 << 3 | 5) + struct.pack("<f", score)
               + _int_field(3, kind))
        for token, score, kind in zip(tokens, scores, types, strict=True))
    special = {kind: types.index(kind) for kind in (2,) if kind in types}
    trainer = _int_field(3, 2) + _int_field(35, 1) + _int_field(40, special.get(2, 0))
    trainer += _int_field(41, 1) + _int_field(42, 2) + _varint(43 << 3) + _varint((1 << 64) - 1)
    normalizer = (_field(1, b"identity") + _int_field(3, int(dummy_prefix)) + _int_field(4, 0)
                  + _int_field(5, 1))
    return pieces + _field(2, trainer) + _field(3, normalizer)


def _write_sentencepiece(vocab_file: Path, target: Path, *, dummy_prefix: bool) -> None:
    import gguf

    fields = gguf.GGUFReader(vocab_file).fields
    tokens = list(fields["tokenizer.ggml.tokens"].contents())
    scores = [float(s) for s in fields["tokenizer.ggml.scores"].contents()]
    types = [int(t) for t in fields["tokenizer.ggml.token_type"].contents()]
    # the SentencePiece model proper ends with its last normal or byte piece; the rest are added tokens
    size = max(i for i, kind in enumerate(types) if kind in (1, 6)) + 1
    tokens, scores, types = tokens[:size], scores[:size], [2, 3, 3, *types[3:size]]
    target.write_bytes(sentencepiece_model(tokens, scores, types, dummy_prefix=dummy_prefix))


def _make_source(tree: Path, spec: DecoderFixture) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        import torch
        import transformers

        vocab_file = f"ggml-vocab-{spec.vocab}.gguf"
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tree / "models"), gguf_file=vocab_file)
        if spec.vocab in ("llama-spm", "phi-3"):
            tokenizer.eos_token = "</s>" if spec.vocab == "llama-spm" else "<|endoftext|>"
        tokenizer.save_pretrained(tmp)
        (tmp / "tokenizer.model").unlink(missing_ok=True)  # the rebuild's is not a valid SentencePiece model
        if spec.tokenizer_edit is not None:
            path = tmp / "tokenizer.json"
            data = json.loads(path.read_text(encoding="utf-8"))
            spec.tokenizer_edit(data)
            path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        if spec.sentencepiece:
            _write_sentencepiece(tree / "models" / vocab_file, tmp / "tokenizer.model",
                                 dummy_prefix=spec.tokenizer_edit is not _no_dummy_prefix)
        torch.manual_seed(0)
        config = getattr(transformers, spec.config_class)(
            vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, **spec.config, **spec.extra)
        model = getattr(transformers, spec.model_class)(config)
        with torch.no_grad():  # norms off their init (1, or 0 for Gemma's 1 + w), so each one matters
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.add_(torch.randn_like(param) * 0.1)
        model.save_pretrained(tmp, safe_serialization=True)

    return make


def build_decoder(cache: Path, key: str) -> Path:
    spec = FIXTURES[key]
    tree = llama_cpp_tree(cache)
    out = cache / spec.folder
    out.mkdir(exist_ok=True)
    source = produce(out / "source", _make_source(tree, spec))
    convert(tree, source, "f16", out / "F16.gguf")
    quantize(out / "F16.gguf", "Q8_0", out / "Q8_0.gguf")
    return out


def build_decoders(cache: Path) -> None:
    """Every decoder fixture (one folder per architecture)."""
    for key in FIXTURES:
        build_decoder(cache, key)
