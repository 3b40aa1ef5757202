"""Which arithmetic llama.cpp's CPU backend runs a GGUF's matrices with: gate 2's correctness class.

Why: once gate 2 compares llama.cpp with transformers running the artifact's *own* weights, what is left
is llama.cpp's compute path, and that is set by how it rounds the activations a weight matrix is
multiplied with. ggml-cpu converts them to the weight type's `vec_dot_type` (ggml-cpu.c,
`type_traits_cpu`): float32 for F32 weights, float16 for F16, bfloat16 for BF16, 8-bit blocks of 32
(Q8_0, or Q8_1 with its sum) for the legacy block types, IQ4_NL and MXFP4, and 8-bit blocks of 256 (Q8_K)
for the K-quants, the IQ grids and the ternary types. A file is held to the noise of the coarsest path
among its matrices; one-dimensional tensors (norms, biases) are added in float32 and set no class.
"""

from __future__ import annotations

from typing import Literal

from engine.formats.gguf_structure import GGUFLayout

ComputeClass = Literal["f32", "f16", "bf16", "q8_0", "q8_k"]

# From the finest to the coarsest activation rounding; an unknown type counts as the coarsest.
COMPUTE_CLASSES: tuple[ComputeClass, ...] = ("f32", "f16", "bf16", "q8_0", "q8_k")

VEC_DOT_CLASS: dict[str, ComputeClass] = {
    "F32": "f32", "F64": "f32",
    "F16": "f16",
    "BF16": "bf16",
    "Q4_0": "q8_0", "Q4_1": "q8_0", "Q5_0": "q8_0", "Q5_1": "q8_0", "Q8_0": "q8_0", "Q8_1": "q8_0",
    "IQ4_NL": "q8_0", "MXFP4": "q8_0", "NVFP4": "q8_0", "Q1_0": "q8_0",
    "Q2_K": "q8_k", "Q3_K": "q8_k", "Q4_K": "q8_k", "Q5_K": "q8_k", "Q6_K": "q8_k", "Q8_K": "q8_k",
    "IQ1_S": "q8_k", "IQ1_M": "q8_k", "IQ2_XXS": "q8_k", "IQ2_XS": "q8_k", "IQ2_S": "q8_k",
    "IQ3_XXS": "q8_k", "IQ3_S": "q8_k", "IQ4_XS": "q8_k", "TQ1_0": "q8_k", "TQ2_0": "q8_k",
}


def compute_classes(layout: GGUFLayout) -> tuple[ComputeClass, ...]:
    """Every class the file's matrices run in, finest first (a mixed file may run in several)."""
    found = {VEC_DOT_CLASS.get(info.ggml_type.name, "q8_k") for info in layout.tensors
             if len([d for d in info.shape if d > 1]) >= 2}
    return tuple(name for name in COMPUTE_CLASSES if name in found) or ("f32",)
