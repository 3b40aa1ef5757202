"""Which precision class an artifact belongs to, for the gate-2 thresholds that fit it.

A GGUF mixes types (Q4_K_M holds Q4_K and Q6_K matrices beside F32 norms). The class is that of
its *least precise* matrix, so a file is never held to a stricter bound than its coarsest tensor
allows; one-dimensional tensors (norms, biases) are left out because converters keep them F32
whatever the file type, and they would otherwise pull every file into the float class.
"""

from __future__ import annotations

from typing import Literal

from engine.formats.gguf_structure import GGUFLayout

PrecisionClass = Literal["float", "8bit", "6bit", "5bit", "4bit", "lower"]

# Ordered from most to least precise.
PRECISION_CLASSES: tuple[PrecisionClass, ...] = ("float", "8bit", "6bit", "5bit", "4bit", "lower")

TYPE_CLASS: dict[str, PrecisionClass] = {
    "F64": "float", "F32": "float", "F16": "float", "BF16": "float",
    "I8": "float", "I16": "float", "I32": "float", "I64": "float",
    "Q8_0": "8bit", "Q8_1": "8bit", "Q8_K": "8bit",
    "Q6_K": "6bit",
    "Q5_0": "5bit", "Q5_1": "5bit", "Q5_K": "5bit",
    "Q4_0": "4bit", "Q4_1": "4bit", "Q4_K": "4bit", "IQ4_NL": "4bit", "IQ4_XS": "4bit", "MXFP4": "4bit",
    "NVFP4": "4bit",
    "Q3_K": "lower", "Q2_K": "lower", "IQ3_XXS": "lower", "IQ3_S": "lower", "IQ2_XXS": "lower",
    "IQ2_XS": "lower", "IQ2_S": "lower", "IQ1_S": "lower", "IQ1_M": "lower", "TQ1_0": "lower",
    "TQ2_0": "lower", "Q1_0": "lower",
}


def precision_class(layout: GGUFLayout) -> PrecisionClass:
    """The least precise class among the artifact's matrices (unknown types count as `lower`)."""
    worst = 0
    for info in layout.tensors:
        if len([d for d in info.shape if d > 1]) < 2:
            continue
        worst = max(worst, PRECISION_CLASSES.index(TYPE_CLASS.get(info.ggml_type.name, "lower")))
    return PRECISION_CLASSES[worst]


def type_mix(layout: GGUFLayout) -> dict[str, int]:
    """Elements per ggml type, for the report (what the class was derived from)."""
    mix: dict[str, int] = {}
    for info in layout.tensors:
        mix[info.ggml_type.name] = mix.get(info.ggml_type.name, 0) + info.n_elements
    return dict(sorted(mix.items(), key=lambda item: -item[1]))
