"""Gate 1 inventory: every source tensor classified, every GGUF tensor accounted for."""

from __future__ import annotations

from dataclasses import dataclass

from engine.blockers import Blocker
from engine.formats.gguf_structure import GGUFLayout
from engine.formats.source import SourceModel
from engine.gates.architectures import Architecture, Derivation, RowTransform, TensorSource


@dataclass(frozen=True, slots=True)
class Pairing:
    """A GGUF tensor and what its stored values must equal: a source tensor (reordered by
    `transform`) or a tensor derived from several."""

    gguf_name: str
    source: TensorSource
    transform: RowTransform | None


@dataclass(frozen=True)
class Inventory:
    pairs: tuple[Pairing, ...]
    classification: dict[str, str]
    blockers: tuple[Blocker, ...]


def _without_outer_ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    while len(shape) > 1 and shape[0] == 1:
        shape = shape[1:]
    return shape


def _classify(gguf_type: str, source_dtype: str, transform: RowTransform | None) -> str:
    if transform is not None:
        return f"transformed ({transform.name})"
    if gguf_type == source_dtype:
        return "renamed (copied)"
    return "renamed (quantized)" if gguf_type not in ("F32", "F16", "BF16", "F64") else "renamed (cast)"


class _Taking:
    """The running state of one inventory: what is paired, claimed and blocked so far."""

    def __init__(self, layout: GGUFLayout) -> None:
        self.by_name = {info.name: info for info in layout.tensors}
        self.pairs: list[Pairing] = []
        self.classification: dict[str, str] = {}
        self.blockers: list[Blocker] = []
        self.claimed: dict[str, str] = {}

    def block(self, code: str, why: str, tensor: str) -> None:
        self.blockers.append(Blocker(code=code, gate="storage", why=why, tensor=tensor))

    def shape_agrees(self, target: str, shape: tuple[int, ...], source_label: str) -> bool:
        info = self.by_name[target]
        if _without_outer_ones(info.numpy_shape) == _without_outer_ones(shape):
            return True  # ggml counts dimensions without trailing 1s: llama-quantize stores [1, n] as [n]
        self.block("tensor.shape_mismatch",
                   f"{target} has shape {list(info.numpy_shape)}, source {source_label} has {list(shape)}", target)
        return False

    def derive(self, derivation: Derivation, source: SourceModel) -> None:
        target = derivation.gguf_name
        absent = [n for n in derivation.source_names if n not in source.tensors or not source.tensors[n].is_float]
        if absent or target not in self.by_name or target in self.claimed:
            for name in derivation.source_names:
                self.classification.setdefault(name, "missing")
            where = f"source tensors {absent} are absent" if absent else (
                f"{target!r} is not in the GGUF" if target not in self.by_name else f"{target!r} is claimed twice")
            self.block("tensor.missing", f"{target} ({derivation.description}): {where}", target)
            return
        self.claimed[target] = derivation.source_names[0]
        try:
            tensor = derivation.build([source.tensors[n] for n in derivation.source_names])
        except ValueError as exc:
            self.block("tensor.shape_mismatch", f"{target} ({derivation.description}): {exc}", target)
            return
        for name in derivation.source_names:
            self.classification[name] = f"transformed ({derivation.description}) into {target}"
        if self.shape_agrees(target, tensor.shape, tensor.name):
            self.pairs.append(Pairing(target, tensor, None))


def take_inventory(arch: Architecture, layout: GGUFLayout, source: SourceModel) -> Inventory:
    taking = _Taking(layout)
    derived_sources: set[str] = set()
    for derivation in arch.derivations(source.tensors.keys()):
        taking.derive(derivation, source)
        derived_sources.update(derivation.source_names)
    for name, tensor in sorted(source.tensors.items()):
        if name in derived_sources:
            continue
        reason = arch.omission_reason(name)
        if reason is not None:
            taking.classification[name] = f"omitted: {reason}"
            continue
        target = arch.gguf_name(name) if tensor.is_float else None
        if target is None or target not in taking.by_name:
            taking.classification[name] = "missing"
            where = f"expected as {target!r}" if target else "no GGUF name maps to it"
            taking.block("tensor.missing", f"source tensor {name!r} is not in the GGUF ({where})", name)
            continue
        if target in taking.claimed:
            taking.classification[name] = "missing"
            taking.block("tensor.missing", f"{name!r} and {taking.claimed[target]!r} both map to {target!r}", name)
            continue
        taking.claimed[target] = name
        if not taking.shape_agrees(target, tensor.shape, name):
            taking.classification[name] = "shape mismatch"
            continue
        info = taking.by_name[target]
        transform = arch.transform(target, info.n_elements // info.shape[0])
        taking.classification[name] = _classify(info.ggml_type.name, tensor.dtype, transform)
        taking.pairs.append(Pairing(target, tensor, transform))
    for target, computed in arch.computed().items():
        if target not in taking.by_name:
            taking.block("tensor.missing", f"{target} ({computed.name}) is not in the GGUF: llama.cpp would run "
                         "without it", target)
            continue
        taking.claimed[target] = computed.name
        if taking.shape_agrees(target, computed.shape, computed.name):
            taking.pairs.append(Pairing(target, computed, None))
    for info in layout.tensors:
        if info.name not in taking.claimed:
            taking.block("tensor.unexpected", f"GGUF tensor {info.name!r} has no source tensor", info.name)
    return Inventory(tuple(taking.pairs), taking.classification, tuple(taking.blockers))
