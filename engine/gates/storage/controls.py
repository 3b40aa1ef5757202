"""Gate 1's negative controls: one stored weight moved by one ulp, judged by gate 1's own per-tensor check.

One control per GGUF type with an exact check (bit patterns, or gguf-py's / libggml's re-quantization),
in the smallest tensor of that type whose planted row passes honestly: chosen from the inventory alone, so
a run split over pods plants the same defects as one pod. The artifact is mapped copy-on-write, so the planted
bit lives in one private page of this process and never reaches the file. `check_tensor`, the function
gate 1 runs on every tensor, then compares the planted row with its source row, exactly as the gate
compared the whole tensor: one row, because a reproduction that fails falls back to the per-type bound,
which for K-quants costs seconds per million weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.controls.planted import Planted, not_applicable
from engine.errors import ReferenceMissingError, UnsupportedTypeError
from engine.formats.artifact_files import ArtifactBytes, artifact_bytes
from engine.formats.gguf_structure import GGUFLayout, TensorInfo
from engine.formats.source import SourceModel
from engine.gates.architectures import RowTransform, architecture_for
from engine.gates.computed_tensors import ComputedTensor
from engine.gates.inventory import Pairing, take_inventory
from engine.gates.storage import tensor_values
from engine.policy import Policy
from engine.quant.imatrix import ImatrixError, ImportanceMatrix
from engine.quant.sampling import block_sample, sampled

CHECK = "tensor values"
# Where each type's fp16 block scale `d` starts (ggml-common.h's block layouts). The control flips the lowest
# bit of its high byte, moving the scale by 256 ulps (12-25%): one ulp is no defect to reproduction, whose
# tie tolerance (policy `tie_ulps`) accepts a scale one ulp off. Other quantized types get the lowest bit of
# the block's second byte (a quant or sub-scale; for the IQ types, the high byte of `d` too).
SCALE_OFFSET = {"Q4_0": 0, "Q4_1": 0, "Q5_0": 0, "Q5_1": 0, "Q8_0": 0, "Q4_K": 0, "Q5_K": 0, "IQ4_NL": 0,
                "IQ4_XS": 0, "Q2_K": 80, "Q3_K": 108, "Q6_K": 208}


def one_row(info: TensorInfo, row: int) -> TensorInfo:
    """GGUF row `row` of `info` as a tensor of its own (one row of the first dimension's length)."""
    row_bytes = info.ggml_type.row_bytes(info.shape[0])
    return TensorInfo(name=info.name, shape=(info.shape[0], 1), ggml_type=info.ggml_type,
                      offset=info.offset + row * row_bytes, nbytes=row_bytes)


def plant_site(row: TensorInfo, policy: Policy, seed: str | None) -> tuple[int, str, str]:
    """(absolute byte whose lowest bit is flipped, the defect in words, where) in the one-row tensor `row`.

    Floats: the middle element's lowest mantissa bit (one ulp). Quantized: a block the check compares (the
    first sampled one when reproduction samples, else the middle one), its scale moved by 256 ulps."""
    ggml_type = row.ggml_type
    if not ggml_type.quantized:
        element = row.n_elements // 2
        return (row.offset + element * ggml_type.type_size, f"one {ggml_type.name} weight moved by one ulp",
                f"element {element}")
    n_blocks = row.n_elements // ggml_type.block_size
    block = n_blocks // 2
    if seed is not None and sampled(ggml_type.name, policy.reproduce_sample):
        block = int(np.flatnonzero(block_sample(seed, row.name, n_blocks, policy.reproduce_sample))[0])
    if ggml_type.name in SCALE_OFFSET:
        within, defect = SCALE_OFFSET[ggml_type.name] + 1, f"one {ggml_type.name} block's scale moved by 256 ulps"
    else:
        within, defect = 1, f"one bit of one {ggml_type.name} block flipped"
    return row.offset + block * ggml_type.type_size + within, defect, f"block {block} byte {within}"


CANDIDATES = 3  # tensors tried per type, smallest first, for a middle row that passes honestly


def candidates_by_type(layout: GGUFLayout, names: dict[int, str]) -> dict[str, list[int]]:
    """Per GGUF type (in name order), its tensors' inventory indexes, smallest first (ties by name): the same
    choice in every shard and on one pod, since it depends on the inventory alone, not on a part."""
    by_type: dict[str, list[tuple[int, str, int]]] = {}
    for index, name in names.items():
        info = layout.tensor(name)
        by_type.setdefault(info.ggml_type.name, []).append((info.nbytes, name, index))
    return {type_name: [index for _, _, index in sorted(by_type[type_name])[:CANDIDATES]]
            for type_name in sorted(by_type)}


def _row_weights(imatrix: ImportanceMatrix | None, info: TensorInfo, row: int) -> np.ndarray | None:
    """The importance-matrix weights gate 1 quantized GGUF row `row` with (its matrix's, for a stack)."""
    if imatrix is None or not info.ggml_type.quantized:
        return None
    weights = imatrix.weights_for(info.name, info.shape)
    if weights is None or weights.ndim == 1:
        return weights
    return np.asarray(weights[row // info.shape[1]])


def _plant_one(copy: ArtifactBytes, info: TensorInfo, pair: Pairing, policy: Policy, imatrix: ImportanceMatrix | None,
               seed: str | None) -> Planted | None:
    """The control in `info`'s middle row, or None when that row does not pass honestly (or cannot be checked)."""
    n_rows = info.n_elements // info.shape[0]
    row_index = n_rows // 2
    row = one_row(info, row_index)
    source_row = pair.transform.order[row_index] if pair.transform else row_index
    transform = RowTransform(name=pair.transform.name if pair.transform else "row", order=np.array([source_row]))
    try:
        weights = _row_weights(imatrix, info, row_index)
        if tensor_values.check_kind(row, policy, weights is not None) == "bounded":
            return None  # a bound alone need not notice one ulp: only exact checks are controlled
        _, honest = tensor_values.check_tensor(copy, row, pair.source, transform, policy, quant_weights=weights,
                                               sample_seed=seed)
        if honest:
            return None
        byte, defect, where = plant_site(row, policy, seed)
        copy[byte] ^= 1
        try:
            _, blockers = tensor_values.check_tensor(copy, row, pair.source, transform, policy,
                                                     quant_weights=weights, sample_seed=seed)
        finally:
            copy[byte] ^= 1  # one defect at a time
    except (ImatrixError, UnsupportedTypeError, ReferenceMissingError):
        return None
    return Planted(check=CHECK, defect=defect, location=f"{info.name} row {row_index} {where}",
                   detected_by=tuple(sorted({blocker.code for blocker in blockers})))


def storage_controls(artifact: Path, layout: GGUFLayout, source: SourceModel, policy: Policy,
                     imatrix: ImportanceMatrix | None, seed: str | None) -> list[Planted]:
    """One control per GGUF type with an exact check, in the first of its smallest tensors whose middle row
    passes (`seed`: the artifact's sha256, which draws a sampled reproduction's blocks)."""
    arch = architecture_for(str(layout.metadata.get("general.architecture", "")), source.config)
    pairs = take_inventory(arch, layout, source).pairs if arch is not None else ()
    copy = artifact_bytes(artifact, mode="c")  # copy-on-write: the file is never written
    found = []
    copied = {i: pair.gguf_name for i, pair in enumerate(pairs) if not isinstance(pair.source, ComputedTensor)}
    for type_name, indexes in candidates_by_type(layout, copied).items():
        planted = (_plant_one(copy, layout.tensor(pairs[i].gguf_name), pairs[i], policy, imatrix, seed)
                   for i in indexes)
        found.append(next((p for p in planted if p is not None), None) or not_applicable(
            CHECK, f"no {type_name} tensor has an exact check and a middle row that passes"))
    return found or [not_applicable(CHECK, "gate 1 paired no tensor: nothing to plant a defect in")]
