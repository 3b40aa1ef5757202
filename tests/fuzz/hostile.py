"""Hostile inputs built by hand: a tiny honest llama source and GGUF, then one defect per case.

Each case is a function that edits a copy of the honest pair, so the set can be replayed through
the real CLI (tests/fuzz/test_hostile_cli.py) and through the engine. The classes are those a new
user found by fuzzing: wrong-typed GGUF metadata values, invalid UTF-8, non-string safetensors
dtypes, deeply nested or huge-integer JSON, lone surrogates, integer tensor types and malformed
sentence-transformers, tokenizer and shard-index files.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.formats.ggml_types import GGML_TYPES_BY_NAME, ValueType
from tests.gguf_bytes import GGUFBytes, gguf_string, kv_array, kv_scalar, kv_string, tensor_info

VOCAB = ["a", "b", "ab", "c", "<|end|>", "hi"]
HIDDEN = 64
LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": len(VOCAB),
}
FLAGS = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
TOKENIZER: dict[str, Any] = {
    "model": {"type": "BPE", "byte_fallback": False, "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3},
              "merges": [["a", "b"]]},
    "added_tokens": [{"id": 4, "content": "<|end|>", "special": True, **FLAGS},
                     {"id": 5, "content": "hi", "special": False, **FLAGS}],
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                  {"SpecialToken": {"id": "<|end|>", "type_id": 0}}],
                       "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                                {"SpecialToken": {"id": "<|end|>", "type_id": 0}},
                                {"Sequence": {"id": "B", "type_id": 1}},
                                {"SpecialToken": {"id": "<|end|>", "type_id": 1}}],
                       "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [4], "tokens": ["<|end|>"]}}},
}
U32, F32, STR = ValueType.UINT32, ValueType.FLOAT32, ValueType.STRING


def honest_kvs() -> dict[str, bytes]:
    """The honest metadata of the tiny llama, one encoded key/value per key."""
    return {
        "general.architecture": kv_string("general.architecture", "llama"),
        "general.name": kv_string("general.name", "tiny"),
        "llama.block_count": kv_scalar("llama.block_count", U32, 2),
        "llama.context_length": kv_scalar("llama.context_length", U32, 256),
        "llama.embedding_length": kv_scalar("llama.embedding_length", U32, HIDDEN),
        "llama.feed_forward_length": kv_scalar("llama.feed_forward_length", U32, 128),
        "llama.attention.head_count": kv_scalar("llama.attention.head_count", U32, 4),
        "llama.attention.head_count_kv": kv_scalar("llama.attention.head_count_kv", U32, 2),
        "llama.attention.layer_norm_rms_epsilon": kv_scalar("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
        "llama.rope.freq_base": kv_scalar("llama.rope.freq_base", F32, 10000.0),
        "llama.rope.dimension_count": kv_scalar("llama.rope.dimension_count", U32, 16),
        "tokenizer.ggml.model": kv_string("tokenizer.ggml.model", "gpt2"),
        "tokenizer.ggml.pre": kv_string("tokenizer.ggml.pre", "default"),
        "tokenizer.ggml.tokens": kv_array("tokenizer.ggml.tokens", STR, VOCAB),
        "tokenizer.ggml.token_type": kv_array("tokenizer.ggml.token_type", ValueType.INT32, [1, 1, 1, 1, 3, 4]),
        "tokenizer.ggml.merges": kv_array("tokenizer.ggml.merges", STR, ["a b"]),
        "tokenizer.ggml.eos_token_id": kv_scalar("tokenizer.ggml.eos_token_id", U32, 4),
        "tokenizer.ggml.add_eos_token": kv_scalar("tokenizer.ggml.add_eos_token", ValueType.BOOL, True),
        "tokenizer.ggml.add_bos_token": kv_scalar("tokenizer.ggml.add_bos_token", ValueType.BOOL, False),
    }


def gguf_bytes(kvs: dict[str, bytes], type_name: str = "F32") -> bytes:
    """A structurally valid GGUF holding `kvs` and one token_embd.weight tensor of `type_name`."""
    ggml = GGML_TYPES_BY_NAME[type_name]
    count = HIDDEN * len(VOCAB)
    data = struct.pack(f"<{count}f", *([0.5] * count)) if type_name == "F32" else b"\1" * ggml.row_bytes(count)
    gguf = GGUFBytes(kvs=list(kvs.values()), tensors=[tensor_info("token_embd.weight", (HIDDEN, len(VOCAB)),
                                                                  ggml.id, 0)])
    gguf.data = data + b"\0" * (-len(data) % gguf.alignment)
    return gguf.build()


def safetensors_bytes(header: dict[str, Any] | bytes, data: bytes = b"") -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def honest_safetensors() -> bytes:
    count = len(VOCAB) * HIDDEN
    header = {"model.embed_tokens.weight": {"dtype": "F32", "shape": [len(VOCAB), HIDDEN],
                                            "data_offsets": [0, count * 4]}}
    return safetensors_bytes(header, struct.pack(f"<{count}f", *([0.5] * count)))


def write_honest_pair(root: Path) -> tuple[Path, Path]:
    """source/ and model.gguf under `root`: an honest (if partial) tiny llama conversion."""
    source = root / "source"
    source.mkdir(parents=True)
    (source / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (source / "tokenizer.json").write_text(json.dumps(TOKENIZER))
    (source / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
    (source / "model.safetensors").write_bytes(honest_safetensors())
    artifact = root / "model.gguf"
    artifact.write_bytes(gguf_bytes(honest_kvs()))
    return source, artifact


@dataclass(frozen=True)
class Case:
    """One hostile input: `apply` damages the honest pair in place."""

    name: str
    apply: Callable[[Path, Path], None]


def _kv_case(name: str, key: str, encoded: bytes) -> Case:
    def apply(source: Path, artifact: Path) -> None:
        artifact.write_bytes(gguf_bytes({**honest_kvs(), key: encoded}))

    return Case(f"gguf-{name}", apply)


def _tensor_type_case(type_name: str) -> Case:
    def apply(source: Path, artifact: Path) -> None:
        artifact.write_bytes(gguf_bytes(honest_kvs(), type_name))

    return Case(f"gguf-tensor-{type_name}", apply)


def _file_case(name: str, relative: str, content: bytes | str, modules: str | None = None) -> Case:
    def apply(source: Path, artifact: Path) -> None:
        if modules is not None:
            (source / "modules.json").write_text(modules)
        path = source / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)

    return Case(name, apply)


def _header_case(name: str, header: dict[str, Any] | bytes, data: bytes = b"") -> Case:
    return _file_case(f"safetensors-{name}", "model.safetensors", safetensors_bytes(header, data))


def _entry(**overrides: Any) -> dict[str, Any]:
    return {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **overrides}


POOLING_MODULES = json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}])
BAD_UTF8 = b"\xff\xfe\xc3("
DEEP_JSON = "[" * 100_000 + "]" * 100_000
HUGE_INT = "9" * 5000


def bad_string(key: str) -> bytes:
    return gguf_string(key) + struct.pack("<i", ValueType.STRING) + gguf_string(BAD_UTF8)


def _index(weight_map: Any) -> str:
    return json.dumps({"metadata": {}, "weight_map": weight_map})


CASES: tuple[Case, ...] = (
    # GGUF metadata values of the wrong type for their key
    _kv_case("block-count-int-array", "llama.block_count", kv_array("llama.block_count", U32, [2, 2])),
    _kv_case("block-count-string-array", "llama.block_count", kv_array("llama.block_count", STR, ["2"])),
    _kv_case("block-count-string", "llama.block_count", kv_string("llama.block_count", "2")),
    _kv_case("context-length-float", "llama.context_length", kv_scalar("llama.context_length", F32, 256.5)),
    _kv_case("context-length-nan", "llama.context_length", kv_scalar("llama.context_length", F32, float("nan"))),
    _kv_case("context-length-negative", "llama.context_length",
             kv_scalar("llama.context_length", ValueType.INT32, -5)),
    _kv_case("context-length-string", "llama.context_length", kv_string("llama.context_length", "256")),
    _kv_case("context-length-bool", "llama.context_length",
             kv_scalar("llama.context_length", ValueType.BOOL, True)),
    _kv_case("context-length-u64-max", "llama.context_length",
             kv_scalar("llama.context_length", ValueType.UINT64, (1 << 64) - 1)),
    _kv_case("embedding-length-float-array", "llama.embedding_length",
             kv_array("llama.embedding_length", F32, [64.0])),
    _kv_case("rms-eps-string", "llama.attention.layer_norm_rms_epsilon",
             kv_string("llama.attention.layer_norm_rms_epsilon", "1e-5")),
    _kv_case("rms-eps-array", "llama.attention.layer_norm_rms_epsilon",
             kv_array("llama.attention.layer_norm_rms_epsilon", F32, [1e-5])),
    _kv_case("freq-base-string-array", "llama.rope.freq_base", kv_array("llama.rope.freq_base", STR, ["x"])),
    _kv_case("architecture-int", "general.architecture", kv_scalar("general.architecture", U32, 7)),
    _kv_case("architecture-array", "general.architecture", kv_array("general.architecture", STR, ["llama"])),
    _kv_case("architecture-bad-utf8", "general.architecture", bad_string("general.architecture")),
    _kv_case("name-bad-utf8", "general.name", bad_string("general.name")),
    _kv_case("unexpected-key-bad-utf8", "vendor.note", bad_string("vendor.note")),
    _kv_case("tokenizer-model-int", "tokenizer.ggml.model", kv_scalar("tokenizer.ggml.model", U32, 1)),
    _kv_case("tokenizer-model-bad-utf8", "tokenizer.ggml.model", bad_string("tokenizer.ggml.model")),
    _kv_case("tokenizer-pre-array", "tokenizer.ggml.pre", kv_array("tokenizer.ggml.pre", U32, [1])),
    _kv_case("tokens-bad-utf8", "tokenizer.ggml.tokens",
             gguf_string("tokenizer.ggml.tokens") + struct.pack("<iiQ", ValueType.ARRAY, STR, len(VOCAB))
             + b"".join(gguf_string(BAD_UTF8 if t == "b" else t) for t in VOCAB)),
    _kv_case("eos-id-float", "tokenizer.ggml.eos_token_id", kv_scalar("tokenizer.ggml.eos_token_id", F32, 4.0)),
    _kv_case("add-eos-string", "tokenizer.ggml.add_eos_token", kv_string("tokenizer.ggml.add_eos_token", "yes")),
    _kv_case("add-bos-int-array", "tokenizer.ggml.add_bos_token",
             kv_array("tokenizer.ggml.add_bos_token", U32, [1])),
    _kv_case("chat-template-int", "tokenizer.chat_template", kv_scalar("tokenizer.chat_template", U32, 3)),
    _kv_case("token-type-float-array", "tokenizer.ggml.token_type",
             kv_array("tokenizer.ggml.token_type", F32, [1.0] * len(VOCAB))),
    # GGUF tensors of integer or F64 type
    *(_tensor_type_case(name) for name in ("I8", "I16", "I32", "I64", "F64")),
    # safetensors headers
    _header_case("dtype-list", {"w": _entry(dtype=["F32"])}, b"\0" * 8),
    _header_case("dtype-object", {"w": _entry(dtype={"F32": 1})}, b"\0" * 8),
    _header_case("dtype-int", {"w": _entry(dtype=3)}, b"\0" * 8),
    _header_case("deep-nesting", ('{"w": ' + DEEP_JSON + "}").encode()),
    _header_case("huge-int-shape", ('{"w": {"dtype": "F32", "shape": [' + HUGE_INT
                                    + '], "data_offsets": [0, 8]}}').encode(), b"\0" * 8),
    _header_case("lone-surrogate-name", b'{"w\\ud800": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}',
                 b"\0" * 8),
    _header_case("bool-shape", {"w": _entry(shape=[True, 2])}, b"\0" * 8),
    _header_case("bool-offset", {"w": _entry(shape=[1], data_offsets=[False, 4])}, b"\0" * 4),
    _header_case("metadata-list", {"__metadata__": ["x"], "w": _entry()}, b"\0" * 8),
    _header_case("metadata-null", {"__metadata__": None, "w": _entry()}, b"\0" * 8),
    _header_case("metadata-int-value", {"__metadata__": {"format": 1}, "w": _entry()}, b"\0" * 8),
    _header_case("shape-object", {"w": _entry(shape={"0": 2})}, b"\0" * 8),
    _header_case("packed-huge-shape", {"__metadata__": {"convgate.packed": json.dumps(
        {"w": {"bits": 4, "group_size": 2, "shape": [int(HUGE_INT[:50])]}})}, "w": _entry()}, b"\0" * 8),
    # sentence-transformers configs
    _file_case("modules-list-of-int", "modules.json", "[1]"),
    _file_case("modules-object", "modules.json", '{"a": 1}'),
    _file_case("modules-invalid-json", "modules.json", "[{"),
    _file_case("modules-path-int", "modules.json", '[{"type": "sentence_transformers.models.Pooling", "path": 3}]'),
    _file_case("pooling-config-list", "1_Pooling/config.json", "[1]", POOLING_MODULES),
    _file_case("st-config-prompts-list", "config_sentence_transformers.json", '{"prompts": [1]}'),
    _file_case("st-config-list", "config_sentence_transformers.json", "[1]"),
    # tokenizer files
    _file_case("tokenizer-invalid-json", "tokenizer.json", "{not json"),
    _file_case("tokenizer-bad-utf8", "tokenizer.json", b'{"model": "\xff"}'),
    _file_case("tokenizer-list", "tokenizer.json", "[1]"),
    _file_case("tokenizer-vocab-strings", "tokenizer.json",
               json.dumps({**TOKENIZER, "model": {**TOKENIZER["model"], "vocab": {"a": "zero"}}})),
    _file_case("tokenizer-merge-out-of-vocab", "tokenizer.json",
               json.dumps({**TOKENIZER, "model": {**TOKENIZER["model"], "merges": [["x", "y"]]}})),
    _file_case("tokenizer-added-ints", "tokenizer.json", json.dumps({**TOKENIZER, "added_tokens": [1, 2]})),
    _file_case("tokenizer-template-broken", "tokenizer.json", json.dumps(
        {**TOKENIZER, "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": 1}]}})),
    _file_case("tokenizer-deep-nesting", "tokenizer.json", DEEP_JSON),
    _file_case("tokenizer-config-list", "tokenizer_config.json", "[1]"),
    _file_case("tokenizer-config-invalid", "tokenizer_config.json", "{"),
    _file_case("chat-template-bad-utf8", "chat_template.jinja", b"\xff\xfe"),
    # config.json
    _file_case("config-huge-int", "config.json", json.dumps({**LLAMA_CONFIG, "vocab_size": 0})
               .replace('"vocab_size": 0', '"vocab_size": ' + HUGE_INT)),
    _file_case("config-deep-nesting", "config.json", '{"a": ' + DEEP_JSON + "}"),
    _file_case("config-architectures-int", "config.json", json.dumps({**LLAMA_CONFIG, "architectures": 5})),
    _file_case("config-hidden-size-string", "config.json", json.dumps({**LLAMA_CONFIG, "hidden_size": "64"})),
    _file_case("config-layers-list", "config.json", json.dumps({**LLAMA_CONFIG, "num_hidden_layers": [2]})),
    # shard index
    _file_case("index-int-values", "model.safetensors.index.json", _index({"model.embed_tokens.weight": 1})),
    _file_case("index-list", "model.safetensors.index.json", _index(["model.safetensors"])),
    _file_case("index-null-values", "model.safetensors.index.json", _index({"model.embed_tokens.weight": None})),
    _file_case("index-huge-int", "model.safetensors.index.json",
               '{"weight_map": {"model.embed_tokens.weight": ' + HUGE_INT + "}}"),
    _file_case("index-deep-nesting", "model.safetensors.index.json", DEEP_JSON),
)
