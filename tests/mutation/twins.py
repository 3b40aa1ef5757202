"""Single-defect twins of an honest GGUF, written systematically, and the verdict each must get.

Kinds: every metadata key a runtime reads changed to a plausible wrong value (and a few keys it
reads added where the honest file leaves them out), every tensor with one element moved by one ulp
(or one quantized code by one step), two same-shaped tensors swapped, one tensor dropped, one
duplicated under another name. A twin is caught when the verdict is NO-GO *and* a blocker names
the key or tensor that was changed (a twin llama.cpp itself refuses counts only with a clear blocker).
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass, replace

from engine.formats.ggml_types import GGML_TYPES, ValueType
from engine.gates.storage.metadata_keys import BEHAVIOURAL, DESCRIPTIVE, NOT_READ_FOR_MODEL
from engine.report import Report
from tests.mutation.gguf_edit import KV, GGUFFile, Tensor

# Keys whose value the converter stamps but no runtime computes with: changing them is not a defect.
NOT_READ = ("general.file_type", "general.quantization_version")
# Keys judged by behaviour in gate 2 (BEHAVIOURAL): their twins run gate 2 to be caught.


@dataclass(frozen=True)
class Twin:
    kind: str  # metadata | added-key | ulp | swap | drop | duplicate
    target: str  # the key or tensor a blocker must name
    describe: str
    gguf: GGUFFile
    gates: frozenset[int] = frozenset({1})
    also: str | None = None  # a second acceptable name (the other tensor of a swap)


def _wrong_scalar(kv: KV) -> object:
    value = kv.value
    if kv.vtype is ValueType.BOOL:
        return not value
    if kv.vtype in (ValueType.FLOAT32, ValueType.FLOAT64):
        return value * 1.5 if value else 1.0
    if kv.vtype is ValueType.STRING:
        alternatives = {"general.architecture": ("llama", "qwen2", "qwen3", "bert"),
                        "tokenizer.ggml.model": ("gpt2", "llama", "bert"),
                        "tokenizer.ggml.pre": ("default", "llama-bpe", "qwen2", "gpt-2")}
        for candidate in alternatives.get(kv.key, ()):
            if candidate != value:
                return candidate
        return value + " " if kv.key == "tokenizer.chat_template" else value + "x"
    return value + 1 if kv.key.endswith("_token_id") or value else 1


def _wrong_array(kv: KV, rng: random.Random) -> list[object]:
    values = list(kv.value)
    i = rng.randrange(len(values) - 1)
    if kv.element_type is ValueType.STRING:
        j = next((k for k in range(i + 1, len(values)) if values[k] != values[i]), None)
        if j is None:
            values[i] = values[i] + "x"
        else:
            values[i], values[j] = values[j], values[i]
    elif kv.element_type in (ValueType.FLOAT32, ValueType.FLOAT64):
        values[i] = values[i] + 1.0
    else:
        values[i] = 3 if values[i] != 3 else 1  # NORMAL <-> CONTROL for token types
    return values


def metadata_twins(honest: GGUFFile, seed: int = 0) -> Iterator[Twin]:
    rng = random.Random(seed)
    model = next((str(kv.value) for kv in honest.kvs if kv.key == "tokenizer.ggml.model"), "")
    unread = (*NOT_READ, *NOT_READ_FOR_MODEL.get(model, ()), "general.alignment")
    for kv in honest.kvs:
        if DESCRIPTIVE.fullmatch(kv.key) or kv.key in unread:
            continue
        value = _wrong_array(kv, rng) if kv.vtype is ValueType.ARRAY else _wrong_scalar(kv)
        gates = frozenset({1, 2}) if kv.key in BEHAVIOURAL else frozenset({1})
        yield Twin("metadata", kv.key, f"{kv.key}: {_short(kv.value)!r} -> {_short(value)!r}",
                   honest.with_kv(replace(kv, value=value)), gates)
    arch = str(honest.kv("general.architecture").value)
    keys = {kv.key for kv in honest.kvs}
    additions = [
        KV(f"{arch}.rope.scaling.type", ValueType.STRING, "linear"),
        KV(f"{arch}.attention.causal", ValueType.BOOL, arch == "bert"),
        KV(f"{arch}.expert_count", ValueType.UINT32, 8),
    ]
    for added in additions:
        if added.key not in keys:
            yield Twin("added-key", added.key, f"{added.key} added = {added.value!r}", honest.with_kv(added))


def _short(value: object) -> object:
    return f"<{len(value)} items>" if isinstance(value, list) else value


def _nudged(tensor: Tensor, rng: random.Random) -> bytes:
    """One element moved by one ulp (floats) or one quantized code moved by one step (a payload byte)."""
    ggml = GGML_TYPES[tensor.type_id]
    data = bytearray(tensor.data)
    if ggml.name in ("F32", "F16", "BF16"):
        size = 4 if ggml.name == "F32" else 2
        index = rng.randrange(len(data) // size) * size
        fmt = "<I" if size == 4 else "<H"
        (bits,) = struct.unpack_from(fmt, data, index)
        struct.pack_into(fmt, data, index, bits ^ 1)
    else:
        block = rng.randrange(len(data) // ggml.type_size)
        data[block * ggml.type_size + ggml.type_size // 2] ^= 1  # mid-block: quant codes, not scales
    return bytes(data)


def tensor_twins(honest: GGUFFile, sample: int | None, seed: int = 0) -> Iterator[Twin]:
    rng = random.Random(seed)
    tensors = honest.tensors
    chosen = tensors if sample is None else rng.sample(tensors, min(sample, len(tensors)))
    for tensor in chosen:
        moved = [replace(t, data=_nudged(t, rng)) if t is tensor else t for t in tensors]
        yield Twin("ulp", tensor.name, f"{tensor.name}: one element/code moved one step",
                   honest.with_tensors(moved))
    by_shape: dict[tuple[tuple[int, ...], int], list[Tensor]] = {}
    for tensor in tensors:
        by_shape.setdefault((tensor.shape, tensor.type_id), []).append(tensor)
    pairs = [(a, b) for group in by_shape.values() for a, b in itertools.pairwise(group)
             if a.data != b.data]
    for a, b in pairs if sample is None else rng.sample(pairs, min(max(sample // 2, 1), len(pairs))):
        swapped = [replace(t, data=b.data) if t is a else replace(t, data=a.data) if t is b else t for t in tensors]
        yield Twin("swap", a.name, f"{a.name} <-> {b.name}", honest.with_tensors(swapped), also=b.name)
    for tensor in tensors if sample is None else rng.sample(tensors, min(max(sample // 2, 1), len(tensors))):
        yield Twin("drop", tensor.name, f"{tensor.name} dropped",
                   honest.with_tensors([t for t in tensors if t is not tensor]))
    source = tensors[rng.randrange(len(tensors))]
    copy = replace(source, name=source.name.replace(".weight", "_copy.weight"))
    yield Twin("duplicate", copy.name, f"{source.name} duplicated as {copy.name}",
               honest.with_tensors([*tensors, copy]))


def caught(twin: Twin, report: Report) -> bool:
    """NO-GO with a blocker naming what was changed."""
    if report.verdict != "NO-GO":
        return False
    names = {twin.target, twin.also} - {None}
    for blocker in report.blockers:
        if blocker.key in names or blocker.tensor in names:
            return True
        if any(name and name in blocker.why for name in names):
            return True
    return False


def explain(report: Report) -> str:
    return "; ".join(f"{b.code}: {b.why[:120]}" for b in report.blockers[:3]) or "GO"
