"""Per-architecture facts for gate 1, one module per family; importing a module registers it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine.gates.architectures import bert, gemma, llama, modern_bert, phi, qwen
from engine.gates.architectures.base import Architecture, RowTransform, head_permutation
from engine.gates.architectures.derived import Derivation, DerivedTensor, TensorSource

FAMILIES = (bert, gemma, llama, modern_bert, phi, qwen)


def architecture_for(arch: str, config: Mapping[str, Any]) -> Architecture | None:
    cls = Architecture.registry.get(arch)
    return cls(config) if cls else None


def supported() -> tuple[str, ...]:
    """GGUF architecture names gate 1 maps, for messages that must say what is covered."""
    return tuple(sorted(Architecture.registry))


__all__ = [
    "FAMILIES",
    "Architecture",
    "Derivation",
    "DerivedTensor",
    "RowTransform",
    "TensorSource",
    "architecture_for",
    "head_permutation",
    "supported",
]
