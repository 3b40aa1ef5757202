"""What a GGUF's metadata must agree with in its own tensors before llama.cpp is given the file.

Why: llama.cpp trusts some counts more than its tensors. A `block_count` far larger than the blocks
present makes it abort while loading (SIGABRT), which ran the verifier down with it before gates 2 and
3 moved llama.cpp into a child. Gate 1 already compares these keys with the tensors; gates 2 and 3 ask
the same questions first and refuse to load a file that contradicts itself (`runtime.refused_to_load`),
whether or not gate 1 was requested. Special-token ids that do not index the token list are refused too
(llama.cpp has read them out of bounds while loading). Everything subtler is left to the child: whatever
still kills llama.cpp there is a `runtime.crashed` verdict, not a lost one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from engine.blockers import Blocker
from engine.formats.gguf_structure import GGUFLayout
from engine.gates.expectation import Expectation

_BLOCK = re.compile(r"blk\.(\d+)\.")


def tensor_expectations(arch: str, layout: GGUFLayout) -> list[Expectation]:
    """Keys the tensors present determine: block count, embedding width, token count."""
    out = []
    blocks = {int(m[1]) for info in layout.tensors if (m := _BLOCK.match(info.name))}
    if blocks:
        out.append(Expectation(f"{arch}.block_count", max(blocks) + 1, "tensors (blk.N present)"))
    names = {info.name: info for info in layout.tensors}
    if "token_embd.weight" in names:
        embd = names["token_embd.weight"]
        out.append(Expectation(f"{arch}.embedding_length", embd.shape[0], "tensors (token_embd width)"))
        out.append(Expectation("tokenizer.ggml.tokens", embd.shape[1], "tensors (token_embd rows)"))
    return out


def _count(value: Any) -> Any:
    values = getattr(value, "values", value)
    return len(values) if isinstance(values, Sequence) and not isinstance(values, str) else values


def vocabulary_size(layout: GGUFLayout) -> int | None:
    """How many tokens the file lists (what llama.cpp's logits are wide), when it lists them."""
    tokens = _count(layout.metadata.get("tokenizer.ggml.tokens"))
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


SPECIAL_ID_KEYS = tuple(f"tokenizer.ggml.{kind}_token_id" for kind in
                        ("bos", "eos", "eot", "eom", "unknown", "seperator", "padding", "mask", "cls"))


def _ids_outside_the_vocabulary(layout: GGUFLayout) -> list[tuple[str, Any, int]]:
    """Special-token ids that do not index the token list: llama.cpp versions of 2025-26 read them out of
    bounds while loading (GHSA-g4cc-763q-h9h6 and its load() sibling)."""
    tokens = _count(layout.metadata.get("tokenizer.ggml.tokens", []))
    if not isinstance(tokens, int):
        return []
    return [(key, value, tokens) for key in SPECIAL_ID_KEYS if key in layout.metadata
            and (value := layout.metadata[key]) is not None and (type(value) is not int or not 0 <= value < tokens)]


def refusal(layout: GGUFLayout, gate: Literal["runtime", "release"]) -> list[Blocker]:
    """One blocker per key whose value contradicts the tensors or the token list (an absent key contradicts
    nothing here)."""
    arch = str(layout.metadata.get("general.architecture", ""))
    found = [Blocker(code="runtime.refused_to_load", gate=gate, key=key,
                     why=f"{key} is {str(value)[:40]!r}, outside the {tokens} tokens the file lists: llama.cpp "
                         "is not given an id it would read out of bounds")
             for key, value, tokens in _ids_outside_the_vocabulary(layout)]
    for exp in tensor_expectations(arch, layout):
        if exp.key not in layout.metadata:
            continue
        actual = _count(layout.metadata[exp.key])
        if actual != exp.expected or isinstance(actual, bool):
            found.append(Blocker(code="runtime.refused_to_load", gate=gate, key=exp.key,
                                 why=f"{exp.key} is {str(actual)[:40]!r} but the {exp.origin} say {exp.expected}: "
                                     "llama.cpp is not given a file that contradicts itself"))
    return found
