"""One row of a batch run with every matrix product's input rounded as llama.cpp's compute class rounds it.

Why: gate 2 holds llama.cpp to transformers on the file's own weights, and what an honest file differs by is
llama.cpp's arithmetic: ggml converts the activations a weight matrix multiplies to the weights' dot-product
type (float16 for F16, bfloat16 for BF16; `engine/quant/compute.py`). How far that rounding moves the logits
depends on the model as much as on the type: a trained 135M model moves them little, a 32-layer random model
(every position a near-tie, activations amplified layer after layer) moves them by more than the float16
threshold measured on the trained one allows. Rounding the inputs of every `nn.Linear` of one copy of a text,
beside an unrounded copy in the same batch, measures that model's own sensitivity to its class's rounding
(`engine/gates/runtime/compute_noise.py` turns it into a bound).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def rounded_linear_inputs(module: Any, dtype: Any, row: int) -> Iterator[None]:
    """While inside: every `torch.nn.Linear` under `module` rounds batch row `row` of its input to `dtype`
    (and back to the input's own type) before it runs; the other rows are left exact."""
    import torch

    def round_row(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        rounded = args[0].clone()
        rounded[row] = rounded[row].to(dtype).to(rounded.dtype)
        return (rounded, *args[1:])

    handles = [child.register_forward_pre_hook(round_row) for child in module.modules()
               if isinstance(child, torch.nn.Linear)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
