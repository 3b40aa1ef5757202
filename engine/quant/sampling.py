"""Sampled reproduction of K-quant super-blocks: which ones, and what a sample can promise.

libggml's K-quant quantizers are gate 1's bound (~9 M weights/s per core for Q4_K_M), and each
super-block of 256 values is quantized from its own values (and its own slice of the importance
matrix) alone, so any subset of super-blocks can be re-quantized by itself and must give the very
bytes the full tensor gives. A policy may ask for a share `f` of them: the sample is drawn per tensor
from a generator seeded by the artifact's sha256 and the tensor's name, so anyone can redraw it, and
the publisher cannot know in advance which blocks will be read (the digest is fixed only once the file
is). A single corrupted super-block is then reproduced, and caught, with probability `f`; `k`
corrupted ones independently placed with probability 1 - (1 - f)^k.
"""

from __future__ import annotations

import zlib

import numpy as np

SAMPLED_TYPES = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"})


def sampled(type_name: str, fraction: float) -> bool:
    """Whether tensors of this type are reproduced on a sample under a policy asking for `fraction`."""
    return fraction < 1.0 and type_name in SAMPLED_TYPES


def block_sample(seed: str, tensor: str, n_blocks: int, fraction: float) -> np.ndarray:
    """[block] bools, True for the super-blocks of `tensor` to re-quantize (at least one per tensor)."""
    rng = np.random.default_rng([int(seed[:32] or "0", 16), zlib.crc32(tensor.encode())])
    chosen = rng.random(n_blocks, dtype=np.float32) < np.float32(fraction)
    if n_blocks and not chosen.any():
        chosen[int(rng.integers(n_blocks))] = True
    return chosen


def detection_probability(fraction: float, corrupted_blocks: int) -> float:
    """Chance that at least one of `corrupted_blocks` corrupted super-blocks is in the sample."""
    return 1.0 - (1.0 - fraction) ** corrupted_blocks


def sampling_details(fraction: float, seed: str, reproduced: int, total: int) -> dict[str, object]:
    """What the report states about a sampled gate 1, for auditors and the summary."""
    return {
        "fraction": fraction, "seed": seed, "types": sorted(SAMPLED_TYPES),
        "super_blocks_reproduced": reproduced, "super_blocks_total": total,
        "detection_probability": {str(k): round(detection_probability(fraction, k), 6) for k in (1, 10, 100)},
    }
