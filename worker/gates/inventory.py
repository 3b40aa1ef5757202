"""Gate 1 inventory: every source tensor classified, every GGUF tensor accounted for."""

from __future__ import annotations

from dataclasses import dataclass

from worker.blockers import Blocker
from worker.formats.gguf_structure import GGUFLayout
from worker.formats.source import SourceModel
from worker.gates.architectures import Architecture, RowTransform


@dataclass(frozen=True, slots=True)
class Pairing:
    gguf_name: str
    source_name: str
    transform: RowTransform | None


@dataclass(frozen=True)
class Inventory:
    pairs: tuple[Pairing, ...]
    classification: dict[str, str]
    blockers: tuple[Blocker, ...]


def _classify(gguf_type: str, source_dtype: str, transform: RowTransform | None) -> str:
    if transform is not None:
        return f"transformed ({transform.name})"
    if gguf_type == source_dtype:
        return "renamed (copied)"
    return "renamed (quantized)" if gguf_type not in ("F32", "F16", "BF16", "F64") else "renamed (cast)"


def take_inventory(arch: Architecture, layout: GGUFLayout, source: SourceModel) -> Inventory:
    by_name = {info.name: info for info in layout.tensors}
    pairs: list[Pairing] = []
    classification: dict[str, str] = {}
    blockers: list[Blocker] = []
    claimed: dict[str, str] = {}

    def block(code: str, why: str, tensor: str) -> None:
        blockers.append(Blocker(code=code, gate="storage", why=why, tensor=tensor))

    for name, tensor in sorted(source.tensors.items()):
        reason = arch.omission_reason(name)
        if reason is not None:
            classification[name] = f"omitted: {reason}"
            continue
        target = arch.gguf_name(name) if tensor.is_float else None
        if target is None or target not in by_name:
            classification[name] = "missing"
            where = f"expected as {target!r}" if target else "no GGUF name maps to it"
            block("tensor.missing", f"source tensor {name!r} is not in the GGUF ({where})", name)
            continue
        if target in claimed:
            classification[name] = "missing"
            block("tensor.missing", f"{name!r} and {claimed[target]!r} both map to {target!r}", name)
            continue
        claimed[target] = name
        info = by_name[target]
        if info.numpy_shape != tensor.shape:
            classification[name] = "shape mismatch"
            block(
                "tensor.shape_mismatch",
                f"{target} has shape {list(info.numpy_shape)}, source {name} has {list(tensor.shape)}",
                target,
            )
            continue
        transform = arch.transform(target, info.n_elements // info.shape[0])
        classification[name] = _classify(info.ggml_type.name, tensor.dtype, transform)
        pairs.append(Pairing(target, name, transform))
    for info in layout.tensors:
        if info.name not in claimed:
            block("tensor.unexpected", f"GGUF tensor {info.name!r} has no source tensor", info.name)
    return Inventory(tuple(pairs), classification, tuple(blockers))
