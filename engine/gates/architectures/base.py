"""The architecture base class: name normalisation, intentional omissions, transforms and the
metadata that must agree with config.json.

A registry of small classes, one per GGUF architecture (one module per family beside this one),
registered by class keyword. Transforms are written out explicitly, never inferred to make a
comparison pass: a row reorder (`RowTransform`) for a tensor copied one to one, or a `Derivation`
(`derived.py`) for a tensor built from several source tensors, a slice of one or changed values.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gguf
import numpy as np

from engine.gates.architectures.derived import Derivation
from engine.gates.computed_tensors import ComputedTensor
from engine.gates.expectation import Expectation
from engine.gates.hyperparameters import common_hyperparameters


@dataclass(frozen=True, slots=True)
class RowTransform:
    """GGUF row i holds source row `order[i]`; `name` is how the report describes it."""

    name: str
    order: np.ndarray


def head_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row order of llama.cpp's Q/K permutation (interleaved rotary halves -> per-head pairs)."""
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)


class Architecture:
    """Base: subclasses register with `class X(Architecture, arch="name")`."""

    registry: ClassVar[dict[str, type[Architecture]]] = {}
    model_arch: ClassVar[gguf.MODEL_ARCH]
    arch: ClassVar[str]
    omitted_patterns: ClassVar[tuple[tuple[str, str], ...]] = ()
    hf_architectures: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, arch: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if arch in Architecture.registry:
            raise TypeError(f"architecture {arch!r} registered twice")
        cls.arch = arch
        Architecture.registry[arch] = cls

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        n_blocks = int(config.get("num_hidden_layers", 0))
        self.name_map = gguf.get_tensor_name_map(self.model_arch, n_blocks)

    def canonical_source_name(self, name: str) -> str:
        return name

    def omission_reason(self, source_name: str) -> str | None:
        """Why a source tensor is legitimately absent from the GGUF, or None if it must be there."""
        for pattern, reason in self.omitted_patterns:
            if re.fullmatch(pattern, source_name):
                return reason
        return None

    def gguf_name(self, source_name: str) -> str | None:
        return self.name_map.get_name(self.canonical_source_name(source_name), try_suffixes=(".weight", ".bias"))

    def transform(self, gguf_name: str, rows: int) -> RowTransform | None:
        """A row reorder the converter applied to a tensor it otherwise copied one to one."""
        return None

    def derivations(self, source_names: Collection[str]) -> list[Derivation]:
        """GGUF tensors built from several source tensors, a slice of one or changed values.

        Their source tensors are claimed by the derivation and skip the one-to-one name map."""
        return []

    def computed(self) -> dict[str, ComputedTensor]:
        """GGUF tensors the converter computes from config.json (no source tensor): name -> expected values."""
        return {}

    def expectations(self) -> list[Expectation]:
        """Every architecture key llama.cpp reads that config.json determines."""
        out = [Expectation("general.architecture", self.arch, f"config.architectures {self.hf_architectures}")]
        if not set(self.config.get("architectures") or ()) & set(self.hf_architectures):
            out[0] = Expectation("general.architecture", f"one of {self.hf_architectures}",
                                 f"config.architectures {self.config.get('architectures')}")
        return out + common_hyperparameters(self.arch, self.config)
