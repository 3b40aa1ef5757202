"""The artifact's own weights under the source's names: gate 2's correctness reference reads these.

Why: held against the source's weights, llama.cpp's output differs by two things at once, the
quantization a file was made with and llama.cpp's own arithmetic. The first is the price of a
quantized release (a trained causal LM at Q4_K_M moves its next-token distribution by a KL of ~0.1),
the second is what a verifier must hold to a tight bound. Giving transformers the artifact's stored
values, dequantized and with every converter transform undone, leaves llama.cpp's compute path as the
only difference; the gap to the source is measured apart (`engine/gates/runtime/quality.py`).

Each source checkpoint key is read from the GGUF tensor gate 1's inventory pairs it with: the stored
bytes dequantized by gguf-py (the reader gate 1 cross-checks against libggml), then a row reorder undone
(llama's Q/K head permutation), a stack split back into its parts (mixture-of-experts), a row slice put
back (XLM-RoBERTa's position embeddings) or a value change reversed (Gemma's 1 + w). A key the GGUF
leaves out with a stated reason (a tied head, an unused pooler) is read from the source.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.formats.artifact_files import ArtifactBytes, artifact_bytes, file_range
from engine.formats.gguf_structure import GGUFLayout, TensorInfo
from engine.gates.architectures import RowTransform
from engine.gates.architectures.derived import DerivedTensor
from engine.gates.computed_tensors import ComputedTensor
from engine.gates.inventory import Pairing
from engine.quant import reference
from engine.runtime.checkpoints import SafetensorsCheckpoint
from engine.runtime.read_ahead import READ_AHEAD

WIDENED = {"F16": "float16", "BF16": "bfloat16"}  # GGUF types decoded by widening (`_widened`): torch's dtype


def stored_values(file_bytes: ArtifactBytes, info: TensorInfo) -> np.ndarray:
    """One tensor's stored values as float32, in row-major (numpy) shape."""
    raw = np.asarray(file_bytes[info.offset:info.offset + info.nbytes])
    return _decoded(raw, info).reshape(info.numpy_shape)


def stored_rows(file_bytes: ArtifactBytes, info: TensorInfo, rows: Sequence[int]) -> np.ndarray:
    """Rows `rows` of a 2-D tensor's stored values as float32: each row is whole blocks, decoded alone."""
    n_rows = info.n_elements // info.shape[0]
    raw = np.asarray(file_bytes[info.offset:info.offset + info.nbytes]).reshape(n_rows, -1)[np.asarray(rows)]
    return _decoded(raw, info).reshape(len(rows), info.shape[0])


def _decoded(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    """Stored bytes (whole rows) as float32 values, flat."""
    name = info.ggml_type.name
    if name == "F32":
        values = raw.view("<f4").astype(np.float32)
    elif name in WIDENED:
        values = _widened(raw, name)
    else:
        values = reference.dequantize(raw.reshape(-1, info.ggml_type.row_bytes(info.shape[0])), info.ggml_type)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(-1)


def _widened(raw: np.ndarray, name: str) -> np.ndarray:
    """F16 or BF16 bytes as float32 by torch's conversion: the same values as numpy's (every finite and
    infinite one bit for bit; a NaN stays a NaN, with its quiet bit set), in less than half the time (its
    vectorised, threaded loop: 1.5 s against 3.6 s for 2.6 GB of the half-7B's F16 weights, where the
    reference spent 14 s of gate 2's 62 decoding the file). The stored bytes are only read: the tensor
    over them is converted into a new one at once."""
    import torch

    with warnings.catch_warnings():  # torch warns that a tensor over read-only (mapped) bytes could write them
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        stored = torch.frombuffer(np.ascontiguousarray(raw), dtype=getattr(torch, WIDENED[name]))
    return stored.to(torch.float32).numpy()


def _unpermuted(rows: np.ndarray, transform: RowTransform | None) -> np.ndarray:
    """GGUF row i holds source row `order[i]`: put every row back where the source had it."""
    if transform is None:
        return rows
    out = np.empty_like(rows)
    out[transform.order] = rows
    return out


class ArtifactCheckpoint:
    """A `Checkpoint` over the source's keys whose values come from the artifact (see module docstring)."""

    def __init__(self, artifact: Path, layout: GGUFLayout, pairs: Sequence[Pairing],
                 source: SafetensorsCheckpoint) -> None:
        self.file_bytes = artifact_bytes(artifact)
        self.layout = layout
        self.source = source
        self.by_key: dict[str, Pairing] = {}
        for pair in pairs:
            if isinstance(pair.source, ComputedTensor):  # no checkpoint key: transformers computes it from the config
                continue
            names = [p.name for p in pair.source.parts] if isinstance(pair.source, DerivedTensor) else [
                pair.source.name]
            self.by_key.update(dict.fromkeys(names, pair))

    def names(self) -> list[str]:
        return self.source.names()

    def shape(self, key: str) -> tuple[int, ...]:
        return self.source.shape(key)

    def _undone(self, pair: Pairing) -> dict[str, np.ndarray]:
        """Every source tensor one GGUF tensor stands for (several for a stack of experts)."""
        stored = stored_values(self.file_bytes, self.layout.tensor(pair.gguf_name))
        if isinstance(pair.source, DerivedTensor):
            return pair.source.undo(stored)
        shape = pair.source.shape
        rows = stored.reshape(-1, shape[-1] if shape else 1)
        return {pair.source.name: _unpermuted(rows, pair.transform).reshape(shape)}

    def read_rows(self, key: str, rows: Sequence[int]) -> Any:
        """Only those rows dequantized, for a tensor stored as it is in the source (no rows reordered, not one
        of several tensors stacked); anything else is decoded whole and the rows taken from it."""
        import torch

        pair = self.by_key.get(key)
        if pair is None:
            return self.source.read_rows(key, rows)
        if isinstance(pair.source, DerivedTensor) or pair.transform is not None:
            return torch.from_numpy(np.ascontiguousarray(self._undone(pair)[key][np.asarray(rows)]))
        return torch.from_numpy(stored_rows(self.file_bytes, self.layout.tensor(pair.gguf_name), rows))

    def prefetch(self, keys: Sequence[str]) -> None:
        own = [key for key in keys if key not in self.by_key]
        if own:
            self.source.prefetch(own)
        for name in dict.fromkeys(self.by_key[key].gguf_name for key in keys if key in self.by_key):
            info = self.layout.tensor(name)
            if (where := file_range(self.file_bytes, info.offset)) is not None:
                READ_AHEAD.ask(where[0], where[1], info.nbytes)

    def read(self, keys: Sequence[str]) -> dict[str, Any]:
        """The keys' tensors; a GGUF tensor that stands for several keys is dequantized once per read."""
        import torch

        own = [key for key in keys if key not in self.by_key]
        out = self.source.read(own) if own else {}
        undone: dict[str, dict[str, np.ndarray]] = {}
        for key in keys:
            if key in self.by_key:
                pair = self.by_key[key]
                if pair.gguf_name not in undone:
                    undone[pair.gguf_name] = self._undone(pair)
                out[key] = torch.from_numpy(undone[pair.gguf_name][key])
        return out
