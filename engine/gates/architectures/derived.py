"""GGUF tensors that are not one source tensor copied: stacked, sliced or offset on the way in.

Converters build some GGUF tensors from several source tensors (a mixture-of-experts layer's
experts stacked into one 3-D tensor), keep only some rows (XLM-RoBERTa's position embeddings
without the padding offset) or change values (Gemma's norm weights stored as `1 + w`). Gate 1
compares the stored tensor with a `DerivedTensor` that states and applies that construction, so
every transform is written out and undone explicitly, never inferred to make a comparison pass.
A `DerivedTensor` reads like a `SourceTensor`: rows of the source values, widened to float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.formats.source import SourceTensor


class Rows(Protocol):
    """Indexable rows: a (memory-mapped) 2-D array or a lazy stack of them."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    def __getitem__(self, selection: slice | np.ndarray) -> np.ndarray: ...


class TensorSource(Protocol):
    """Where gate 1 reads a GGUF tensor's expected values from."""

    @property
    def name(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    def as_rows(self) -> Rows: ...

    def widen(self, chunk: np.ndarray) -> np.ndarray: ...


class StackedRows:
    """The rows of several equally wide 2-D arrays, one after the other, without copying them all."""

    def __init__(self, parts: Sequence[np.ndarray]) -> None:
        self.parts = list(parts)
        self.starts = np.cumsum([0] + [p.shape[0] for p in self.parts])
        self.shape = (int(self.starts[-1]), int(self.parts[0].shape[1]))

    def __getitem__(self, selection: slice | np.ndarray) -> np.ndarray:
        index = np.arange(self.shape[0])[selection]
        part_of = np.searchsorted(self.starts, index, side="right") - 1
        out = np.empty((index.size, self.shape[1]), dtype=self.parts[0].dtype)
        for part in np.unique(part_of):
            mask = part_of == part
            out[mask] = self.parts[part][index[mask] - self.starts[part]]
        return out


@dataclass(frozen=True)
class DerivedTensor:
    """The values a converter writes for one GGUF tensor, built from `parts` as stated.

    `parts` are stacked in order (their rows concatenated); `rows` keeps a slice of a single part's
    rows; `values` maps widened float32 rows to what the converter stores (applied after widening,
    so it must reproduce the converter's arithmetic at the source's precision) and `inverse` maps
    stored values back to what the source model computes with (gate 2's artifact-weights reference)."""

    name: str
    parts: tuple[SourceTensor, ...]
    shape: tuple[int, ...]
    rows: slice | None = None
    values: Callable[[np.ndarray], np.ndarray] | None = None
    inverse: Callable[[np.ndarray], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if len({(p.dtype, p.shape[-1]) for p in self.parts}) != 1:
            raise ValueError(f"{self.name}: stacked parts differ in dtype or row length")
        if self.rows is not None and len(self.parts) != 1:
            raise ValueError(f"{self.name}: a row slice applies to one source tensor")

    @property
    def dtype(self) -> str:
        return self.parts[0].dtype

    def as_rows(self) -> Rows:
        if len(self.parts) == 1:
            rows = self.parts[0].as_rows()
            return rows if self.rows is None else rows[self.rows]
        return StackedRows([p.as_rows() for p in self.parts])

    def widen(self, chunk: np.ndarray) -> np.ndarray:
        values = self.parts[0].widen(chunk)
        return values if self.values is None else np.ascontiguousarray(self.values(values), dtype=np.float32)

    def undo(self, stored: np.ndarray) -> dict[str, np.ndarray]:
        """The source tensors the stored values stand for (float32, source shapes): the stack split back
        into its parts, a row slice put back among the source's other rows (which the file does not hold and
        llama.cpp never reads), a value change reversed."""
        rows = stored.reshape(-1, self.shape[-1] if self.shape else 1)
        if self.values is not None:
            if self.inverse is None:
                raise ValueError(f"{self.name}: the stored values cannot be mapped back to the source's")
            rows = np.ascontiguousarray(self.inverse(rows), dtype=np.float32)
        if self.rows is not None:
            (part,) = self.parts
            whole = np.array(part.widen(np.asarray(part.as_rows()[:])), dtype=np.float32)  # a copy: F32 reads are views
            whole[self.rows] = rows
            return {part.name: whole.reshape(part.shape)}
        out, start = {}, 0
        for part in self.parts:
            count = int(np.prod(part.shape[:-1])) if len(part.shape) > 1 else 1
            out[part.name] = rows[start:start + count].reshape(part.shape)
            start += count
        return out


@dataclass(frozen=True)
class Derivation:
    """One GGUF tensor made from `source_names` by a stated transform (`description`)."""

    gguf_name: str
    source_names: tuple[str, ...]
    description: str
    build: Callable[[Sequence[SourceTensor]], DerivedTensor]


def stacked(gguf_name: str, source_names: Sequence[str], description: str) -> Derivation:
    """Source matrices stacked along a new outer axis (one GGUF tensor of shape [n, rows, cols])."""

    def build(parts: Sequence[SourceTensor]) -> DerivedTensor:
        label = f"{len(parts)} stacked: {parts[0].name} .. {parts[-1].name}"
        return DerivedTensor(label, tuple(parts), (len(parts), *parts[0].shape))

    return Derivation(gguf_name, tuple(source_names), description, build)


def row_slice(gguf_name: str, source_name: str, rows: slice, description: str) -> Derivation:
    """Only some rows of a source matrix are stored (e.g. position embeddings past a padding offset)."""

    def build(parts: Sequence[SourceTensor]) -> DerivedTensor:
        (part,) = parts
        kept = len(range(*rows.indices(part.shape[0])))
        return DerivedTensor(f"{part.name}[{rows.start or 0}:{'' if rows.stop is None else rows.stop}]",
                             (part,), (kept, *part.shape[1:]), rows=rows)

    return Derivation(gguf_name, (source_name,), description, build)


def value_map(gguf_name: str, source_name: str, description: str, values: Callable[[np.ndarray], np.ndarray],
              inverse: Callable[[np.ndarray], np.ndarray]) -> Derivation:
    """A source tensor stored after an elementwise change (e.g. Gemma's norm weights as 1 + w)."""

    def build(parts: Sequence[SourceTensor]) -> DerivedTensor:
        (part,) = parts
        return DerivedTensor(part.name, (part,), part.shape, values=values, inverse=inverse)

    return Derivation(gguf_name, (source_name,), description, build)
