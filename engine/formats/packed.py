"""Decoder for convgate's packed low-bit safetensors source format (documented in the README).

A packed tensor `W` is stored as `W.qweight` (U8, a little-endian bit stream of unsigned
`bits`-bit codes), `W.scales` (F32/F16/BF16, one per group) and optionally `W.zeros` (one
zero point per group, same dtype as scales; default 2**(bits-1)). The header's
`__metadata__["convgate.packed"]` is a JSON object giving, per packed tensor, `bits`,
`group_size` and the logical `shape`. The metadata is the source of truth: if
`n_groups * group_size * bits != packed_bytes * 8` the tensor is refused, never guessed.
Values are `scale * (code - zero)`, computed in float32.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from engine.errors import SourceError
from engine.formats.safetensors_strict import FLOAT_DTYPES, SafetensorsFile, to_float32

PACKED_METADATA_KEY = "convgate.packed"
PACKED_PARTS = ("qweight", "scales", "zeros")


@dataclass(frozen=True, slots=True)
class PackedSpec:
    name: str
    bits: int
    group_size: int
    shape: tuple[int, ...]


def packed_specs(file: SafetensorsFile) -> dict[str, PackedSpec]:
    """Read and check the packed-tensor declarations of one safetensors file."""
    raw = file.metadata.get(PACKED_METADATA_KEY)
    if raw is None:
        return {}
    try:
        declared = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SourceError("source.packed_mismatch", f"{file.path.name}: {PACKED_METADATA_KEY} is not JSON") from exc
    if not isinstance(declared, dict):
        raise SourceError("source.packed_mismatch", f"{file.path.name}: {PACKED_METADATA_KEY} is not an object")
    specs = {}
    for name, spec in declared.items():
        try:
            bits, group_size, shape = int(spec["bits"]), int(spec["group_size"]), tuple(int(d) for d in spec["shape"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError("source.packed_mismatch", f"{name}: packed metadata is incomplete", name) from exc
        if not 1 <= bits <= 8 or group_size <= 0 or any(d <= 0 for d in shape):
            raise SourceError("source.packed_mismatch", f"{name}: bits={bits} group_size={group_size}", name)
        specs[name] = PackedSpec(name, bits, group_size, shape)
        _check_consistency(file, specs[name])
    return specs


def _check_consistency(file: SafetensorsFile, spec: PackedSpec) -> None:
    def mismatch(why: str) -> SourceError:
        return SourceError("source.packed_mismatch", f"{spec.name}: {why}", spec.name)

    qweight = file.entries.get(f"{spec.name}.qweight")
    scales = file.entries.get(f"{spec.name}.scales")
    if qweight is None or scales is None or qweight.dtype != "U8" or scales.dtype not in FLOAT_DTYPES:
        raise mismatch("needs a U8 .qweight and a float .scales tensor")
    zeros = file.entries.get(f"{spec.name}.zeros")
    n_groups = 1
    for dim in scales.shape:
        n_groups *= dim
    if zeros is not None and zeros.shape != scales.shape:
        raise mismatch("zeros and scales have different shapes")
    if n_groups * spec.group_size * spec.bits != qweight.nbytes * 8:
        raise mismatch(
            f"{n_groups} groups x {spec.group_size} x {spec.bits} bits != {qweight.nbytes} packed bytes x 8"
        )
    count = 1
    for dim in spec.shape:
        count *= dim
    if count != n_groups * spec.group_size:
        raise mismatch(f"shape {list(spec.shape)} holds {count} values, groups hold {n_groups * spec.group_size}")


def decode(file: SafetensorsFile, spec: PackedSpec) -> np.ndarray:
    """Unpack codes and apply per-group scale and zero point; returns float32 in `spec.shape`."""
    packed = np.asarray(file.array(f"{spec.name}.qweight")).reshape(-1)
    bits = np.unpackbits(packed, bitorder="little").reshape(-1, spec.bits)
    weights = (1 << np.arange(spec.bits, dtype=np.uint16)).astype(np.uint16)
    codes = (bits.astype(np.uint16) @ weights).astype(np.float32).reshape(-1, spec.group_size)
    scales_entry = file.entries[f"{spec.name}.scales"]
    scales = to_float32(file.array(scales_entry.name), scales_entry.dtype).reshape(-1, 1)
    zeros: np.ndarray | np.float32 = np.float32(1 << (spec.bits - 1))
    if f"{spec.name}.zeros" in file.entries:
        zeros_entry = file.entries[f"{spec.name}.zeros"]
        zeros = to_float32(file.array(zeros_entry.name), zeros_entry.dtype).reshape(-1, 1)
    return (scales * (codes - zeros)).astype(np.float32).reshape(spec.shape)


def encode(values: np.ndarray, bits: int, group_size: int) -> dict[str, np.ndarray]:
    """Symmetric packing used to build test sources; returns the `.qweight` and `.scales` parts."""
    groups = np.asarray(values, dtype=np.float32).reshape(-1, group_size)
    half = 1 << (bits - 1)
    amax = np.abs(groups).max(axis=1, keepdims=True)
    scales = np.where(amax > 0, amax / max(half - 1, 1), 1).astype(np.float32)
    codes = np.clip(np.rint(groups / scales) + half, 0, (1 << bits) - 1).astype(np.uint8).reshape(-1)
    bit_planes = ((codes[:, None] >> np.arange(bits, dtype=np.uint8)) & 1).astype(np.uint8).reshape(-1)
    return {"qweight": np.packbits(bit_planes, bitorder="little"), "scales": scales.reshape(-1)}
