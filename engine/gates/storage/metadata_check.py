"""Gate 1 metadata: every GGUF key accounted for, against config.json, the tokenizer files and the tensors.

Derived keys are compared (floats at float32, the precision GGUF stores; arrays element by
element, reporting where they first differ). An absent key passes only when llama.cpp's default
for it equals the source's value. The add_* flags are judged by meaning. Keys the source cannot
determine are named under not_verified; any other key is `metadata.unexpected_key`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.blockers import Blocker
from engine.formats.gguf_strings import StringArray
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel
from engine.gates.architectures import Architecture
from engine.gates.expectation import NO_DEFAULT, Expectation
from engine.gates.hyperparameters import underivable_rope_scaling
from engine.gates.runtime.loadable import tensor_expectations
from engine.gates.storage.metadata_keys import disposition
from engine.gates.storage.tokenizer_metadata import (
    TokenizerFiles,
    converter_notes,
    flag_findings,
    tokenizer_expectations,
)
from engine.report import MetadataCheck
from engine.runtime.sentence_config import LLAMA_POOLING, sentence_config


@dataclass
class MetadataOutcome:
    checks: list[MetadataCheck] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    not_verified: list[str] = field(default_factory=list)
    flags: dict[str, Any] = field(default_factory=dict)

    @property
    def compared(self) -> set[str]:
        return {check.key for check in self.checks}


def source_pooling(source: SourceModel) -> int | None:
    """llama.cpp pooling type of the source's sentence-transformers Pooling module, if it has one."""
    pooling = sentence_config(source).pooling
    return LLAMA_POOLING[pooling] if pooling else None


def _plain(value: Any) -> Any:
    value = getattr(value, "values", value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, tuple | StringArray):
        return list(value)
    return value


def _summary(value: Any) -> Any:
    """Arrays are reported by length and digest, not printed whole."""
    if isinstance(value, list) and len(value) > 16:
        digest = hashlib.sha256(repr(value).encode()).hexdigest()[:16]
        return f"{len(value)} items, sha256:{digest}"
    return value


def _differs_at(expected: list[Any], actual: list[Any]) -> str:
    diffs = [i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b]
    parts = [f"{len(diffs)} of {min(len(expected), len(actual))} entries differ"]
    if len(expected) != len(actual):
        parts.append(f"length {len(actual)}, expected {len(expected)}")
    parts.extend(f"[{i}] is {actual[i]!r}, expected {expected[i]!r}" for i in diffs[:3])
    return "; ".join(parts)


# Keys whose GGUF value is an array that an integer expectation counts (token_embd rows vs tokens).
COUNTED_ARRAYS = frozenset({"tokenizer.ggml.tokens"})


def value_kind(value: Any) -> str:
    """The GGUF value kind of a parsed (plain) value, as an error message names it."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else type(value).__name__


def _type_fits(exp: Expectation, actual: Any) -> bool:
    """Whether `actual` has the kind llama.cpp reads for `exp.key` (the kind of the expected value)."""
    if exp.is_float:
        return isinstance(actual, int | float) and not isinstance(actual, bool)
    if isinstance(exp.expected, bool):
        return isinstance(actual, bool)
    if isinstance(exp.expected, int):
        if exp.key in COUNTED_ARRAYS:
            return isinstance(actual, list)
        return isinstance(actual, int) and not isinstance(actual, bool)
    if isinstance(exp.expected, str):
        return isinstance(actual, str)
    if isinstance(exp.expected, list):
        return isinstance(actual, list)
    return True


def _wrong_type(exp: Expectation, present: bool, actual: Any) -> str | None:
    if not present or _type_fits(exp, actual):
        return None
    wanted = "a number" if exp.is_float else value_kind(exp.expected)
    if exp.key in COUNTED_ARRAYS:
        wanted = "an array"
    return f"{exp.key} holds {value_kind(actual)}, llama.cpp reads it as {wanted}"


def _disagreement(exp: Expectation, present: bool, actual: Any) -> str | None:
    """Why the GGUF disagrees with one expectation, or None when it agrees."""
    if not present:
        if exp.optional or (exp.default is not NO_DEFAULT and _agrees(exp, exp.default)):
            return None
        return f"{exp.key} is absent; {exp.origin} says {_summary(exp.expected)!r}"
    if isinstance(exp.expected, int) and not isinstance(exp.expected, bool) and isinstance(actual, list):
        actual = len(actual)  # a count expectation against an array (token_embd rows vs tokens)
    if _agrees(exp, actual):
        return None
    if isinstance(exp.expected, list) and isinstance(actual, list):
        return f"{exp.key} differs from {exp.origin}: {_differs_at(exp.expected, actual)}"
    return f"{exp.key} is {_summary(actual)!r}, {exp.origin} says {_summary(exp.expected)!r}"


def _agrees(exp: Expectation, actual: Any) -> bool:
    if exp.is_float:
        return isinstance(actual, int | float) and bool(np.float32(exp.expected) == np.float32(actual))
    if isinstance(exp.expected, bool) or isinstance(actual, bool):
        return type(exp.expected) is type(actual) and exp.expected == actual
    return bool(exp.expected == actual)


def _expectations(arch: Architecture, layout: GGUFLayout, source: SourceModel,
                  tokenizer: TokenizerFiles | None) -> list[Expectation]:
    out = arch.expectations() + tensor_expectations(arch.arch, layout)
    if tokenizer is not None:
        out += tokenizer_expectations(tokenizer)
    pooling = source_pooling(source)
    if pooling is not None:
        out.append(Expectation(f"{arch.arch}.pooling_type", pooling, "1_Pooling/config.json"))
    return out


def _code(key: str, arch: Architecture) -> str:
    return "metadata.pooling_mismatch" if key == f"{arch.arch}.pooling_type" else "metadata.mismatch"


def check_metadata(arch: Architecture, layout: GGUFLayout, source: SourceModel) -> MetadataOutcome:
    outcome = MetadataOutcome()
    metadata = {key: _plain(value) for key, value in layout.metadata.items()}
    tokenizer = TokenizerFiles.read(source)
    for exp in _expectations(arch, layout, source, tokenizer):
        present = exp.key in metadata
        wrong_type = _wrong_type(exp, present, metadata.get(exp.key))
        why = wrong_type or _disagreement(exp, present, metadata.get(exp.key))
        outcome.checks.append(MetadataCheck(key=exp.key, expected=_summary(exp.expected),
                                            actual=_summary(metadata.get(exp.key)), origin=exp.origin,
                                            result="ok" if why is None else "fail"))
        if why is not None:
            code = "metadata.wrong_type" if wrong_type else "metadata.missing" if not present else _code(exp.key, arch)
            outcome.blockers.append(Blocker(code=code, gate="storage", why=why, key=exp.key))
    if tokenizer is not None:
        findings, outcome.flags = flag_findings(tokenizer, metadata)
        outcome.blockers.extend(Blocker(code="tokenizer.flag_mismatch", gate="storage", why=f.why, key=f.flag)
                                for f in findings)
        outcome.not_verified.extend(converter_notes(tokenizer))
    else:
        outcome.not_verified.append("tokenizer keys: the source has no tokenizer.json")
    _account_for_the_rest(arch, metadata, outcome)
    return outcome


def _account_for_the_rest(arch: Architecture, metadata: dict[str, Any], outcome: MetadataOutcome) -> None:
    """Every key not compared is descriptive, named as not derivable, or a blocker."""
    compared = outcome.compared
    rope_kind = underivable_rope_scaling(arch.config)
    descriptive = 0
    for key, value in metadata.items():
        if key in compared:
            continue
        reason = disposition(key)
        if reason is None and rope_kind and key.startswith(f"{arch.arch}.rope.scaling."):
            reason = f"rope scaling {rope_kind!r} is not derived by this verifier; gate 2 measures its effect"
        if reason == "descriptive":
            descriptive += 1
        elif reason is not None:
            if "judged by meaning" not in reason and "structural parser" not in reason:
                outcome.not_verified.append(f"GGUF key {key}: {reason}")
        else:
            outcome.blockers.append(Blocker(
                code="metadata.unexpected_key", gate="storage", key=key,
                why=f"{key} = {_summary(value)!r} is present, but nothing in the source says it should be "
                    "(llama.cpp may read it)"))
    if descriptive:
        outcome.not_verified.append(f"{descriptive} descriptive general.* keys (names, licence, datasets) "
                                    "are not compared")
