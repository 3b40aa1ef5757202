"""The side files of a source model checked for the shapes the verifier relies on, at the boundary.

config.json, tokenizer.json, tokenizer_config.json, the sentence-transformers configs and the shard
index are free-form JSON written by many tools. The gates read them with `.get`, `int()` and
indexing; each check here makes one of those reads safe, so a `modules.json` of `[1]` or a vocab
of strings is a `source.*` blocker when the source is opened, never an exception inside a gate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.errors import SourceError

# Hyperparameters the gates turn into numbers, with the largest value they accept: a vocab_size of
# 10**12 would otherwise make gate 1 build a vocabulary list of that length.
MAX_VOCAB = 1 << 22
MAX_HYPERPARAMETER = 1 << 31
CONFIG_INTS = (
    "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "max_position_embeddings", "vocab_size", "head_dim", "type_vocab_size", "n_positions", "n_embd", "n_layer",
    "n_head", "sliding_window",
)
CONFIG_FLOATS = ("rms_norm_eps", "layer_norm_eps", "rope_theta", "partial_rotary_factor")
POSITIVE = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size")


def _bad(code: str, what: str, why: str) -> SourceError:
    return SourceError(code, f"{what} {why}")


def is_int(value: Any) -> bool:
    """A JSON integer: `True` is an `int` to Python, not to JSON."""
    return type(value) is int


def is_number(value: Any) -> bool:
    return type(value) in (int, float)


def check_config(config: dict[str, Any]) -> None:
    """config.json: the hyperparameters the gates derive from are numbers in range, architectures are names."""
    architectures = config.get("architectures")
    if architectures is not None and (
        not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
    ):
        raise _bad("source.bad_config", "config.json", "architectures is not a list of names")
    for key in CONFIG_INTS:
        value = config.get(key)
        limit = MAX_VOCAB if key == "vocab_size" else MAX_HYPERPARAMETER
        if value is not None and (not is_int(value) or not 0 <= value <= limit):
            why = f"{key} is {str(value)[:40]!r}, not an integer in 0..{limit}"
            raise _bad("source.bad_config", "config.json", why)
        if key in POSITIVE and value == 0:
            raise _bad("source.bad_config", "config.json", f"{key} is 0")
    for key in CONFIG_FLOATS:
        value = config.get(key)
        if value is not None and not is_number(value):
            raise _bad("source.bad_config", "config.json", f"{key} is {str(value)[:40]!r}, not a number")
    rope = config.get("rope_scaling")
    if rope is not None and not isinstance(rope, dict):
        raise _bad("source.bad_config", "config.json", "rope_scaling is not an object")


def check_weight_map(index: Any, name: str) -> dict[str, str]:
    """The shard index's weight_map: tensor name -> shard file name, both strings."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise _bad("source.index_mismatch", name, "has no weight_map object")
    if not all(isinstance(shard, str) and shard for shard in weight_map.values()):
        raise _bad("source.index_mismatch", name, "maps a tensor to something other than a shard file name")
    return weight_map


def _modules(value: Any, name: str) -> None:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise _bad("source.bad_file", name, "is not a list of module objects")
    for module in value:
        if not all(isinstance(module.get(k, ""), str) for k in ("type", "path")):
            raise _bad("source.bad_file", name, "has a module whose type or path is not a string")


def _object(value: Any, name: str) -> None:
    if not isinstance(value, dict):
        raise _bad("source.bad_file", name, "is not a JSON object")


def _sentence_config(value: Any, name: str) -> None:
    _object(value, name)
    prompts = value.get("prompts")
    if prompts is not None and (not isinstance(prompts, dict) or not all(isinstance(p, str) for p in prompts.values())):
        raise _bad("source.bad_file", name, "has prompts that are not an object of strings")


def _processor(node: Any, name: str) -> None:
    """A post-processor as tokenizer_parity reads it (nesting is bounded by the JSON reader)."""
    bad = _bad("source.bad_file", name, "has a post_processor this verifier cannot read")
    if node is None:
        return
    if not isinstance(node, dict):
        raise bad
    kind = node.get("type")
    if kind == "TemplateProcessing":
        items = node.get("single") or []
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise bad
        for item in items:
            special = item.get("SpecialToken")
            if "Sequence" not in item and not (isinstance(special, dict) and isinstance(special.get("id"), str)):
                raise bad
        specials = node.get("special_tokens") or {}
        if not isinstance(specials, dict) or not all(
            isinstance(s, dict) and isinstance(s.get("ids", []), list) and all(is_int(i) for i in s.get("ids", []))
            for s in specials.values()
        ):
            raise bad
    elif kind in ("BertProcessing", "RobertaProcessing"):
        for part in ("cls", "sep"):
            pair = node.get(part)
            if not isinstance(pair, list) or len(pair) != 2 or not is_int(pair[1]):
                raise bad
    elif kind == "Sequence":
        inner = node.get("processors") or []
        if not isinstance(inner, list):
            raise bad
        for processor in inner:
            _processor(processor, name)


def _tokenizer(value: Any, name: str) -> None:
    _object(value, name)
    model = value.get("model") or {}
    _object(model, f"{name} model")
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        if not all(is_int(i) and i >= 0 for i in vocab.values()):
            raise _bad("source.bad_file", name, "has a vocab whose ids are not non-negative integers")
    elif isinstance(vocab, list):
        if not all(isinstance(e, list) and e and isinstance(e[0], str) for e in vocab):
            raise _bad("source.bad_file", name, "has a Unigram vocab that is not a list of [piece, score]")
    elif vocab is not None:
        raise _bad("source.bad_file", name, "has a vocab that is neither an object nor a list")
    merges = model.get("merges")
    if merges is not None and (not isinstance(merges, list) or not all(
        isinstance(m, str) or (isinstance(m, list) and len(m) == 2 and all(isinstance(p, str) for p in m))
        for m in merges
    )):
        raise _bad("source.bad_file", name, "has merges that are not pairs of strings")
    added = value.get("added_tokens") or []
    if not isinstance(added, list) or not all(
        isinstance(a, dict) and is_int(a.get("id")) and a["id"] >= 0 and isinstance(a.get("content"), str)
        for a in added
    ):
        raise _bad("source.bad_file", name, "has added_tokens that are not {id, content} objects")
    for part in ("normalizer", "pre_tokenizer", "decoder"):
        if value.get(part) is not None and not isinstance(value[part], dict):
            raise _bad("source.bad_file", name, f"has a {part} that is not an object")
    _processor(value.get("post_processor"), name)


SIDE_FILES: dict[str, Callable[[Any, str], None]] = {
    "modules.json": _modules,
    "config_sentence_transformers.json": _sentence_config,
    "tokenizer.json": _tokenizer,
    "tokenizer_config.json": _object,
    "special_tokens_map.json": _object,
}


def check_side_file(relative: str, value: Any) -> None:
    """Raise `SourceError` if a known side file does not have the shape the gates rely on."""
    check = SIDE_FILES.get(relative) or (_object if relative.endswith("/config.json") else None)
    if check is not None:
        check(value, relative)


__all__ = ["MAX_VOCAB", "SIDE_FILES", "check_config", "check_side_file", "check_weight_map", "is_int", "is_number"]
