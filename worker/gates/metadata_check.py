"""Gate 1 metadata: GGUF architecture keys against config.json and against the tensors present.

Floats are compared at float32 (the precision GGUF stores); a key the source says must exist but
the GGUF lacks is `metadata.missing`. Pooling is read from the sentence-transformers config.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from worker.blockers import Blocker
from worker.formats.gguf_structure import GGUFLayout
from worker.formats.source import SourceModel
from worker.gates.architectures import Architecture, Expectation
from worker.report import MetadataCheck
from worker.runtime.sentence_config import LLAMA_POOLING, sentence_config


def source_pooling(source: SourceModel) -> int | None:
    """llama.cpp pooling type of the source's sentence-transformers Pooling module, if it has one."""
    pooling = sentence_config(source).pooling
    return LLAMA_POOLING[pooling] if pooling else None


def _tensor_expectations(arch: Architecture, layout: GGUFLayout, source: SourceModel) -> list[Expectation]:
    out = []
    blocks = {int(m[1]) for info in layout.tensors if (m := re.match(r"blk\.(\d+)\.", info.name))}
    if blocks:
        out.append(Expectation(f"{arch.arch}.block_count", max(blocks) + 1, "tensors (blk.N present)"))
    names = {info.name: info for info in layout.tensors}
    if "token_embd.weight" in names:
        embd = names["token_embd.weight"]
        out.append(Expectation(f"{arch.arch}.embedding_length", embd.shape[0], "tensors (token_embd width)"))
        out.append(Expectation("tokenizer.ggml.tokens", embd.shape[1], "tensors (token_embd rows)"))
    if "vocab_size" in source.config:
        out.append(Expectation("tokenizer.ggml.tokens", source.config["vocab_size"], "config.vocab_size"))
    return out


def _actual(layout: GGUFLayout, key: str) -> Any:
    value = layout.metadata.get(key)
    if key == "tokenizer.ggml.tokens" and value is not None:
        return len(value)
    return value


def _agrees(expected: Any, actual: Any, is_float: bool) -> bool:
    if is_float:
        return bool(np.float32(expected) == np.float32(actual))
    return bool(expected == actual)


def check_metadata(
    arch: Architecture, layout: GGUFLayout, source: SourceModel
) -> tuple[list[MetadataCheck], list[Blocker]]:
    checks: list[MetadataCheck] = []
    blockers: list[Blocker] = []
    for exp in arch.expectations() + _tensor_expectations(arch, layout, source):
        actual = _actual(layout, exp.key)
        ok = actual is not None and _agrees(exp.expected, actual, exp.is_float)
        checks.append(MetadataCheck(key=exp.key, expected=exp.expected, actual=actual, origin=exp.origin,
                                    result="ok" if ok else "fail"))
        if actual is None:
            blockers.append(Blocker(code="metadata.missing", gate="storage", why=f"{exp.key} is absent"))
        elif not ok:
            blockers.append(Blocker(code="metadata.mismatch", gate="storage",
                                    why=f"{exp.key} is {actual!r}, {exp.origin} says {exp.expected!r}"))
    pooling = source_pooling(source)
    if pooling is not None:
        key = f"{arch.arch}.pooling_type"
        actual = layout.metadata.get(key)
        ok = actual == pooling
        checks.append(MetadataCheck(key=key, expected=pooling, actual=actual, origin="1_Pooling/config.json",
                                    result="ok" if ok else "fail"))
        if not ok:
            blockers.append(Blocker(code="metadata.pooling_mismatch", gate="storage",
                                    why=f"{key} is {actual!r}, the source pools with type {pooling}"))
    return checks, blockers
